"""Gated attention: RoPE attention whose every head's output is multiplied, channel by channel, by a sigmoid gate
computed from the layer's input (Qiu et al. 2025, "Gated Attention for Large Language Models: Non-linearity,
Sparsity, and Attention-Sink-Free", https://arxiv.org/abs/2505.06708; Qwen3-Next and Qwen3.5 use it).

Reference path: transformers' ``Qwen3NextAttention`` (``models/qwen3_next/modeling_qwen3_next.py``): ``q_proj`` gives
each head its query and its gate side by side (``view(..., -1, head_dim * 2)`` then ``chunk(2)``), and after
attention ``attn_output = attn_output * sigmoid(gate)`` before ``o_proj``: one gate value per head and channel
(the paper's "elementwise, head-specific" G1 position), from the same normed hidden state as the query. Here the gate
is the method's own projection per layer (``gate_proj``, n_embd to n_embd, no bias as ``attention_bias`` is off by
default), initialised as the reference initialises ``q_proj``: normal(0, initializer_range = 0.02). The attention
itself is posviz's RoPE (full rotation; Qwen3-Next rotates a quarter of each head and norms q and k, which are not
the gate and stay RoPE's here, so that the gate is the one difference from the ``rope`` checkpoint).

What the paper claims, and a lab can check: with the gate a head can output nothing by closing it, so it need not park
its weight on the first token (no attention sink), and the model trains a little better.
Shapes: x (B, T, C); the gate (B, H, T, hs) as the heads' output.
"""
from __future__ import annotations

import torch
from torch import nn

from posviz.positions.rope import Rotary

INIT_STD = 0.02  # Qwen3NextConfig.initializer_range: the std _init_weights gives q_proj, whose other half is the gate


class GatedAttention(Rotary):
    name = "gated_attention"
    display_name = "RoPE + output gate"
    summary = ("RoPE attention whose each head's output is multiplied, channel by channel, by a sigmoid gate from the "
               "layer's input (Qwen3-Next): a head can close instead of attending to a sink.")
    paper = "https://arxiv.org/abs/2505.06708"
    explore_sections = ("output-gate",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        self.gate_proj = nn.ModuleList(nn.Linear(shape.n_embd, shape.n_head * shape.head_dim, bias=False)
                                       for _ in range(shape.n_layer))
        for proj in self.gate_proj:
            nn.init.normal_(proj.weight, mean=0.0, std=INIT_STD)

    def output_gate(self, layer, x):  # x (B, T, C) -> (B, H, T, hs)
        B, T, _ = x.shape
        gate = self.gate_proj[layer](x).view(B, T, self.shape.n_head, self.shape.head_dim).transpose(1, 2)
        return torch.sigmoid(gate)
