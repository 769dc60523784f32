"""T5 relative position bias: a learned scalar per head per distance *bucket*, shared by all layers.

Raffel et al. 2020, https://arxiv.org/abs/1910.10683 (§2.1). Distances below ``num_buckets/2`` get a
bucket each; larger ones share logarithmically wider buckets up to ``max_distance``, and everything
beyond falls in the last bucket. Because the bias depends only on the distance, it works with a KV
cache: cached keys keep their positions and the bias is looked up for (query, key) pairs.
Shapes: relative distance (Tq, Tk), bucket table (num_buckets, H), bias (1, H, Tq, Tk).
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from posviz.config import require
from posviz.positions.base import PositionMethod, bias_from_distance_table, distance_range, relative_distance


def t5_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """Bucket index for ``relative_position = key_pos - query_pos`` (T5's sign convention).

    Causal: only keys at or before the query count (future distances map to bucket 0, and are
    masked anyway). Bidirectional: half the buckets for keys after the query.
    """
    require(num_buckets >= 2 and max_distance >= 1, "num_buckets must be >= 2 and max_distance >= 1")
    rel = relative_position.long()
    offset = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        offset = (rel > 0).long() * num_buckets
        distance = rel.abs()
    else:
        distance = (-rel).clamp(min=0)
    exact = num_buckets // 2  # one bucket per distance below this
    # Distances from `exact` to `max_distance` are spread over the remaining buckets on a log scale.
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (num_buckets - exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return offset + torch.where(distance < exact, distance, far)


@dataclasses.dataclass
class T5Options:
    num_buckets: int = 32  # T5's default
    # Below train_length on purpose: training then shows distances past max_distance, so the last
    # bucket (used for every longer distance at inference) is learned instead of left at its init.
    max_distance: int = 128

    def __post_init__(self):
        require(isinstance(self.num_buckets, int) and self.num_buckets >= 4, "t5 num_buckets must be an integer >= 4")
        require(isinstance(self.max_distance, int) and self.max_distance > self.num_buckets // 2,
                "t5 max_distance must be an integer larger than num_buckets / 2")


class T5RelativeBias(PositionMethod):
    name = "t5"
    display_name = "T5"
    summary = "A learned scalar per head per log-spaced distance bucket, added to the logits."
    paper = "https://arxiv.org/abs/1910.10683"
    acts_on = "logits"
    kind = "relative"
    learned = True
    Options = T5Options
    explore_sections = ("t5-buckets",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        self.bucket_bias = nn.Embedding(self.options.num_buckets, shape.n_head)  # (num_buckets, H)
        nn.init.zeros_(self.bucket_bias.weight)  # start as NoPE; training decides what distance means

    def buckets(self, q_pos, k_pos):
        return t5_bucket(-relative_distance(q_pos, k_pos), False, self.options.num_buckets, self.options.max_distance)

    def table(self, lo: int, hi: int) -> torch.Tensor:
        """(H, hi - lo + 1): the bias at every distance lo..hi (negative distances: bucket 0, masked)."""
        span = torch.arange(lo, hi + 1, device=self.bucket_bias.weight.device)
        return self.bucket_bias(t5_bucket(-span, False, self.options.num_buckets, self.options.max_distance)).t()

    def logit_bias(self, layer, q, q_pos, k_pos):
        def compute():
            # The bias depends on the distance alone: bucket the few distinct distances (a 1-D range),
            # then look every (query, key) pair up in that table. Bucketing each pair instead costs a
            # dozen passes (a log among them) over Tq x Tk entries.
            distance = relative_distance(q_pos, k_pos).to(self.bucket_bias.weight.device)  # (Tq, Tk)
            lo, hi = distance_range(q_pos, k_pos)  # without reading the positions back
            return bias_from_distance_table(self.table(lo, hi), distance, lo).unsqueeze(0)  # (1, H, Tq, Tk)

        return self._memoized(q_pos, k_pos, compute).to(q.dtype)

    def distance_bias(self, layer, q_pos, lo, hi):
        return self._kept_distances(("distance",), lo, hi, self.table, [self.bucket_bias.weight])  # every layer
