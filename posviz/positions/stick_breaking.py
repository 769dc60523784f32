"""Stick-breaking attention (Tan, Shen, Peng, Courville & Panda, ICLR 2025, "Scaling Stick-Breaking
Attention"), https://arxiv.org/abs/2410.17980

No softmax and no position encoding. Each key j before query i breaks off a share
beta_ij = sigmoid(q_i . k_j / sqrt(d)) of what the nearer keys left over:

    A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik)

so the nearest key that fires takes the weight first and hides everything behind it; the weights of a
row sum to at most 1 (the rest goes nowhere). As in the paper, a query does not attend to its own key.
Computed in log space, as the paper does: log A_ij = log sigmoid(z_ij) - sum_{j<k<i} softplus(z_ik).
Shapes: scores (B, H, rows, keys).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from posviz.positions.base import PositionMethod, Seen


@dataclasses.dataclass
class StickBreakingOptions:
    attend_current: bool = False  # the paper's model leaves a query's own key out


class StickBreaking(PositionMethod):
    name = "stick_breaking"
    summary = "No softmax: each earlier key takes a sigmoid share of what the nearer keys left."
    paper = "https://arxiv.org/abs/2410.17980"
    acts_on = "weights"
    kind = "content"
    Options = StickBreakingOptions
    weights_sum_to_one = False
    explore_sections = ("stick-breaking-left",)

    def attention_weights(self, layer, scores, seen: Seen):
        keys = torch.arange(scores.shape[-1], device=scores.device)
        before = keys[None, :] <= seen.q_index[:, None] if self.options.attend_current else \
            keys[None, :] < seen.q_index[:, None]
        allowed = seen.visible & before  # (rows, keys)
        log_beta = F.logsigmoid(scores)
        log_left = (log_beta - scores).masked_fill(~allowed, 0.0)  # log(1 - beta) = log beta - z; 0 where no key
        # the sum over the keys k > j the query may see: a reversed cumulative sum, shifted by one key
        from_here = log_left.flip(-1).cumsum(-1).flip(-1)  # sum over k >= j
        behind = torch.cat((from_here[..., 1:], torch.zeros_like(from_here[..., :1])), dim=-1)
        return (log_beta + behind).exp().masked_fill(~allowed, 0.0)
