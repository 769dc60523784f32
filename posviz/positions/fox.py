"""FoX, the Forgetting Transformer (Lin, Nikishin, He & Courville, ICLR 2025), https://arxiv.org/abs/2503.02130

No position vectors: each head of each layer has a forget gate per token, f_t = sigmoid(w . x_t + b),
from the layer's own input x_t, and the logit of query i for key j gets

    D_ij = sum_{l = j+1 .. i} log f_l = c_i - c_j,   c = cumsum(log f)

a data-dependent ALiBi: where the gates stay near 1 a head looks far back, where one drops (after a
newline? a ``def``?) everything before it fades at once. Nothing reads an index, so a window of keys
may start anywhere: cached decoding never re-encodes.

Initialisation as the reference code's "full" gate (zhixuan-lin/forgetting-transformer): the gate's
weight N(0, 0.02), its bias 0 (every gate starts at sigmoid(0) = 1/2).
Shapes: x (B, T, C); log gates (B, H, T); bias (B, H, rows, keys).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posviz.positions.base import PositionMethod, Seen


class ForgettingGates(PositionMethod):
    name = "fox"
    display_name = "FoX"
    summary = "A forget gate per token and head; a key fades by the product of the gates after it."
    paper = "https://arxiv.org/abs/2503.02130"
    acts_on = "logits"
    kind = "content"
    learned = True
    explore_sections = ("fox-gates",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        self.gates = nn.ModuleList(nn.Linear(shape.n_embd, shape.n_head) for _ in range(shape.n_layer))
        for gate in self.gates:
            nn.init.normal_(gate.weight, mean=0.0, std=0.02)
            nn.init.zeros_(gate.bias)

    def token_state(self, layer, x, cache=None):  # (B, T, C) -> log f (B, H, T), in float32 as the reference computes it
        return F.logsigmoid(F.linear(x, self.gates[layer].weight, self.gates[layer].bias).float()).transpose(1, 2)

    def folded_scores(self, layer, q, k, state):
        # D_ij = c_i - c_j is a query term plus a key term, so it folds into four more features each:
        # q' = (hi_i, 1, lo_i, 1, q / sqrt(hs)) and k' = (1, -hi_j, 1, -lo_j, k) give q'.k' = c_i - c_j + q.k / sqrt(hs)
        # for the fused causal kernel (no (T, T) bias is ever made). c runs to thousands at long lengths and only its
        # differences near the diagonal matter: hi (c rounded to a multiple of 64) is exact in float32, and put
        # first, the kernel's sum cancels hi_i - hi_j exactly before it adds the rest (one feature holding c
        # whole was off by 4e-4 at 4,096 bytes; this by 1e-6, against float64). Float32 or wider only.
        if self.sink_logits is not None or q.dtype not in (torch.float32, torch.float64):
            return None
        c = state.double().cumsum(-1)  # (B, H, T)
        hi = torch.round(c / 64) * 64
        hi, lo = hi.to(q.dtype)[..., None], (c - hi).to(q.dtype)[..., None]  # (B, H, T, 1) each
        one = torch.ones_like(hi)
        return (torch.cat((hi, one, lo, one, q * (1.0 / q.shape[-1] ** 0.5)), dim=-1),
                torch.cat((one, -hi, one, -lo, k), dim=-1), 1.0)

    def content_bias(self, layer, scores, q, k, seen: Seen):
        # c over the keys this block sees (its queries are among them), in float64: c runs to thousands at long
        # lengths and only differences matter, D_ij = c_i - c_j (rebasing c on a later byte would let that byte
        # change the rounding of earlier rows).
        c = seen.k_state.double().cumsum(-1)  # (B, H, keys)
        return (c[..., seen.q_index, None] - c[..., None, :]).to(scores.dtype)  # (B, H, rows, keys)
