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
    # Keep what a layer without keys needs to draw its map of cached queries (a recurrent layer's keys, gates and
    # steps, which its state forgets): for the probes that ask for maps of a cached pass; a whole text, no window.
    for_maps: bool = False

    def __post_init__(self):
        if self.max_size is not None and not (isinstance(self.max_size, int) and self.max_size >= 1):
            raise PosvizError(f"KV cache max_size must be a positive integer or None, got {self.max_size!r}")
        check_sinks(self.sinks, self.max_size)
        if self.for_maps and self.max_size is not None:
            raise PosvizError("a KV cache kept for maps holds the whole text: it takes no max_size")
        self.keys = [None] * self.n_layer
        self.values = [None] * self.n_layer
        self._filled = [0] * self.n_layer  # entries of each buffer in use
        self._last = None  # last position written (int), so a step needs no read of ``positions``
        self.keys_are_run = True  # the kept positions are p0, p0+1, ... (attention's shortcuts need it)
        self._known = None  # the ``positions`` tensor _last and keys_are_run describe
        # (layer, name) -> (B, rows, D): the last rows a method's short causal convolution read (Canon layers, PaTH's
        # w), so that the next step's convolution sees the bytes before it; they follow the text, whatever is evicted
        self.recent: dict[tuple[int, str], torch.Tensor] = {}

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
        held = len(self)
        segments = _merged(other._segments_now() + _sliced(self._segments_now(), K, held))
        self.positions = torch.cat((other.positions.to(self.positions.device), self.positions[K:]))
        self._keep_segments(segments, self.positions)
        self._known = self.positions  # the newest position is unchanged: _last stands

    def shift_front(self, count: int, start: int, shift_keys) -> bool:
        """StreamingLLM without running the sinks again: the first ``count`` entries move to the positions
        ``start``, ``start + 1``, ...; ``shift_keys(layer, k, shift)`` gives a layer's keys as computed ``shift``
        positions later (values carry no position). Each move turns the keys the front held when it was first
        moved, by the whole distance, so that rounding does not build up over thousands of steps. Returns False,
        changing nothing, where ``shift_keys`` answers None (the method cannot: the ids must run again)."""
        held = len(self)
        if not count or count > held:
            raise PosvizError(f"cannot move {count} entries at the front of a cache of {held}")
        first = self._segments_now()[0]
        if first[1] < count:  # the front is not one run: nothing to turn from
            return False
        origin = getattr(self, "_front_origin", None)  # (its position, its keys, where the last move put it)
        if origin is None or origin[2] != first[0] or origin[1][0].shape[2] != count:
            keys = [self.keys[layer][:, :, self._filled[layer] - held:self._filled[layer] - held + count].clone()
                    for layer in range(self.n_layer)]
            origin = (first[0], keys, None)
        moved = []
        for layer in range(self.n_layer):
            k = shift_keys(layer, origin[1][layer], start - origin[0])
            if k is None:
                return False
            moved.append(k)
        for layer, k in enumerate(moved):
            n = self._filled[layer]
            self.keys[layer][:, :, n - held:n - held + count] = k
        segments = _merged([[start, count]] + _sliced(self._segments_now(), count, held))
        self.positions = torch.cat((torch.arange(start, start + count, device=self.positions.device),
                                    self.positions[count:]))
        self._keep_segments(segments, self.positions)
        self._known = self.positions  # the newest position is unchanged: _last stands
        self._front_origin = (origin[0], origin[1], start)
        return True

    def _segments_now(self) -> list[list[int]]:
        """The kept positions as runs [[start, count], ...], known in Python without reading the tensor back (a
        read waits for the GPU) when this cache set them; read once when a lab set them from outside."""
        if self.positions is None:
            return []
        if getattr(self, "_segments_of", None) is self.positions:
            return [list(r) for r in self._segments]
        start = run_start(self.positions)  # a noted run: no read
        return [[start, self.positions.numel()]] if start is not None else _runs(self.positions.tolist())

    def _keep_segments(self, segments: list[list[int]], positions: torch.Tensor) -> None:
        self._segments, self._segments_of = segments, positions
        self.keys_are_run = len(segments) <= 1
        if len(segments) == 1:
            mark_run(positions, segments[0][0])

    def _append_with_sinks(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor):
        """``append`` for a StreamingLLM window: a query sees the ``sinks`` first entries and the newest
        ``max_size - sinks`` keys ending at itself. One id at a time once the window is full. Which entries
        stay is worked out in Python (``_segments_now``), so a decoding step reads nothing back from a GPU."""
        T = k.shape[2]
        held = len(self)
        if layer == 0:
            if T > 1 and held + T > self.max_size and held > self.sinks:
                raise PosvizError("a StreamingLLM cache takes one id at a time once its window is full")
            p0 = run_start(pos)  # noted when the model made the positions: no read
            segments = self._segments_now() + ([[p0, T]] if p0 is not None else _runs(pos.tolist()))
            positions = pos if self.positions is None else torch.cat((self.positions, pos))
            total, self._keep = held + T, None
            if total > self.max_size:  # evict what lies between the sinks and the newest keys
                recent = self.max_size - self.sinks
                self._keep = torch.cat((torch.arange(self.sinks), torch.arange(total - recent, total)))
                segments = _sliced(segments, 0, self.sinks) + _sliced(segments, total - recent, total)
                positions = positions[self._keep.to(positions.device)]
            self._new_segments = _merged(segments)
            self._new_positions, self._new_is_run = positions, len(self._new_segments) == 1
            if self._new_is_run:
                mark_run(positions, self._new_segments[0][0])
            last = self._new_segments[-1]
            self._new_last = last[0] + last[1] - 1
        if self._keep is not None and T == 1 and held == self.max_size and self.keys[layer] is not None:
            # the steady state, one id into a full window: the oldest recent entry (right after the sinks) goes.
            # Written after the last entry, with the sinks moved one slot on over it, the window stays the buffer's
            # last ``held`` entries: K entries copied a step, not the whole window (room made as ``append`` does)
            self._make_room(layer, k, v, held)
            n, K = self._filled[layer], self.sinks
            a = n - held  # where the window starts in the buffer
            for buf, new in ((self.keys[layer], k), (self.values[layer], v)):
                buf[:, :, n:n + 1] = new
                buf[:, :, a + 1:a + 1 + K] = buf[:, :, a:a + K].clone()
            self._filled[layer] = n + 1
            keys, values = self.keys[layer][:, :, a + 1:n + 1], self.values[layer][:, :, a + 1:n + 1]
        else:
            n = self._filled[layer]
            keys = k if self.keys[layer] is None else torch.cat((self.keys[layer][:, :, n - held:n], k), dim=2)
            values = v if self.values[layer] is None else torch.cat((self.values[layer][:, :, n - held:n], v), dim=2)
            if self._keep is not None:
                keep = self._keep.to(keys.device)
                keys, values = keys[:, :, keep], values[:, :, keep]
            self.keys[layer], self.values[layer], self._filled[layer] = keys, values, keys.shape[2]
        k_pos = self._new_positions
        if layer == self.n_layer - 1:
            self.positions, self._last, self._known = k_pos, self._new_last, k_pos
            self._keep_segments(self._new_segments, k_pos)
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


def _runs(values: list[int]) -> list[list[int]]:
    """[[start, count], ...] of consecutive runs in ``values``."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][0] + out[-1][1] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def _sliced(segments: list[list[int]], a: int, b: int) -> list[list[int]]:
    """Entries a..b-1 of the positions ``segments`` describe, as segments."""
    out, at = [], 0
    for start, count in segments:
        lo, hi = max(a, at), min(b, at + count)
        if lo < hi:
            out.append([start + lo - at, hi - lo])
        at += count
    return out


def _merged(segments: list[list[int]]) -> list[list[int]]:
    """Adjacent segments that continue each other joined into one."""
    out: list[list[int]] = []
    for start, count in segments:
        if out and out[-1][0] + out[-1][1] == start:
            out[-1][1] += count
        elif count:
            out.append([start, count])
    return out
