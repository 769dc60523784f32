"""PoPE, Polar Coordinate Position Embeddings (Gopalakrishnan, Csordás, Schmidhuber & Mozer 2025, "Decoupling the
'What' and 'Where' With Polar Coordinate Positional Embeddings"), https://arxiv.org/abs/2509.10534

RoPE rotates pairs of a query's features, so how much a pair matches (its length) and where it points (its angle)
both come from the content, and the position's turn adds to an angle the content already chose. PoPE splits the two:
each of the hs features c of a query or key becomes one complex number whose

* magnitude is the content alone:  mu_c = softplus(x_c) >= 0,
* phase is the position alone:     t theta_c for a query at t; t theta_c + delta_c for a key,

with hs frequencies theta_c = base^(-c / hs) (one per feature, not one per pair), and delta a learned phase per head
and feature, clamped to [-2 pi, 0]. The logit is the real part of the Hermitian product,

    s_ij = sum_c mu^q_ic mu^k_jc cos((i - j) theta_c - delta_c) / sqrt(hs),

a function of i - j, so a window of keys may start anywhere. It is computed as a dot product of real vectors
twice as wide, q' = (mu cos(i theta), mu sin(i theta)) and k' = (mu cos(j theta + delta), mu sin(j theta + delta)),
which is why ``rotate_qk`` returns queries and keys of width 2 hs (values keep hs).

Reference path: lucidrains/x-transformers, ``PolarEmbedding`` and ``apply_polar_pos_emb``: one module for the whole
stack (one delta shared by the layers, shape (heads, 1, dim_head), zeros unless ``bias_uniform_init``), the softplus
taken in float32, and attention's scale dim_head^-0.5 of the *unwidened* head. Attention here scales by 1/sqrt of
the width it is handed (2 hs), so q' carries a factor sqrt(2) that makes every path's scale 1/sqrt(hs).
Shapes: q, k (B, H, T, hs) in, (B, H, T, 2 hs) out; pos (T,); delta (H, hs).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from posviz.config import require
from posviz.positions.base import PositionMethod


@dataclasses.dataclass
class PopeOptions:
    base: float = 10000.0  # theta_c = base^(-c / hs), c = 0 .. hs - 1
    bias_init: str = "zeros"  # "zeros" (x-transformers' default) or "uniform" (U(-2 pi, 0), its bias_uniform_init)

    def __post_init__(self):
        require(self.base > 1, f"PoPE's base must be > 1, got {self.base}")
        require(self.bias_init in ("zeros", "uniform"), f"PoPE's bias_init must be 'zeros' or 'uniform', got {self.bias_init!r}")


class PolarPositions(PositionMethod):
    name = "pope"
    display_name = "PoPE"
    summary = ("Each feature a complex number: magnitude softplus(content), phase position x frequency; "
               "what matches and where it sits no longer share one angle.")
    paper = "https://arxiv.org/abs/2509.10534"
    acts_on = "q/k"
    kind = "relative"
    learned = True
    Options = PopeOptions
    explore_sections = ("pope-polar",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        hs = shape.head_dim
        self.register_buffer("inv_freq", 1.0 / self.options.base ** (torch.arange(hs, dtype=torch.float64) / hs),
                             persistent=False)  # (hs,) float64: the angles are taken in float64 below
        self.phase_bias = nn.Parameter(torch.zeros(shape.n_head, hs))  # delta, shared by every layer
        if self.options.bias_init == "uniform":
            with torch.no_grad():
                self.phase_bias.uniform_(-2.0 * math.pi, 0.0)

    def key_phase(self) -> torch.Tensor:
        """delta (H, hs) as attention uses it: clamped to [-2 pi, 0], as the reference does at every forward."""
        return self.phase_bias.clamp(-2.0 * math.pi, 0.0)

    def rotate_qk(self, q, k, pos):  # q, k (B, H, T, hs) -> (B, H, T, 2 hs)
        def angles():  # (T, hs) in float64, once per pass: every layer turns at the same positions
            return pos.to(torch.float64)[:, None] * self.inv_freq.to(pos.device)[None, :]

        theta = self._memoized(pos, pos, angles, ("pope",)).to(q.device)
        work = torch.promote_types(q.dtype, torch.float32)  # the softplus in float32 at least, as the reference
        phase_k = theta[None] + self.key_phase().to(device=q.device, dtype=torch.float64)[:, None, :]  # (H, T, hs)
        mu_q, mu_k = F.softplus(q.to(work)), F.softplus(k.to(work))
        q2 = torch.cat((mu_q * torch.cos(theta).to(work), mu_q * torch.sin(theta).to(work)), dim=-1) * math.sqrt(2.0)
        k2 = torch.cat((mu_k * torch.cos(phase_k).to(work), mu_k * torch.sin(phase_k).to(work)), dim=-1)
        return q2.to(q.dtype), k2.to(k.dtype)
