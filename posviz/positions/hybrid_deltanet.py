"""A hybrid of recurrent layers and NoPE attention, as the open models of 2025-26 arrange them: Qwen3-Next and Qwen3.5
(three Gated DeltaNet layers, then one attention layer; transformers' ``layer_types`` with ``full_attention_interval``
4), Kimi Linear (Kimi Delta Attention layers beside MLA layers that use no positions at all).

Where position is: the recurrent layers read the text in order, each byte's state built from the one before, so order
is in the recurrence itself (``posviz.models.gated_deltanet``); the attention layers take no position at all, NoPE, as
Kimi Linear's do (Qwen3-Next's rotate a quarter of each head; here the recurrence is the one source of order, the
question the hybrid asks). The method owns its recurrent layers (``token_mixer``): a layer it answers for has no
attention; the others are posviz's attention with nothing added.

Reference path: transformers' ``Qwen3NextGatedDeltaNet`` for each recurrent layer (see that module), and
``Qwen3NextConfig.layer_types``: "linear_attention" except every ``full_attention_interval``-th layer.
"""
from __future__ import annotations

import dataclasses

from torch import nn

from posviz.config import require
from posviz.models.gated_deltanet import GatedDeltaNet
from posviz.positions.base import PositionMethod


@dataclasses.dataclass
class HybridOptions:
    full_attention_interval: int = 4  # Qwen3-Next's: layers 3, 7, ... (and the last) attend, the others are Gated DeltaNet

    def __post_init__(self):
        require(isinstance(self.full_attention_interval, int) and not isinstance(self.full_attention_interval, bool)
                and self.full_attention_interval >= 1,
                f"hybrid_deltanet full_attention_interval must be a positive integer, got {self.full_attention_interval!r}")


class HybridDeltaNet(PositionMethod):
    name = "hybrid_deltanet"
    display_name = "DeltaNet + NoPE"  # short: a legend at 1366 px shows about 18 characters
    summary = ("Three recurrent Gated DeltaNet layers to one attention layer without positions (Qwen3-Next, Kimi "
               "Linear): order comes from the recurrence.")
    paper = "https://arxiv.org/abs/2412.06464"
    acts_on = "recurrence"
    # no index anywhere (its attention is NoPE, its recurrence reads the text in order): "none", as NoPE and Canon;
    # "content" would put it on the Positions from content page, whose sections take attention scores apart
    kind = "none"
    learned = True
    Options = HybridOptions

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        every = self.options.full_attention_interval
        # every interval-th layer attends, and the last (Qwen3-Next's 48 layers end on one; a model shallower than the
        # interval, as the tests' two layers, keeps one attention layer)
        self.layer_types = ["full_attention" if (i + 1) % every == 0 or i == shape.n_layer - 1 else "linear_attention"
                            for i in range(shape.n_layer)]
        self.recurrent = nn.ModuleDict({str(i): GatedDeltaNet(shape.n_embd, shape.n_head)
                                        for i, kind in enumerate(self.layer_types) if kind == "linear_attention"})

    def token_mixer(self, layer):
        return self.recurrent[str(layer)] if str(layer) in self.recurrent else None

    def layer_kind(self, layer: int) -> str:
        return "Gated DeltaNet (recurrent)" if str(layer) in self.recurrent else "attention"
