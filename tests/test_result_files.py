"""Results kept on disk between server starts (posviz.result_files): read back exactly as written, keyed
as the shared store keys them, never with pickle; the shared store reads them before it computes."""
from __future__ import annotations

import json
import math
import threading

import numpy as np
import pandas as pd
import pytest
import torch

from posviz.labs.extrapolation import LengthScore
from posviz.labs.generation import DecodeSettings
from posviz.result_files import ResultFiles, Unstorable, key_digest
from posviz.serving import SharedResults


def same(a, b) -> bool:
    """Equal, of the same types, to the last bit (NaN equal to NaN, -0.0 not equal to 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and (a == b or (math.isnan(a) and math.isnan(b)))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8),
                                                                         b.view(-1).view(torch.uint8))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(k, j) and same(a[k], b[j]) for k, j in zip(a, b))
    if isinstance(a, pd.DataFrame):
        return (list(a.columns) == list(b.columns) and list(a.dtypes) == list(b.dtypes) and a.index.equals(b.index)
                and all(same(a[c].to_numpy(), b[c].to_numpy()) if a[c].dtype.kind in "biuf"
                        else a[c].isna().tolist() == b[c].isna().tolist()
                        and a[c].dropna().tolist() == b[c].dropna().tolist() for c in a.columns)
                and a.attrs == b.attrs)
    if hasattr(a, "__dataclass_fields__"):
        return all(same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


VALUES = {
    "numbers": (0, -1, 2**80, 1.5, -0.0, float("nan"), float("inf"), -float("inf"), 1 / 3, 5e-324, True, None),
    "text": ("a", "", "ü\x00\n", b"\x00\xff bytes", bytearray(b"ab")),
    "containers": {"list": [1, [2, (3,)]], (1, "a"): {2.0: "x"}, "set": {1, 2}, "frozen": frozenset({"a"})},
    "arrays": [np.arange(7, dtype=np.int64), np.array([np.nan, -0.0, 1e-300], dtype=np.float64),
               np.ones((2, 3, 4), dtype=np.float32) / 3, np.array([True, False]), np.array(b"x"), np.zeros((0, 3)),
               np.asfortranarray(np.arange(6.0).reshape(2, 3))],
    "scalars": [np.float32(1 / 3), np.int16(-3), np.float64("nan"), np.bool_(True)],
    "tensors": [torch.arange(5) / 7, torch.tensor([1.5, -2.25], dtype=torch.bfloat16), torch.zeros(2, 2, dtype=torch.float16),
                torch.tensor([[1, 2]], dtype=torch.int64)],
    "dataclasses": [LengthScore(256, 3, 769, 1.25, np.linspace(0, 1, 256), np.r_[np.nan, np.ones(768)], 0.5),
                    DecodeSettings(64, 0.7, 40, 7, "stop")],
    "frame": pd.DataFrame({"length": [256, 512], "bpb": [1.5, float("nan")], "curve": ["rope", None], "ok": [True, False],
                           "objects": pd.Series(["a", None], dtype=object)}),
}


@pytest.mark.parametrize("name", VALUES)
def test_a_result_is_read_back_exactly_as_it_was_written(tmp_path, name):
    files = ResultFiles(tmp_path, edition_name="e")
    key = ("some-result", ("checkpoint", "/models/rope", (), 1, 2, 3), b"text", 1.0, (256, 512))
    assert files.put(key, VALUES[name])
    found, value = ResultFiles(tmp_path, edition_name="e").get(key)  # a new server: a new object on the same folder
    assert found and same(VALUES[name], value), (VALUES[name], value)


def test_entries_are_json_and_npz_never_pickle(tmp_path):
    files = ResultFiles(tmp_path, edition_name="e")
    assert files.put(("k",), {"bits": np.arange(3.0), "spec": {"mark": "line"}})
    entries = sorted(p.suffix for p in (tmp_path / "e").iterdir())
    assert entries == [".json", ".npz"]
    json.loads(next((tmp_path / "e").glob("*.json")).read_text())
    with np.load(next((tmp_path / "e").glob("*.npz")), allow_pickle=False) as npz:  # raises on a pickled array
        assert [npz[n].dtype for n in npz.files] == [np.float64]


@pytest.mark.parametrize("value", [np.array([object(), 1], dtype=object), lambda: 1, threading.Lock(),
                                   pd.DataFrame({"a": [1]}, index=[7]), {"nested": [object()]}])
def test_a_value_the_files_cannot_hold_exactly_is_not_written(tmp_path, value):
    files = ResultFiles(tmp_path, edition_name="e")
    assert not files.put(("chart", 1), value)
    assert "chart" in files.unstorable and not files.has(("chart", 1))
    assert files.get(("chart", 1)) == (False, None)


def test_keys_are_told_apart_by_type_and_are_stable():
    keys = [(1,), (1.0,), (True,), ("1",), (b"1",), ([1],), ((1,),), (1, 2), (2, 1)]
    assert len({key_digest(k) for k in keys}) == len(keys)
    assert key_digest(("a", (1, 2.5), b"x")) == key_digest(("a", (1, 2.5), b"x"))
    with pytest.raises(Unstorable):
        key_digest(("a", np.zeros(2)))


def test_a_new_edition_removes_the_stale_ones(tmp_path):
    old = ResultFiles(tmp_path, edition_name="old-code")
    assert old.put(("k",), 1)
    new = ResultFiles(tmp_path, edition_name="new-code")
    assert new.get(("k",)) == (False, None)  # results of other code are never read
    assert new.put(("k",), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new-code"]


def test_the_edition_names_the_code_and_the_device(tmp_path):
    cpu, cuda = ResultFiles(tmp_path, "cpu"), ResultFiles(tmp_path, "cuda")
    assert cpu.folder != cuda.folder and cpu.folder.name.endswith("-cpu")
    assert torch.__version__.replace("+", "_") in cpu.folder.name
    # and the transformers release: a stored published-model answer of another release is never read back
    import transformers

    assert f"-transformers{transformers.__version__}-" in cpu.folder.name


def test_an_edition_stops_growing_at_its_bound(tmp_path):
    files = ResultFiles(tmp_path, edition_name="e", max_bytes=20_000)
    assert files.put(("a",), np.zeros(1000))  # about 8 kB
    assert files.put(("b",), np.zeros(1000))
    assert not files.put(("c",), np.zeros(1000))
    assert files.has(("a",)) and files.has(("b",)) and not files.has(("c",))


def test_a_broken_entry_is_computed_again(tmp_path):
    files = ResultFiles(tmp_path, edition_name="e")
    assert files.put(("k",), {"bits": np.arange(3.0)})
    next((tmp_path / "e").glob("*.npz")).write_bytes(b"not an npz")
    assert files.get(("k",)) == (False, None)


def test_the_shared_store_reads_the_files_before_it_computes_and_writes_only_what_it_is_asked_to_keep(tmp_path):
    computed = []

    def compute(value):
        computed.append(value)
        return {"bits": np.full(4, value)}

    first = SharedResults(files=ResultFiles(tmp_path, edition_name="e"))
    first.get_or_compute(("default", 1), lambda: compute(1.0), keep=True)  # the warm-up: kept on disk
    first.get_or_compute(("visitor", 2), lambda: compute(2.0))  # a visitor's own setting: memory only
    first.get_or_compute(("found", 3), lambda: compute(3.0))
    first.get_or_compute(("found", 3), lambda: compute(-1.0), keep=True)  # found in memory by the warm-up: kept
    first.put(("put", 4), {"x": 4}, keep=True)
    assert computed == [1.0, 2.0, 3.0]

    restarted = SharedResults(files=ResultFiles(tmp_path, edition_name="e"))
    value = restarted.get_or_compute(("default", 1), lambda: compute(-1.0))
    assert same(value, {"bits": np.full(4, 1.0)}) and computed == [1.0, 2.0, 3.0]
    assert same(restarted.get(("found", 3))[1], {"bits": np.full(4, 3.0)})
    assert restarted.get(("put", 4)) == (True, {"x": 4})
    assert restarted.get(("visitor", 2)) == (False, None)
    assert restarted.misses == 0 and restarted.files.reads == 3
    assert ("default", 1) in dict(restarted.items())  # read once, then kept in memory


def test_without_files_the_store_is_memory_only():
    store = SharedResults()
    store.get_or_compute(("a",), lambda: 1, keep=True)
    store.put(("b",), 2, keep=True)
    assert store.files is None and store.get(("a",)) == (True, 1)


def test_a_folder_that_cannot_be_written_keeps_the_result_in_memory(tmp_path):
    """A full disk or a store folder removed under a running server: the page still gets its result."""
    blocker = tmp_path / "store"
    blocker.write_text("a file where the store's folder should be")  # mkdir under it fails with an OSError
    files = ResultFiles(blocker, edition_name="e")
    assert not files.put(("chart", 1), {"spec": 1}) and files.writes == 0
    store = SharedResults(files=files)
    assert store.get_or_compute(("chart", 2), lambda: 42) == 42
    assert store.get(("chart", 2)) == (True, 42)
