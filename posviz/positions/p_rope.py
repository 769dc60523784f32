"""p-RoPE: rotate only the fastest fraction p of the rotary pairs; the slow rest get frequency 0.

Barbero et al., "Round and Round We Go! What makes Rotary Positional Encodings useful?", ICLR 2025,
https://arxiv.org/abs/2410.06205 (Gemma 4's global layers use p = 0.25).

The paper's finding: the slowest pairs of RoPE barely turn within a context, so models use them as
channels for meaning, not position, and they are the ones that drift into unseen angles past the
training length. p-RoPE makes that split explicit: pair i of a head of size d turns at
theta_i = base^(-2i/d) for i < floor(p d / 2), as RoPE's fastest pairs do, and at 0 (no rotation, no
position) for the rest. p = 1 is RoPE; p = 0 is NoPE. Frequencies as transformers' ``"proportional"``
rope type (``_compute_proportional_rope_parameters``) for the same head size, base and p.
Shapes: q, k (B, H, T, hs); pos (T,); inv_freq (hs/2,).
"""
from __future__ import annotations

import dataclasses

import torch

from posviz.config import require
from posviz.positions.rope import RopeOptions, Rotary


@dataclasses.dataclass
class PRopeOptions(RopeOptions):
    p: float = 0.25  # share of the pairs that rotate, the fastest ones (Gemma 4's global layers: 0.25)

    def __post_init__(self):
        super().__post_init__()
        require(0 <= self.p <= 1, f"p-RoPE's p must be in [0, 1], got {self.p}")
        require(self.rotary_fraction == 1.0, "p-RoPE keeps every pair and stops the slow ones (p); "
                                             "rotary_fraction is RoPE's, leave it at 1")


class PartialRotary(Rotary):
    name = "p_rope"
    display_name = "p-RoPE"
    summary = ("RoPE on the fastest quarter of each head's pairs only (p = 0.25); the slow pairs carry no position, "
               "so nothing turns into angles unseen in training.")
    paper = "https://arxiv.org/abs/2410.06205"
    acts_on = "q/k"
    kind = "relative"
    Options = PRopeOptions
    explore_sections = ("p-rope-pairs",)  # on the RoPE page: which pairs turn, beside RoPE's

    @property
    def rotating_pairs(self) -> int:
        """How many pairs turn: floor(p d / 2), as transformers counts them."""
        return int(self.options.p * self.rot_dim // 2)

    def frequencies(self, seq_len: int) -> tuple[torch.Tensor, float]:
        inv_freq, attention = super().frequencies(seq_len)  # RoPE's, for every pair of the head
        stopped = torch.arange(inv_freq.numel()) >= self.rotating_pairs
        return inv_freq.masked_fill(stopped, 0.0), attention
