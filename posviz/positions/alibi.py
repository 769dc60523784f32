"""ALiBi: Attention with Linear Biases (Press, Smith & Lewis 2022), https://arxiv.org/abs/2108.12409

No position vectors at all: each head h adds ``-m_h * (i - j)`` to the logit of query i for key j,
after the 1/sqrt(d) scale. The slopes m_h are fixed: a geometric sequence starting at
2^(-8/n) for n heads (a power of two), and for other head counts the slopes of the nearest lower
power of two followed by every other slope of the next power of two (the reference code's rule).
Shapes: slopes (H,), bias (1, H, Tq, Tk).
"""
from __future__ import annotations

import math

import torch

from posviz.config import require
from posviz.positions.base import PositionMethod, relative_distance


def alibi_slopes(n_heads: int) -> torch.Tensor:
    require(isinstance(n_heads, int) and n_heads >= 1, f"head count must be a positive integer, got {n_heads!r}")

    def geometric(n: int) -> list[float]:
        first = 2.0 ** (-8.0 / n)
        return [first ** (i + 1) for i in range(n)]

    if n_heads & (n_heads - 1) == 0:
        slopes = geometric(n_heads)
    else:
        lower = 2 ** math.floor(math.log2(n_heads))
        slopes = geometric(lower) + geometric(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(H, Tq, Tk) bias: -slope * distance, 0 on the diagonal; future keys get a positive value but are masked."""
    distance = relative_distance(q_pos, k_pos).to(slopes.dtype)  # (Tq, Tk)
    return -slopes[:, None, None] * distance


class ALiBi(PositionMethod):
    name = "alibi"
    display_name = "ALiBi"
    summary = "A fixed penalty per head proportional to distance, added to the logits."
    paper = "https://arxiv.org/abs/2108.12409"
    acts_on = "logits"
    kind = "relative"
    explore_sections = ("alibi-slopes", "alibi-published")

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        self.register_buffer("slopes", alibi_slopes(shape.n_head), persistent=False)  # (H,)

    def logit_bias(self, layer, q, q_pos, k_pos):
        compute = lambda: alibi_bias(self.slopes, q_pos.to(self.slopes.device), k_pos.to(self.slopes.device)).unsqueeze(0)
        return self._memoized(q_pos, k_pos, compute).to(q.dtype)  # (1, H, Tq, Tk)

    def distance_bias(self, layer, q_pos, lo, hi):
        compute = lambda lo, top: -self.slopes[:, None] * torch.arange(lo, top + 1, device=self.slopes.device).to(self.slopes.dtype)
        return self._kept_distances(("distance",), lo, hi, compute, [self.slopes])  # (H, D), shared by every layer
