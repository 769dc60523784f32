"""How one server serves many visitors: a bounded store of results shared by every session, and a
queue for heavy computations.

No Streamlit here (``views/_serving.py`` draws the waiting and the progress). Two pieces:

* ``SharedResults``: the result of a live computation, keyed on everything it depends on
  (checkpoint, its stamp, the text, the length, the options), computed **once per server**. The
  held-out documents are the same for every visitor, so after the first visitor the default view
  of every lab is a lookup. A key that another session is computing right now is *waited for*, not
  computed a second time (single flight: ten visitors who open a talk's link together cost one
  computation). Bounded twice, least recently used out first: ``max_entries`` and ``max_bytes``
  (the arrays a result holds, measured by ``result_bytes``). With ``files`` (``posviz.result_files``),
  a key missing from memory is looked up on disk before it is computed, and a result asked for with
  ``keep=True`` (the server's warm-up: every page's default view) is written there, so that a restarted
  server answers a talk's link without computing it again.
* ``WorkQueue``: at most ``slots`` heavy computations run at once, the others wait in arrival
  order and can say how many are ahead of them. On a 2-core CPU one forward pass already keeps both
  cores busy (torch's intra-op threads), so ten sessions that each start their own would only
  thrash the cores and the memory; in a queue each one finishes sooner than in the scrum.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict, deque
from contextlib import contextmanager
from typing import Callable, Hashable

import numpy as np
import torch

from posviz.limits import HEAVY_SLOTS, SHARED_RESULT_BYTES, SHARED_RESULT_ENTRIES


def result_bytes(value, _depth: int = 0) -> int:
    """Memory a result holds: arrays and tensors by their buffers, containers by their items.

    An estimate (object headers are counted roughly), good enough to bound a store of results that
    are mostly arrays and short lists of numbers."""
    if _depth > 6:
        return sys.getsizeof(value)
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + 112
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size()) + 80
    if isinstance(value, (bytes, bytearray, str)):
        return sys.getsizeof(value)
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(result_bytes(k, _depth + 1) + result_bytes(v, _depth + 1)
                                          for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sys.getsizeof(value) + sum(result_bytes(v, _depth + 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return 56 + sum(result_bytes(getattr(value, f.name), _depth + 1) for f in dataclasses.fields(value))
    if hasattr(value, "memory_usage") and hasattr(value, "columns"):  # a pandas DataFrame
        return int(value.memory_usage(deep=True).sum())
    return sys.getsizeof(value)


class _Flight:
    """A computation under way: other sessions asking for the same key wait on ``done``."""

    def __init__(self):
        self.done = threading.Event()
        self.ok = False


class SharedResults:
    """A thread-safe LRU of results bounded in entries and in bytes, computed once per key (see the
    module docstring). A result larger than ``max_bytes`` on its own is returned but not kept."""

    def __init__(self, max_entries: int = SHARED_RESULT_ENTRIES, max_bytes: int = SHARED_RESULT_BYTES,
                 files=None):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.files = files  # a posviz.result_files.ResultFiles, or None: memory only
        self._items: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._flights: dict[Hashable, _Flight] = {}
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[tuple[Hashable, object]]:
        """(key, result) of every result in memory, least recently used first (a copy)."""
        with self._lock:
            return [(key, value) for key, (value, _) in self._items.items()]

    def get(self, key: Hashable) -> tuple[bool, object]:
        """(True, value) when ``key`` is stored, in memory (it becomes the most recently used) or on disk
        (it is read into memory), else (False, None)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return True, self._items[key][0]
        found, value = self._read(key)
        if found:
            with self._lock:
                self.hits += 1
        return found, value

    def _read(self, key: Hashable) -> tuple[bool, object]:
        """``key``'s result from disk, kept in memory from then on (not written back)."""
        if self.files is None:
            return False, None
        found, value = self.files.get(key)
        if found:
            self._remember(key, value)
        return found, value

    def keep(self, key: Hashable, value) -> None:
        """Write ``key``'s result to disk unless it is there already (or there are no files)."""
        if self.files is not None and not self.files.has(key):
            self.files.put(key, value)

    def put(self, key: Hashable, value, keep: bool = False) -> None:
        self._remember(key, value)
        if keep:
            self.keep(key, value)

    def _remember(self, key: Hashable, value) -> None:
        size = result_bytes(value)
        with self._lock:
            if key in self._items:
                self.bytes -= self._items.pop(key)[1]
            if size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self.bytes += size
            while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped

    def get_or_compute(self, key: Hashable, compute: Callable[[], object],
                       on_wait: Callable[[], None] = lambda: None, poll_s: float = 0.25, keep: bool = False):
        """The stored value of ``key`` (in memory, else on disk), else ``compute()`` stored, computed by
        one caller at a time. ``keep``: also write the value to disk, found or computed.

        A caller that finds ``key`` being computed by another calls ``on_wait()`` every ``poll_s``
        while it waits (it may raise to stop waiting, as Streamlit does when the visitor moves on),
        then takes the stored value; if the other computation failed (its exception is not stored:
        bad input is re-checked on every run) or its value was too large to keep, it computes itself.
        """
        while True:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    self.hits += 1
                    value = self._items[key][0]
                    if keep:
                        self.keep(key, value)
                    return value
                flight = self._flights.get(key)
                if flight is None:
                    flight = self._flights[key] = _Flight()
                    break
            while not flight.done.wait(poll_s):
                on_wait()
            if not flight.ok:
                with self._lock:  # it failed or was stopped: the next caller computes
                    if self._flights.get(key) is flight:
                        del self._flights[key]
            else:
                with self._lock:
                    found = key in self._items
                    if found:
                        self._items.move_to_end(key)
                        self.hits += 1
                        value = self._items[key][0]
                if found:
                    if keep:
                        self.keep(key, value)
                    return value
                # computed but too large to keep: compute it ourselves (without a flight of our own)
                return compute()
        try:
            found, value = self._read(key)  # in this flight: others asking meanwhile wait for the read
            with self._lock:
                if found:
                    self.hits += 1
                else:
                    self.misses += 1
            if not found:
                value = compute()
                self._remember(key, value)
            if keep:
                self.keep(key, value)
            flight.ok = True
            return value
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.done.set()


class WorkQueue:
    """At most ``slots`` heavy computations at once; the rest wait in arrival order (first come, first
    served). A thread already holding a turn gets nested turns at once, so a computation that calls
    another queued one cannot deadlock on its own slot."""

    def __init__(self, slots: int = HEAVY_SLOTS):
        if slots < 1:
            raise ValueError(f"a work queue needs at least one slot, got {slots}")
        self.slots = slots
        self._cond = threading.Condition()
        self._waiting: deque[object] = deque()  # visitors' computations, in arrival order
        self._background: deque[object] = deque()  # work nobody waits for yet (warming the store)
        self._running = 0
        self._held = threading.local()
        self.served = 0

    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    def running(self) -> int:
        with self._cond:
            return self._running

    def _take(self, ticket, line: deque) -> bool:
        """Under the lock: start ``ticket`` if a slot is free and it is first in its line (background
        work only while no visitor waits)."""
        if line is self._background and self._waiting:
            return False
        if self._running < self.slots and line and line[0] is ticket:
            line.popleft()
            self._running += 1
            return True
        return False

    @contextmanager
    def turn(self, on_wait: Callable[[int], None] = lambda ahead: None, poll_s: float = 0.25,
             background: bool = False):
        """Wait for a slot, run the body, give the slot back (also when the body raises).

        While it waits, ``on_wait(ahead)`` is called every ``poll_s`` with the number of
        computations ahead of this one (those running plus those queued earlier); it is called
        outside the lock and may raise to leave the queue. ``background``: work that no visitor is
        waiting for; it starts only when no visitor's computation is waiting.
        """
        if getattr(self._held, "depth", 0):
            self._held.depth += 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        ticket, line = object(), self._background if background else self._waiting
        with self._cond:
            line.append(ticket)
        try:
            while True:
                with self._cond:
                    if self._take(ticket, line):
                        break
                    ahead = self._running + line.index(ticket) + (len(self._waiting) if background else 0)
                on_wait(ahead)
                with self._cond:  # checked again before sleeping: a slot freed meanwhile is not missed
                    if self._take(ticket, line) or (self._cond.wait(poll_s) and self._take(ticket, line)):
                        break
        except BaseException:
            with self._cond:
                if ticket in line:
                    line.remove(ticket)
                self._cond.notify_all()
            raise
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            with self._cond:
                self._running -= 1
                self.served += 1
                self._cond.notify_all()
