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

from posviz.config import require
from posviz.positions.base import PositionMethod, relative_distance, run_start


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


class RelativeKeys(PositionMethod):
    """Shared machinery of every method whose bias is a query times a *relative key* per distance,
    ``q_i . a_(i-j) / sqrt(hs)``: Shaw (learned keys, clipped), NEZHA (fixed sinusoidal keys, clipped)
    and Transformer-XL (projected sinusoidal keys, unclipped). A subclass says what the keys are;
    how they become a (B, H, Tq, Tk) bias is written once, here. Unregistered: it has no name.
    """

    acts_on = "logits"
    kind = "relative"
    bias_depends_on_query = True

    def relative_keys(self, layer: int, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(D+1, hs) or (H, D+1, hs): the key of distance 0..D; distances past D use the last one."""
        raise NotImplementedError

    def query_for_keys(self, q: torch.Tensor) -> torch.Tensor:
        """The query that multiplies the relative keys (Transformer-XL swaps its global bias in)."""
        return q

    def logit_bias(self, layer, q, q_pos, k_pos):
        table = self.relative_keys(layer, q_pos, k_pos).to(q.dtype)  # (D+1, hs) or (H, D+1, hs)
        return relative_key_bias(self.query_for_keys(q), table, q_pos, k_pos)

    clipped: bool = True  # the keys stop at a fixed distance (Shaw, NEZHA); Transformer-XL's do not

    def banded_bias(self, layer, q, q_pos):
        if not self.clipped:
            return None
        table = self.relative_keys(layer, q_pos, q_pos).to(q.dtype)  # (K+1, hs)
        return self.query_for_keys(q) @ table.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Tq, K+1)


def relative_key_bias(q: torch.Tensor, table: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(B, H, Tq, Tk) bias ``q_i . table[clip(i - j, 0, D)] / sqrt(hs)`` for a table of D+1 relative keys."""
    scores = q @ table.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Tq, D+1): q . a_d for every d
    band = _band_bias(scores, q_pos, k_pos)
    if band is not None:
        return band
    index = relative_distance(q_pos, k_pos).clamp(0, scores.shape[-1] - 1)  # (Tq, Tk)
    index = index.to(q.device).expand(*scores.shape[:-1], index.shape[-1])  # (B, H, Tq, Tk), a view
    return scores.gather(-1, index)  # (B, H, Tq, Tk)


class ShawRelative(RelativeKeys):
    name = "shaw"
    display_name = "Shaw"
    summary = "Learned relative key vectors per clipped distance; a query-dependent logit bias."
    paper = "https://arxiv.org/abs/1803.02155"
    learned = True
    Options = ShawOptions
    explore_sections = ("shaw-clip",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        k = self.options.max_distance
        self.rel_keys = nn.Parameter(torch.randn(shape.n_layer, k + 1, shape.head_dim) * 0.02)  # (L, k+1, hs)

    def relative_keys(self, layer, q_pos, k_pos):
        return self.rel_keys[layer]  # (k+1, hs)


def _band_bias(scores: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
    """The bias for runs of positions without a per-entry gather; None when the positions are not runs.

    Entry (i, j) is scores[i, clamp(i - j + off, 0, k)] with off = q_pos[0] - k_pos[0]. Every key k or
    more bytes back gets the same value, so fill the matrix with it (one pass), then write the k
    distances 0..k-1 next to the diagonal through one strided view of the rows. Future keys keep the
    far value: attention masks them. About 2.5x faster than a gather over (B, H, Tq, Tk) indices.
    """
    K = scores.shape[-1] - 1
    Tq, Tk = q_pos.numel(), k_pos.numel()
    q0, k0 = (run_start(q_pos), run_start(k_pos)) if Tq and Tk else (None, None)
    if q0 is None or k0 is None or q0 - k0 < 0 or q0 - k0 + Tq > Tk:
        return None
    off = q0 - k0
    B, H = scores.shape[:2]
    bias = scores[..., K:].expand(B, H, Tq, Tk).contiguous()  # (B, H, Tq, Tk), far value everywhere
    first = min(Tq, max(0, K - 1 - off))  # rows whose band would start left of key 0
    if first < Tq:
        # row i, e = 0..K-1 -> key j = off + i - (K - 1) + e, at distance K - 1 - e
        band = bias.as_strided((B, H, Tq - first, K), (H * Tq * Tk, Tq * Tk, Tk + 1, 1),
                               bias.storage_offset() + first * Tk + off + first - (K - 1))
        band.copy_(scores[:, :, first:, :K].flip(-1))
    if first:
        index = relative_distance(q_pos[:first], k_pos).clamp(0, K).to(scores.device)  # (first, Tk)
        bias[:, :, :first] = scores[:, :, :first].gather(-1, index.expand(B, H, first, Tk))
    return bias
