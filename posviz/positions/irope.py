"""iRoPE (Llama 4): three RoPE layers, then one NoPE layer whose queries get a temperature.

Meta 2025, "The Llama 4 herd", https://ai.meta.com/blog/llama-4-multimodal-intelligence/ ; the layout and
the temperature as transformers' ``Llama4TextAttention`` (``no_rope_layers``: every fourth layer,
``floor_scale``, ``attn_scale``). The NoPE layer sees every key with no position at all, so nothing in it
turns into unseen angles past the training length; the temperature ``log1p(floor((pos + 1) / floor_scale))
* 0.1 + 1`` keeps its attention from flattening as the keys multiply.

At our size: Llama 4's floor_scale is 8,192 (its RoPE layers' chunk); ours is the training length (256
bytes), so the temperature is 1 on positions 0..254 and steps to 1 + 0.1 log 2 = 1.069 at 255, the last
position trained on ((255 + 1) / 256 = 1), then grows with log(position) past it, as in Llama 4. The RoPE
layers see all keys (Llama 4 chunks them; the issue's layout does not).
Shapes as in ``positions.layers``.
"""
from __future__ import annotations

from posviz.positions.layers import LayerLayout


class IRope(LayerLayout):
    name = "irope"
    display_name = "iRoPE"
    summary = "Llama 4: three RoPE layers, then a NoPE layer whose queries sharpen with log(position)."
    paper = "https://ai.meta.com/blog/llama-4-multimodal-intelligence/"

    @classmethod
    def preset_layers(cls, shape):
        rope = {"method": "rope"}
        return [rope, rope, rope, {"method": "nope", "options": {"temperature_floor_scale": shape.train_length}}]
