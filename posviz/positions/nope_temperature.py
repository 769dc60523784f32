"""NoPE with an attention temperature that grows with the query's position: Llama 4's NoPE layers
(``Llama4TextAttention`` in transformers: ``attn_scales = log1p(floor((cache_position + 1) / floor_scale)) *
attn_scale + 1``, multiplied into the queries of the layers that use no RoPE), the idea of Scalable-Softmax
(Nakanishi 2025, https://arxiv.org/abs/2501.19399: scale the logits by s log n so that attention over n keys does not
flatten as n grows).

The two numbers, for a 256-byte context: Llama 4 sets floor_scale = 8,192 and attn_scale = 0.1 for a 256K-token
context, so its temperature takes 32 steps up within what it was trained on (1 → 1 + 0.1 log 33 = 1.35). Here
floor_scale = 8 bytes keeps those 32 steps within the 256-byte training length (the same 1 → 1.35), and at 16× (4,096
bytes) the queries are scaled by 1 + 0.1 log 513 = 1.62: the model meets longer contexts with a temperature it has
learned to read, growing as log n as Scalable-Softmax asks. attn_scale is Llama 4's.

The same option on the shipped ``nope`` checkpoint (``temperature_floor_scale``) is an inference-time switch, as a
scaling is on rope: the checkpoint trained without it, run with it. Shapes as in ``nope``.
"""
from __future__ import annotations

import dataclasses

from posviz.positions.nope import NoPE, NoPEOptions

FLOOR_SCALE = 8  # bytes per step of the temperature: 32 steps within the 256-byte training length, as Llama 4's 256K / 8,192
ATTN_SCALE = 0.1  # Llama 4's
# The inference-time switch on the shipped nope checkpoint (listed in every lab as "NoPE + temperature, no retraining")
INFERENCE_TEMPERATURE = {"temperature_floor_scale": FLOOR_SCALE, "temperature_attn_scale": ATTN_SCALE}


@dataclasses.dataclass
class NoPETemperatureOptions(NoPEOptions):
    temperature_floor_scale: int | None = FLOOR_SCALE
    temperature_attn_scale: float = ATTN_SCALE

    def __post_init__(self):
        super().__post_init__()
        from posviz.config import require

        require(self.temperature_floor_scale is not None,
                "nope_temperature is NoPE with a temperature: temperature_floor_scale must be a positive integer "
                "(plain NoPE is the nope method)")


class NoPETemperature(NoPE):
    name = "nope_temperature"
    display_name = "NoPE + temperature"
    summary = ("No position signal, but each query is scaled by 1 + 0.1 log(1 + ⌊(i + 1) / 8⌋), growing with its "
               "position, so attention stays sharp over longer contexts (Llama 4's NoPE layers).")
    paper = "https://arxiv.org/abs/2501.19399"
    Options = NoPETemperatureOptions
    explore_sections = ("nope-temperature",)
