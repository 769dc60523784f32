"""Stick-breaking attention (Tan, Shen, Peng, Courville & Panda, ICLR 2025, "Scaling Stick-Breaking
Attention"), https://arxiv.org/abs/2410.17980; reference code shawntan/stickbreaking-attention.

No softmax and no position encoding. Each key j before query i breaks off a share
beta_ij = sigmoid(q_i . k_j / sqrt(d)) of what the nearer keys left over:

    A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik)

so the nearest key that fires takes the weight first and hides everything behind it. What no earlier key
took, rem_i = 1 - sum_j A_ij = prod_{j < i} (1 - beta_ij), goes to the query's own value, as the reference
forward does (``ref_fwd`` in its tests: ``o = o + rem[..., None] * v``):

    o_i = sum_{j < i} A_ij v_j + rem_i v_i

Other published paths spend the remainder otherwise: the released 3B model (``shawntan/stickbreaking-3b``,
``"sb_remainder": false``) drops it, and IBM's dolomite / lm-engine ``SBAttention`` gives it to a learned vector per head
(``head_bias``) before a per-head GroupNorm; posviz follows the ICLR code's forward.
Here the remainder is put on the diagonal of the weights (the query's own key), which is that same sum,
so every row sums to 1, an attention map shows where the remainder goes, and the first byte (no earlier
key) attends to itself alone. As in the paper, a query's own key breaks off no share (``attend_current``
False); with it True the own key's share comes first and the remainder joins it.
Computed in log space, as the paper does: log A_ij = log sigmoid(z_ij) - sum_{j<k<i} softplus(z_ik).
Shapes: scores (B, H, rows, keys).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from posviz.positions.base import PositionMethod, Seen, may_overwrite


@dataclasses.dataclass
class StickBreakingOptions:
    attend_current: bool = False  # the paper's model: a query's own key breaks off no share (keys j < i)


class StickBreaking(PositionMethod):
    name = "stick_breaking"
    display_name = "stick-breaking"
    summary = "No softmax: each earlier key takes a sigmoid share of what the nearer keys left; the rest stays with the query."
    paper = "https://arxiv.org/abs/2410.17980"
    acts_on = "weights"
    kind = "content"
    Options = StickBreakingOptions
    explore_sections = ("stick-breaking-left",)

    def attention_weights(self, layer, scores, seen: Seen):
        keys = torch.arange(scores.shape[-1], device=scores.device)
        own = keys[None, :] == seen.q_index[:, None]  # (rows, keys): each query's own key
        before = keys[None, :] < seen.q_index[:, None]
        hidden = ~(seen.visible & (before | own if self.options.attend_current else before))  # (rows, keys)
        log_beta = F.logsigmoid(scores)
        log_left = (log_beta - scores).masked_fill(hidden, 0.0)  # log(1 - beta) = log beta - z; 0 where no key
        # the sum over the keys k > j the query may see: a reversed cumulative sum, less the key's own term
        from_here = log_left.flip(-1).cumsum(-1).flip(-1)  # sum over k >= j
        remainder = from_here[..., 0].exp()  # (B, H, rows): prod of (1 - beta) over every allowed key
        # log A_ij = log beta_ij + sum_{k > j} log(1 - beta_ik). A weight under e^-80 (2e-35, nothing beside weights
        # that sum to 1) is written 0 without an exp: exp is 10x slower on arguments past float32's range, as
        # the far keys' often are. In place where autograd records nothing (it keeps these for training).
        if may_overwrite(log_beta):
            log_a = log_beta.add_(from_here.sub_(log_left))
            hidden = hidden | (log_a < -80.0)
            sticks = log_a.clamp_(min=-80.0).exp_().masked_fill_(hidden, 0.0)
        else:
            log_a = log_beta + (from_here - log_left)
            hidden = hidden | (log_a < -80.0)
            sticks = log_a.clamp(min=-80.0).exp().masked_fill(hidden, 0.0)
        rows = torch.arange(scores.shape[-2], device=scores.device)
        sticks[..., rows, seen.q_index] += remainder  # the remainder on each query's own key (sticks is no saved value)
        return sticks
