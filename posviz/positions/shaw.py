"""Shaw et al. 2018 relative position representations (key side), clipped at distance k.

"Self-Attention with Relative Position Representations", https://arxiv.org/abs/1803.02155

    e_ij = q_i . (k_j + a_clip(i-j)) / sqrt(hs)

so the position term is a *query-dependent* bias q_i . a_clip(i-j) / sqrt(hs). Every distance past k
shares the last embedding: the model cannot tell 100 bytes back from 1,000. As in the paper the
embeddings are shared across heads and learned per layer. The model is causal, so only the
distances 0..k (keys at or before the query) are ever used; we store those k+1 vectors.
Shapes: q (B, H, Tq, hs), table (n_layer, k+1, hs), bias (B, H, Tq, Tk).
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from ..config import require
from .base import PositionMethod, relative_distance


def shaw_clip_matrix(length: int, max_distance: int, causal: bool = True) -> torch.Tensor:
    """(length, length) index of the relative embedding each (query, key) pair uses.

    Bidirectional: clip(j - i, -k, k) + k, in 0..2k. Causal: clip(i - j, 0, k) for j <= i, -1 above
    the diagonal (masked, never used).
    """
    require(length >= 0 and max_distance >= 0, "length and max_distance must be non-negative")
    pos = torch.arange(length)
    if causal:
        dist = relative_distance(pos, pos)
        return torch.where(dist >= 0, dist.clamp(max=max_distance), torch.full_like(dist, -1))
    return (pos[None, :] - pos[:, None]).clamp(-max_distance, max_distance) + max_distance


@dataclasses.dataclass
class ShawOptions:
    max_distance: int = 64  # k: distances >= k share one embedding (about one line of code in bytes)

    def __post_init__(self):
        require(isinstance(self.max_distance, int) and self.max_distance >= 1, "shaw max_distance must be an integer >= 1")


class ShawRelative(PositionMethod):
    name = "shaw"
    summary = "Learned relative key vectors per clipped distance; a query-dependent logit bias."
    paper = "https://arxiv.org/abs/1803.02155"
    acts_on = "logits"
    kind = "relative"
    learned = True
    Options = ShawOptions

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        k = self.options.max_distance
        self.rel_keys = nn.Parameter(torch.randn(shape.n_layer, k + 1, shape.head_dim) * 0.02)  # (L, k+1, hs)

    def logit_bias(self, layer, q, q_pos, k_pos):
        table = self.rel_keys[layer].to(q.dtype)  # (k+1, hs)
        scores = q @ table.t() / math.sqrt(q.shape[-1])  # (B, H, Tq, k+1): q . a_d for every distance d
        index = relative_distance(q_pos, k_pos).clamp(0, self.options.max_distance)  # (Tq, Tk)
        index = index.to(q.device).expand(*scores.shape[:-1], index.shape[-1])  # (B, H, Tq, Tk), a view
        return scores.gather(-1, index)  # (B, H, Tq, Tk)
