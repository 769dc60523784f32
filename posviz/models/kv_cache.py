"""The byte GPT's KV cache: keys, values and the positions they were computed at, per layer, optionally
kept to a sliding window of the newest ``max_size`` positions, or to StreamingLLM's window: the first
``sinks`` entries plus the newest ones (Xiao et al. 2024, https://arxiv.org/abs/2309.17453).

Shape legend as in ``byte_gpt``: B batch, H heads, Tk cached keys, hs head size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from posviz.errors import PosvizError
from posviz.positions.base import mark_run, run_start


@dataclass
class KVCache:
    """Keys and values per layer, with the absolute position each key was written at.

    ``max_size`` turns it into a sliding window: the oldest entries are dropped once it is full.
    Keys are cached *after* rotation, so a rotary key keeps the angle of the position it was seen at.

    Storage is one buffer per layer with room to spare: a step writes its keys after the last ones
    and the attention reads a view, so decoding does not copy the whole cache for every byte (a
    ``torch.cat`` per layer per step was a quarter of a cached step). When a window's buffer is
    full, the keys still needed move to its front, once every ``max_size`` or so steps.
    """

    n_layer: int
    max_size: int | None = None
    keys: list = field(default_factory=list)  # per layer: buffer (B, H, capacity, hs); see _filled
    values: list = field(default_factory=list)
    positions: torch.Tensor | None = None  # (Tk,) of the kept keys, shared by all layers
    sinks: int = 0  # StreamingLLM: the first entries, kept whatever the window evicts (needs max_size > sinks)

    def __post_init__(self):
        if self.max_size is not None and not (isinstance(self.max_size, int) and self.max_size >= 1):
            raise PosvizError(f"KV cache max_size must be a positive integer or None, got {self.max_size!r}")
        check_sinks(self.sinks, self.max_size)
        self.keys = [None] * self.n_layer
        self.values = [None] * self.n_layer
        self._filled = [0] * self.n_layer  # entries of each buffer in use
        self._last = None  # last position written (int), so a step needs no read of ``positions``
        self.keys_are_run = True  # the kept positions are p0, p0+1, ... (attention's shortcuts need it)
        self._known = None  # the ``positions`` tensor _last and keys_are_run describe

    def _sync(self) -> None:
        """Re-read _last and keys_are_run when ``positions`` was set from outside (a lab relabels it)."""
        if self.positions is not self._known:
            self._known = self.positions
            start = None if self.positions is None else run_start(self.positions)  # a noted run: no read
            self._last = None if self.positions is None else (
                start + self.positions.numel() - 1 if start is not None else int(self.positions[-1]))
            self.keys_are_run = self.positions is None or start is not None

    @property
    def attended_keys_are_run(self) -> bool:
        """Whether the keys of the step being appended (old and new) are a run: for attention, after append."""
        return self._new_is_run

    def next_position(self) -> int:
        """The position right after the last cached key (0 for an empty cache)."""
        self._sync()
        return 0 if self._last is None else self._last + 1

    def __len__(self) -> int:
        return 0 if self.positions is None else int(self.positions.numel())

    def _make_room(self, layer: int, k: torch.Tensor, v: torch.Tensor, keep: int) -> None:
        """Ensure the buffers can take ``k.shape[2]`` more entries after the last ``keep`` ones."""
        T, n, buf = k.shape[2], self._filled[layer], self.keys[layer]
        if buf is not None and n + T <= buf.shape[2]:
            return
        capacity = 2 * (keep + T) if self.max_size is None else 2 * (self.max_size + T)
        new_k = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
        new_v = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
        if buf is not None and keep:
            new_k[:, :, :keep] = buf[:, :, n - keep:n]
            new_v[:, :, :keep] = self.values[layer][:, :, n - keep:n]
        self.keys[layer], self.values[layer], self._filled[layer] = new_k, new_v, keep

    def replace_front(self, other: "KVCache") -> None:
        """StreamingLLM: the sinks' keys, values and positions become ``other``'s (the same first ids run again at
        the positions StreamingLLM gives them, right before the newest keys; see ``labs.kv_cache``)."""
        K = len(other)
        if not K or K > len(self):
            raise PosvizError(f"cannot put {K} entries at the front of a cache of {len(self)}")
        for layer in range(self.n_layer):
            n, held = self._filled[layer], len(self)
            front = slice(n - held, n - held + K)  # the kept entries are the last ``held`` of the buffer
            self.keys[layer][:, :, front] = other.keys[layer][:, :, other._filled[layer] - K:other._filled[layer]]
            self.values[layer][:, :, front] = other.values[layer][:, :, other._filled[layer] - K:other._filled[layer]]
        self.positions = torch.cat((other.positions, self.positions[K:]))

    def _append_with_sinks(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor):
        """``append`` for a StreamingLLM window: a query sees the ``sinks`` first entries and the newest
        ``max_size - sinks`` keys ending at itself. One id at a time once the window is full."""
        T, n = k.shape[2], self._filled[layer]
        if layer == 0:
            self._sync()
            held = len(self)
            if T > 1 and held + T > self.max_size and held > self.sinks:
                raise PosvizError("a StreamingLLM cache takes one id at a time once its window is full")
            self._new_positions = pos if self.positions is None else torch.cat((self.positions, pos))
            self._new_is_run = bool(run_start(self._new_positions) is not None)
            self._new_last = int(self._new_positions[-1])
            if self._new_is_run:
                mark_run(self._new_positions, self._new_last + 1 - self._new_positions.numel())
        held = len(self)
        old_k = None if self.keys[layer] is None else self.keys[layer][:, :, n - held:n]
        old_v = None if self.values[layer] is None else self.values[layer][:, :, n - held:n]
        keys = k if old_k is None else torch.cat((old_k, k), dim=2)
        values = v if old_v is None else torch.cat((old_v, v), dim=2)
        k_pos = self._new_positions
        if keys.shape[2] > self.max_size:  # evict what lies between the sinks and the newest keys
            keep = torch.cat((torch.arange(self.sinks), torch.arange(keys.shape[2] - self.max_size + self.sinks,
                                                                     keys.shape[2]))).to(keys.device)
            keys, values, k_pos = keys[:, :, keep], values[:, :, keep], k_pos[keep.to(k_pos.device)]
        self.keys[layer], self.values[layer], self._filled[layer] = keys, values, keys.shape[2]
        if layer == self.n_layer - 1:
            start = run_start(k_pos)
            self._new_is_run = start is not None
            if start is not None:
                mark_run(k_pos, start)
            self.positions, self.keys_are_run, self._last, self._known = k_pos, self._new_is_run, self._new_last, k_pos
        elif layer == 0:
            start = run_start(k_pos)
            self._new_is_run = start is not None
            if start is not None:
                mark_run(k_pos, start)
        return keys, values, k_pos

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor):
        """Add this step's keys/values; return the keys, values and key positions this step attends to.

        With a window, every query sees the ``max_size`` keys ending at itself (attention masks the
        older ones), so a chunk of T new queries needs the last ``max_size + T - 1`` keys although only
        the last ``max_size`` are kept: a chunk then gives exactly what feeding its bytes one by one gives.
        """
        if self.sinks:
            return self._append_with_sinks(layer, k, v, pos)
        T, n = k.shape[2], self._filled[layer]
        if layer == 0:  # positions are the same for every layer; update them once per step
            self._sync()
            self._new_positions = pos if self.positions is None else torch.cat((self.positions, pos))
            start = run_start(pos)
            self._new_is_run = start is not None and (self._last is None or (self.keys_are_run and start == self._last + 1))
            self._new_last = int(pos[-1]) if start is None else start + T - 1
            if self._new_is_run:  # so that nothing downstream reads the key positions back
                mark_run(self._new_positions, self._new_last + 1 - self._new_positions.numel())
        k_pos = self._new_positions
        keep = n if self.max_size is None else min(n, self.max_size - 1)  # old keys this step still needs
        if self.keys[layer] is not None and self.keys[layer].shape[:2] != k.shape[:2]:
            raise PosvizError(f"this KV cache holds batch x heads {tuple(self.keys[layer].shape[:2])}, "
                              f"got {tuple(k.shape[:2])}")
        self._make_room(layer, k, v, keep)
        n = self._filled[layer]
        keys, values = self.keys[layer], self.values[layer]
        keys.narrow(2, n, T).copy_(k)  # narrow + copy_: a slice assignment costs several times more per step
        values.narrow(2, n, T).copy_(v)
        self._filled[layer] = n = n + T
        needed = n if self.max_size is None else min(n, self.max_size + T - 1)
        k, v = keys.narrow(2, n - needed, needed), values.narrow(2, n - needed, needed)
        k_pos = k_pos[-needed:]
        if self._new_is_run:
            mark_run(k_pos, self._new_last + 1 - needed)
        if layer == self.n_layer - 1:
            self.positions = self._new_positions if self.max_size is None else self._new_positions[-self.max_size:]
            if self._new_is_run:
                mark_run(self.positions, self._new_last + 1 - self.positions.numel())
            self.keys_are_run, self._last, self._known = self._new_is_run, self._new_last, self.positions
        return k, v, k_pos


def check_sinks(sinks, max_size) -> None:
    """StreamingLLM's sinks: a whole number, and fewer than the window keeps."""
    if not isinstance(sinks, int) or sinks < 0:
        raise PosvizError(f"the number of sinks must be a whole number >= 0, got {sinks!r}")
    if sinks and (max_size is None or sinks >= max_size):
        raise PosvizError(f"{sinks} sinks need a window of more than {sinks} positions, got {max_size!r}")
