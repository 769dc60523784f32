"""CoPE, Contextual Position Encoding (Golovneva, Wang, Weston & Sukhbaatar 2024, "Contextual Position
Encoding: Learning to Count What's Important"), https://arxiv.org/abs/2405.18719

Positions are counted, not indexed. Query i gates every key it sees, g_ij = sigmoid(q_i . k_j / sqrt(d)),
and the position of key j seen from query i is the sum of the gates from j to i,

    p_ij = sum_{t = j .. i} g_it           (a real number: with every gate at 1, the plain distance + 1)

capped at npos_max - 1. Its embedding is interpolated between the learned embeddings of floor(p) and
ceil(p), and q_i . e[p_ij] is added to the logit. A head can count lines, words or brackets instead of
bytes; nothing reads an index, so a window of keys may start anywhere.

The logit follows the paper's code listing (its appendix): the position term q_i . e[p_ij] is added to the
already scaled logit q_i . k_j / sqrt(d), unscaled. The reference repository (facebookresearch/RAM,
projects/cope, ``ContextPosSelfAttn``) does so only with ``--cope-nodiv``; by default it adds the term
first and divides both by sqrt(d). As that code: one table of npos_max embeddings per layer, shared by its
heads, starting at zero; the gates read the scaled logits of the same queries and keys.
Shapes: scores (B, H, rows, keys); table (hs, npos_max).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from posviz.config import require
from posviz.positions.base import PositionMethod, Seen, may_overwrite


@dataclasses.dataclass
class CopeOptions:
    npos_max: int = 64  # positions with an embedding of their own; counts past it share the last (the paper's 64)

    def __post_init__(self):
        require(isinstance(self.npos_max, int) and self.npos_max >= 2, f"npos_max must be an integer >= 2, got {self.npos_max!r}")


class ContextualPositions(PositionMethod):
    name = "cope"
    display_name = "CoPE"
    summary = "Counts the keys each query's gates let through; embeds that count, not the index."
    paper = "https://arxiv.org/abs/2405.18719"
    acts_on = "logits"
    kind = "content"
    learned = True
    Options = CopeOptions
    explore_sections = ("cope-counts",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        self.tables = nn.ParameterList(nn.Parameter(torch.zeros(shape.head_dim, self.options.npos_max))
                                       for _ in range(shape.n_layer))

    def counted_positions(self, scores: torch.Tensor, seen: Seen) -> torch.Tensor:
        """p (B, H, rows, keys): the summed gates from each key to the query, 0 where a key is unseen."""
        return self._counts(scores, ~seen.visible).masked_fill_(~seen.visible, 0.0)

    @staticmethod
    def _counts(scores: torch.Tensor, unseen: torch.Tensor) -> torch.Tensor:
        """The summed gates from each key to the query, summed outward from the query (so that a near key's count
        is a sum of few gates, as exact as the gates); right for every seen key, 0 for the future ones, not for
        keys before a window (attention hides those)."""
        gates = torch.sigmoid(scores)
        gates = gates.masked_fill_(unseen, 0.0) if may_overwrite(gates) else gates.masked_fill(unseen, 0.0)
        return gates.flip(-1).cumsum(-1).flip(-1)

    def content_bias(self, layer, scores, q, k, seen: Seen):
        p = self._counts(scores, ~seen.visible).clamp(max=self.options.npos_max - 1)
        per_position = q.to(scores.dtype) @ self.tables[layer].to(scores.dtype)  # (B, H, rows, npos_max): q . e[n]
        # interpolated between the embeddings of floor(p) and ceil(p): floor(p) + 1 unless p is a whole number
        # (then the weight of the upper one is 0, and the cap keeps it in the table)
        lower = p.long()  # p >= 0: the cast is the floor
        upper = (lower + 1).clamp_(max=self.options.npos_max - 1)
        below, above = per_position.gather(-1, lower), per_position.gather(-1, upper)
        if not may_overwrite(p):  # training: autograd keeps these
            return below + (p - lower) * (above - below)
        return below.add_(above.sub_(below).mul_(p.sub_(lower)))  # below + w (above - below), w = p - floor(p)
