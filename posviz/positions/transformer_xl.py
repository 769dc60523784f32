"""Transformer-XL's relative positions (Dai et al. 2019), https://arxiv.org/abs/1901.02860 (§3.3)

The logit of query i for key j is split into four terms (all divided by sqrt(hs) as usual):

    (a) q_i . k_j            content-content: what the query looks for
    (b) q_i . W_R R_(i-j)    content-position: where this query looks
    (c) u . k_j              global content bias: which keys matter to every query
    (d) v . W_R R_(i-j)      global position bias: where every query looks

R is the fixed sinusoidal table of relative distances (unclipped, so any length works), W_R a learned
projection per layer, and u, v learned per head and shared across layers, as in the paper.
It plugs into the three hooks without attention knowing: (a) + (c) = (q_i + u) . k_j, so u rides on
the query in ``rotate_qk``; (b) + (d) = (q_i + v) . W_R R_(i-j) is a relative-key bias computed by
Shaw's code (``RelativeKeys``) with the keys W_R R_d and the query q_i + v. ``four_terms`` spells
the terms out for the app. Nothing is added to the input.
Shapes: q, k (B, H, T, hs); R (D+1, C); W_R R (H, D+1, hs); u, v (H, hs); bias (B, H, Tq, Tk).
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from posviz.config import require
from posviz.positions.base import distance_range
from posviz.positions.shaw import RelativeKeys, relative_key_bias
from posviz.positions.sinusoidal import _table_for


@dataclasses.dataclass
class TransformerXLOptions:
    base: float = 10000.0  # wavelengths of R, as the sinusoidal absolute encoding

    def __post_init__(self):
        require(isinstance(self.base, (int, float)) and self.base > 1, f"transformer_xl base must be > 1, got {self.base!r}")


class TransformerXL(RelativeKeys):
    name = "transformer_xl"
    display_name = "Transformer-XL"
    summary = "Sinusoidal relative distances projected per layer, plus global content and position biases."
    paper = "https://arxiv.org/abs/1901.02860"
    learned = True
    Options = TransformerXLOptions
    explore_sections = ("transformer-xl-terms",)
    clipped = False  # every distance has its own key: no band

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        require(shape.n_embd % 2 == 0, f"transformer_xl needs an even model width, got {shape.n_embd}")
        H, hs = shape.n_head, shape.head_dim
        # W_R per layer, no bias (the paper's W_{k,R}), N(0, 0.02) like the model's other projections
        self.proj = nn.ModuleList(nn.Linear(shape.n_embd, H * hs, bias=False) for _ in range(shape.n_layer))
        for proj in self.proj:
            nn.init.normal_(proj.weight, mean=0.0, std=0.02)
        self.u = nn.Parameter(torch.zeros(H, hs))  # global content bias: starts neutral
        self.v = nn.Parameter(torch.zeros(H, hs))  # global position bias

    def rotate_qk(self, q, k, pos):
        return q + self.u[None, :, None, :].to(q.dtype), k  # (q_i + u) . k_j = terms (a) + (c)

    def query_for_keys(self, q):
        return q - (self.u - self.v)[None, :, None, :].to(q.dtype)  # the hook sees q + u; (b) + (d) need q + v

    def relative_keys(self, layer, q_pos, k_pos):
        D = max(0, distance_range(q_pos, k_pos)[1])  # farthest distance in this block
        R = _table_for(torch.arange(D + 1, device=self.u.device), self.shape.n_embd, self.options.base, self.u.device)  # (D+1, C)
        H, hs = self.shape.n_head, self.shape.head_dim
        return self.proj[layer](R.to(self.u.dtype)).view(D + 1, H, hs).transpose(0, 1)  # (H, D+1, hs)

    def relative_key_range(self, layer, q, lo, hi):
        def compute():
            R = _table_for(torch.arange(lo, hi + 1, device=self.u.device), self.shape.n_embd, self.options.base, self.u.device)  # (D, C)
            H, hs = self.shape.n_head, self.shape.head_dim
            return self.proj[layer](R.to(self.u.dtype)).view(hi - lo + 1, H, hs).transpose(0, 1)  # (H, D, hs)

        # kept across passes: a decoding loop asks for the same distances at every step
        keys = self._kept(("keys", layer, lo, hi), compute, [self.proj[layer].weight])
        return self.query_for_keys(q), keys.to(q.dtype)

    def four_terms(self, layer: int, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
                   k_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """The paper's four logit terms for content queries ``q`` and keys ``k`` (B, H, T, hs) before
        ``rotate_qk``: each (B, H, Tq, Tk), scaled by 1/sqrt(hs); their sum is the attention logit."""
        scale = 1.0 / math.sqrt(q.shape[-1])
        keys = self.relative_keys(layer, q_pos, k_pos).to(q.dtype)  # (H, D+1, hs)
        u, v = (p.to(q.dtype)[None, :, None, :].expand_as(q) for p in (self.u, self.v))  # (B, H, Tq, hs)
        return {
            "content-content": q @ k.transpose(-1, -2) * scale,
            "content-position": relative_key_bias(q, keys, q_pos, k_pos),
            "global content bias": u @ k.transpose(-1, -2) * scale,
            "global position bias": relative_key_bias(v, keys, q_pos, k_pos),
        }
