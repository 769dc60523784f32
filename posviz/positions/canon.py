"""NoPE with Canon layers (Allen-Zhu, "Physics of Language Models: Part 4.1, Architecture Design and the Magic of
Canon Layers", 2025, arXiv 2512.17351; SSRN 5240330).

No position signal in attention at all (NoPE). Instead, at four sites of every block, each position's hidden state
takes in its three predecessors' through a causal depthwise convolution of kernel 4, added back to itself:

    h'[t, d] = h[t, d] + sum_{w=0..3} W[d, w] h[t - 3 + w, d]

* A: attention's input (after its LayerNorm), C channels
* B: the projected queries, keys and values side by side, 3C channels
* C: the MLP's input (after its LayerNorm), C channels
* D: the MLP's hidden layer, before its activation, 4C channels

Order enters only through this local mixing (and the causal mask): no layer reads a position index, so a window may
start anywhere, and nothing in a key says where it was written. The paper reports that Canon layers bring NoPE up to
RoPE; here the recipe is the shared one.

Reference path: facebookresearch/PhysicsLM4 (``huggingface/canon_helper.py``, ``create_canon`` and ``apply_canon``,
and ``configuration_llama_canon.py``): ``ShortConvolution`` (an ``nn.Conv1d`` with groups = channels and PyTorch's
default initialisation, which the model's ``_init_weights`` leaves alone), kernel 4, no bias, no activation, the
residual added, at the sites of ``canon_set`` (here all four, "ABCD"). fla's ``modules/canon.py`` computes the same
sum (its class defaults to a SiLU, which PhysicsLM4's ``canon_activation=False`` turns off).
Shapes: h (B, T, D); a site's weight (D, K).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from posviz.config import require
from posviz.positions.base import PositionMethod
from posviz.positions.short_conv import causal_conv

SITES = ("A", "B", "C", "D")


@dataclasses.dataclass
class CanonOptions:
    sites: str = "ABCD"  # PhysicsLM4's canon_set: which of the four sites get a Canon layer
    kernel: int = 4  # canon_kernel: the position itself and its kernel - 1 predecessors
    residual: bool = True  # canon_residual: h + conv(h), not conv(h) alone

    def __post_init__(self):
        require(isinstance(self.sites, str) and self.sites and all(s in SITES for s in self.sites)
                and len(set(self.sites)) == len(self.sites),
                f"Canon's sites must be some of the letters A, B, C, D, each once, got {self.sites!r}")
        require(isinstance(self.kernel, int) and 2 <= self.kernel <= 16, f"Canon's kernel must be an integer in 2..16, got {self.kernel!r}")


def site_width(site: str, n_embd: int) -> int:
    """The channels a site mixes: C for A and C, 3C for B (q, k, v), 4C for D (GPT-2's MLP hidden layer)."""
    return {"A": n_embd, "B": 3 * n_embd, "C": n_embd, "D": 4 * n_embd}[site]


class CanonLayers(PositionMethod):
    name = "canon"
    display_name = "NoPE + Canon"
    summary = ("No position in attention; each position's hidden states take in their 3 predecessors' through a "
               "short causal convolution, at four sites of every block.")
    paper = "https://arxiv.org/abs/2512.17351"
    acts_on = "hidden"
    kind = "none"
    learned = True
    Options = CanonOptions
    explore_sections = ("canon-kernels",)
    # the first layer's keys read 6 bytes before them (site A's kernel-4 convolution, then B's over q/k/v), deeper
    # layers' more: a window re-encoded from its first byte differs a little from the same keys kept in a cache
    reads_before = 6

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        # one depthwise convolution per layer and site, made as the reference makes it (nn.Conv1d's default draw:
        # U(-1/sqrt(K), 1/sqrt(K)) with fan_in = K for groups = channels); only its weight (D, 1, K) is kept
        self.convs = nn.ModuleDict({
            f"{layer}{site}": nn.Conv1d(site_width(site, shape.n_embd), site_width(site, shape.n_embd), self.options.kernel,
                                        groups=site_width(site, shape.n_embd), bias=False)
            for layer in range(shape.n_layer) for site in self.options.sites})

    def kernel(self, layer: int, site: str) -> torch.Tensor | None:
        """(D, K) the weights of ``site`` in ``layer``: column K - 1 weighs the position itself, column K - 1 - s the
        position s back; None where the site has no Canon layer."""
        conv = self.convs[f"{layer}{site}"] if f"{layer}{site}" in self.convs else None
        return None if conv is None else conv.weight[:, 0]

    def mix_hidden(self, layer, site, h, cache=None):
        weight = self.kernel(layer, site)
        if weight is None:
            return h
        mixed = causal_conv(h, weight, cache, (layer, f"canon{site}"))
        return h + mixed if self.options.residual else mixed
