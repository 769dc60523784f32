"""The server-wide store of live results and the queue of heavy computations (posviz.serving)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from posviz.serving import SharedResults, WorkQueue, result_bytes


def test_result_bytes_counts_the_arrays_a_result_holds():
    small = {"bpb": 1.0, "bits": np.zeros(10)}
    big = {"bpb": 1.0, "bits": np.zeros(100_000)}
    assert result_bytes(big) - result_bytes(small) == pytest.approx(8 * (100_000 - 10), rel=0.01)
    assert result_bytes((np.zeros((4, 512, 512), dtype=np.float32),)) >= 4 * 512 * 512 * 4


def test_store_is_bounded_in_entries_least_recently_used_out_first():
    store = SharedResults(max_entries=3, max_bytes=10**9)
    for k in "abc":
        store.put(k, k)
    assert store.get("a") == (True, "a")  # a is now the most recently used
    store.put("d", "d")
    assert store.get("b") == (False, None)
    assert [store.get(k)[0] for k in "acd"] == [True, True, True]
    assert len(store) == 3


def test_store_is_bounded_in_bytes():
    mb = np.zeros(2**20 // 8)  # 1 MiB
    store = SharedResults(max_entries=100, max_bytes=int(3.5 * 2**20))
    for k in range(5):
        store.put(k, {"a": mb.copy()})
    assert store.bytes <= 3.5 * 2**20
    assert [store.get(k)[0] for k in range(5)] == [False, False, True, True, True]
    store.put("huge", np.zeros(2**20))  # 8 MiB alone: returned to its caller, never kept
    assert store.get("huge") == (False, None)
    assert store.get(4)[0]


def test_concurrent_callers_of_one_key_compute_it_once():
    store, calls, started = SharedResults(), [], threading.Event()
    release = threading.Event()

    def compute():
        calls.append(1)
        started.set()
        release.wait(5)
        return "value"

    out, waits = [], []
    first = threading.Thread(target=lambda: out.append(store.get_or_compute("k", compute)))
    first.start()
    started.wait(5)
    others = [threading.Thread(target=lambda: out.append(store.get_or_compute("k", compute, on_wait=lambda: waits.append(1),
                                                                               poll_s=0.01)))
              for _ in range(5)]
    for t in others:
        t.start()
    time.sleep(0.1)
    release.set()
    for t in [first, *others]:
        t.join(5)
    assert out == ["value"] * 6
    assert len(calls) == 1
    assert waits, "the waiting callers were told they wait"
    assert store.get_or_compute("k", compute) == "value" and len(calls) == 1


def test_a_failed_computation_is_not_stored_and_the_next_caller_computes():
    store, calls = SharedResults(), []

    def fail():
        calls.append("fail")
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        store.get_or_compute("k", fail)
    assert store.get("k") == (False, None)
    assert store.get_or_compute("k", lambda: calls.append("ok") or 7) == 7
    assert calls == ["fail", "ok"]


def test_a_waiter_whose_computer_fails_computes_itself():
    store, gate = SharedResults(), threading.Event()

    def fail():
        gate.wait(5)
        raise RuntimeError("stopped")

    def first():
        with pytest.raises(RuntimeError):
            store.get_or_compute("k", fail)

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.05)
    threading.Timer(0.05, gate.set).start()
    assert store.get_or_compute("k", lambda: "mine", poll_s=0.01) == "mine"
    t.join(5)


def test_queue_runs_at_most_its_slots_at_once_in_arrival_order():
    queue, lock = WorkQueue(slots=1), threading.Lock()
    order, running, most = [], [0], [0]

    def job(i):
        with queue.turn(poll_s=0.01):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                order.append(i)
            time.sleep(0.02)
            with lock:
                running[0] -= 1

    threads = []
    for i in range(6):
        threads.append(threading.Thread(target=job, args=(i,)))
        threads[-1].start()
        time.sleep(0.005)  # arrive in order 0..5
    for t in threads:
        t.join(5)
    assert most[0] == 1
    assert order == list(range(6))
    assert queue.served == 6 and queue.running() == 0 and queue.waiting() == 0


def test_queue_tells_each_waiter_how_many_are_ahead_and_lets_a_waiter_leave():
    queue = WorkQueue(slots=1)
    hold, go_away, seen = threading.Event(), threading.Event(), {}

    def holder():
        with queue.turn():
            hold.wait(5)

    def waiter(name):
        def on_wait(ahead):
            seen.setdefault(name, []).append(ahead)
            if name == "leaver" and go_away.is_set():
                raise KeyboardInterrupt  # as Streamlit stops a script whose visitor moved on
        try:
            with queue.turn(on_wait, poll_s=0.01):
                pass
        except KeyboardInterrupt:
            seen[name].append("left")

    h = threading.Thread(target=holder)
    h.start()
    time.sleep(0.05)
    leaver = threading.Thread(target=waiter, args=("leaver",))
    leaver.start()
    time.sleep(0.05)
    second = threading.Thread(target=waiter, args=("second",))
    second.start()
    time.sleep(0.05)
    go_away.set()
    leaver.join(5)
    time.sleep(0.05)
    assert seen["leaver"][0] == 1 and seen["leaver"][-1] == "left"
    assert seen["second"][0] == 2  # the running one and the leaver, at first
    assert seen["second"][-1] == 1  # the leaver has gone
    hold.set()
    second.join(5)
    h.join(5)
    assert queue.waiting() == 0 and queue.running() == 0


def test_a_nested_turn_does_not_wait_for_its_own_slot():
    queue = WorkQueue(slots=1)
    done = []
    with queue.turn():
        with queue.turn(poll_s=0.01):  # one slot, already held by this thread
            done.append("nested")
        assert queue.running() == 1
    assert done == ["nested"]
    assert queue.running() == 0 and queue.served == 1


def test_a_queue_needs_a_slot():
    with pytest.raises(ValueError):
        WorkQueue(slots=0)


def test_background_work_starts_only_when_no_visitor_waits():
    queue, order, hold = WorkQueue(slots=1), [], threading.Event()

    def job(name, background):
        with queue.turn(poll_s=0.01, background=background):
            if name == "first":
                hold.wait(5)
            order.append(name)

    threads = [threading.Thread(target=job, args=("first", False))]
    threads[0].start()
    time.sleep(0.05)
    for name, background in (("warm 1", True), ("warm 2", True), ("visitor", False)):
        threads.append(threading.Thread(target=job, args=(name, background)))
        threads[-1].start()
        time.sleep(0.03)
    hold.set()
    for t in threads:
        t.join(5)
    assert order == ["first", "visitor", "warm 1", "warm 2"]
