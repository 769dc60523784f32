"""GPT-OSS's arrangement: sliding-window and full RoPE layers alternating, a learned sink logit per head.

OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", https://arxiv.org/abs/2508.10925 ; transformers'
``modeling_gpt_oss.py`` (``layer_types``, ``sinks`` and ``eager_attention_forward``). Each head's sink is
one logit that joins every softmax row as a key with no value and is dropped after it: a head may put
weight nowhere, instead of on the first tokens as StreamingLLM found trained models do.

At our size: GPT-OSS's window is 128 tokens; ours is a quarter of the training length (64 bytes), as
``local_global``'s, so that the two differ by the sinks and the alternation alone. Shapes as in
``positions.layers``.
"""
from __future__ import annotations

from posviz.positions.layers import LayerLayout
from posviz.positions.local_global import WINDOW_SHARE


class RopeSinks(LayerLayout):
    name = "rope_sinks"
    display_name = "RoPE + sinks"
    summary = ("GPT-OSS: sliding-window (a quarter of the training length) and full RoPE layers alternating, each "
               "head with a learned sink logit that can take weight away from every key.")
    paper = "https://arxiv.org/abs/2508.10925"
    weights_sum_to_one = False  # the sink takes its share of every row

    @classmethod
    def preset_layers(cls, shape):
        window = max(1, shape.train_length // WINDOW_SHARE)
        return [{"method": "rope", "window": window, "sinks": True}, {"method": "rope", "sinks": True}]
