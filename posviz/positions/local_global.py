"""Local and global layers (Gemma 3): sliding-window layers with RoPE base 10 k, a full layer with base 1 M.

Gemma Team 2025, "Gemma 3 Technical Report", https://arxiv.org/abs/2503.19786 ; transformers'
``Gemma3TextConfig`` (``layer_types``, ``sliding_window``, ``rope_parameters`` per layer type). The local
layers see only the last W keys, so they never meet a distance unseen in training; only the global layer
meets long distances, and its slow base (1 M) turns its pairs little within them.

At our size: Gemma 3 has five local layers to one global; with four layers we keep three to one. Its
window is 1,024 of 32 k tokens (1/32): at 256 bytes that would be 8 bytes, less than a line of code.
W = a quarter of the training length (64 bytes, about two lines) keeps the local layers seeing far less
than the global one. Shapes as in ``positions.layers``.
"""
from __future__ import annotations

from posviz.positions.layers import LayerLayout

WINDOW_SHARE = 4  # W = train_length / 4; see the module docstring


class LocalGlobal(LayerLayout):
    name = "local_global"
    display_name = "local/global"
    summary = ("Gemma 3: three sliding-window layers (the last quarter of the training length, RoPE base 10 k), "
               "then one full layer (RoPE base 1 M).")
    paper = "https://arxiv.org/abs/2503.19786"

    @classmethod
    def preset_layers(cls, shape):
        local = {"method": "rope", "options": {"base": 10_000.0}, "window": max(1, shape.train_length // WINDOW_SHARE)}
        return [local, local, local, {"method": "rope", "options": {"base": 1_000_000.0}}]
