"""A published model's KV cache: transformers' own ``DynamicCache``, with what the labs read of a cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from posviz.errors import CacheLimitError, PosvizError


@dataclass
class PublishedCache:
    """A ``DynamicCache`` plus the positions of its keys, kept to at most ``max_size`` (a sliding window).

    The labs relabel ``positions`` (the shifted-cache strategy) and read ``len``; the keys keep whatever
    the model baked into them when they were computed, as in transformers.
    """

    max_size: int | None = None
    positions: torch.Tensor | None = None  # (Tk,)
    hf: object = field(default=None, repr=False)
    sinks: int = 0  # StreamingLLM: the first entries, kept whatever the window evicts
    # A hybrid's config: transformers builds each layer's own kind of cache from its layer_types (a recurrent
    # layer's fixed-size state, an attention layer's keys); None: every layer attention, built as it runs
    config: object = field(default=None, repr=False)
    # for_maps: each non-attention layer's inputs so far (layer -> (B, T, C)), from which a cached pass draws its
    # implied rows over every token since the first (``mixers``); its state alone cannot give them
    inputs: dict | None = field(default=None, repr=False)
    # False where a layer keeps its own window and compressed entries (DeepSeek-V4): nothing posviz may evict
    evictable: bool = True

    def __post_init__(self):
        from transformers import DynamicCache

        from posviz.models.kv_cache import check_sinks

        if self.max_size is not None and not (isinstance(self.max_size, int) and self.max_size >= 1):
            raise PosvizError(f"KV cache max_size must be a positive integer or None, got {self.max_size!r}")
        check_sinks(self.sinks, self.max_size)
        self.hf = DynamicCache(config=self.config) if self.config is not None else DynamicCache()
        if self.inputs is not None:
            self.inputs = {}

    def __len__(self) -> int:
        return 0 if self.positions is None else int(self.positions.numel())

    def next_position(self) -> int:
        return 0 if self.positions is None or not len(self) else int(self.positions[-1]) + 1

    def keep_last(self, n: int) -> None:
        """Drop all but the newest ``n`` entries of every layer (with sinks: the first ``sinks`` and the newest
        ``n - sinks``)."""
        if len(self) <= n:
            return
        if n == 0 and self.config is None:
            self.__post_init__()
            self.positions = None
            return
        held, K = len(self), min(self.sinks, n)
        keep = torch.cat((torch.arange(K), torch.arange(held - (n - K), held)))
        full = self._full_layers()
        if not self.evictable:
            # DeepSeek-V4: every layer keeps its own window of keys and compressed entries of the tokens before, which
            # posviz cannot evict entry by entry (a window within its own would cut its keys from under it, and one
            # past it would leave its cache as it is, scored under the window's name)
            raise CacheLimitError("this model keeps no layer's keys for every token (its layers keep their own window "
                              "and compressed entries of the text before it), so posviz cannot evict its cache to a "
                              f"window of {n:,}: re-encoding the window is the strategy that applies.")
        for layer in full:
            layer.keys, layer.values = layer.keys[..., keep, :], layer.values[..., keep, :]
        self.positions = self.positions[keep.to(self.positions.device)]

    def _full_layers(self) -> list:
        """The layers that hold every kept entry (a model's own sliding-window layers keep fewer, and evict alone)."""
        return [layer for layer in self.hf.layers if getattr(layer, "keys", None) is not None
                and layer.keys.numel() and layer.keys.shape[-2] == len(self)]

    def replace_front(self, other: "PublishedCache") -> None:
        """StreamingLLM: the sinks' keys, values and positions become ``other``'s (see ``KVCache.replace_front``)."""
        K = len(other)
        if not K or K > len(self):
            raise PosvizError(f"cannot put {K} entries at the front of a cache of {len(self)}")
        full = self._full_layers()
        for layer, source in zip(self.hf.layers, other.hf.layers):
            if any(layer is f for f in full):
                layer.keys = torch.cat((source.keys[..., -K:, :], layer.keys[..., K:, :]), dim=-2)
                layer.values = torch.cat((source.values[..., -K:, :], layer.values[..., K:, :]), dim=-2)
        self.positions = torch.cat((other.positions.to(self.positions.device), self.positions[K:]))
