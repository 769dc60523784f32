"""A published model's KV cache: transformers' own ``DynamicCache``, with what the labs read of a cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from posviz.errors import PosvizError


@dataclass
class PublishedCache:
    """A ``DynamicCache`` plus the positions of its keys, kept to at most ``max_size`` (a sliding window).

    The labs relabel ``positions`` (the shifted-cache strategy) and read ``len``; the keys keep whatever
    the model baked into them when they were computed, as in transformers.
    """

    max_size: int | None = None
    positions: torch.Tensor | None = None  # (Tk,)
    hf: object = field(default=None, repr=False)

    def __post_init__(self):
        from transformers import DynamicCache

        if self.max_size is not None and not (isinstance(self.max_size, int) and self.max_size >= 1):
            raise PosvizError(f"KV cache max_size must be a positive integer or None, got {self.max_size!r}")
        self.hf = DynamicCache()

    def __len__(self) -> int:
        return 0 if self.positions is None else int(self.positions.numel())

    def next_position(self) -> int:
        return 0 if self.positions is None or not len(self) else int(self.positions[-1]) + 1

    def keep_last(self, n: int) -> None:
        """Drop all but the newest ``n`` entries of every layer."""
        if len(self) <= n:
            return
        if n == 0:
            self.__post_init__()
            self.positions = None
            return
        for layer in self.hf.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[..., -n:, :], layer.values[..., -n:, :]
        self.positions = self.positions[-n:]
