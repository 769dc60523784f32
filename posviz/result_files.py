"""Live results kept on disk between server starts, keyed as the shared store keys them.

A newly started server used to compute every lab's default view for its first visitor (10–25 s on a
2-core CPU): a speaker's link opened on a restarted Space waited for it. The server's warm-up
(``views/_serving.warm_the_store``) computes the default views once; ``ResultFiles`` keeps what it
computed in a folder, one entry per key of ``posviz.serving.SharedResults``, so the next server reads
them back instead of computing them again (``SharedResults(files=...)``).

No pickle: an entry is ``<digest>.json`` (the value as a tagged JSON tree) and, when the value holds
arrays, ``<digest>.npz`` (numpy's own format, read with ``allow_pickle=False``). What the tree can hold,
each read back as it was written, bit for bit: None, bools, ints, floats (written with ``repr``, which
round-trips every double, NaN and the infinities included), strings, bytes, tuples, lists, sets, dicts,
numpy arrays and scalars (not of dtype object), torch tensors (on the CPU), dataclasses of
``posviz`` and pandas DataFrames whose columns are numbers, bools or strings. A value holding anything
else is not written (``Unstorable``) and stays in memory only.

A stored result is only valid for the code and the machine that made it: the keys name the
checkpoint's files and their stamps, the text and the settings, not the code that computed the
result or where it ran. So the folder holds one subfolder per *edition*: a digest of every source
file of ``posviz/`` and ``views/``, torch's version and the device type. A code change or a move to a
GPU starts a new edition; the stale ones are removed when the new one is first written.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib
import io
import json
import math
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Hashable

import numpy as np
import torch

FORMAT = 1  # the layout of an entry; a new one makes a new edition


class Unstorable(TypeError):
    """A value (or key) the files cannot hold exactly; it stays in memory only."""


# ---------------------------------------------------------------------------------------------
# Values as tagged JSON trees (every JSON object is a tag, so a plain dict is never mistaken for one)
# ---------------------------------------------------------------------------------------------
def encode(value, arrays: dict[str, np.ndarray]):
    """``value`` as a JSON-able tree; its arrays go into ``arrays`` under the names the tree refers to."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and type(value) is int:
        return value
    if type(value) is float:
        # repr round-trips every double; JSON has no NaN or infinities, so those go as text
        return value if math.isfinite(value) else {"float": repr(value)}
    if type(value) in (bytes, bytearray):
        return {type(value).__name__: base64.b64encode(bytes(value)).decode("ascii")}
    if type(value) is tuple:
        return {"tuple": [encode(v, arrays) for v in value]}
    if type(value) is list:
        return {"list": [encode(v, arrays) for v in value]}
    if type(value) in (set, frozenset):
        items = [encode(v, arrays) for v in value]
        return {type(value).__name__: sorted(items, key=lambda x: json.dumps(x, sort_keys=True))}
    if type(value) is dict:
        return {"dict": [[encode(k, arrays), encode(v, arrays)] for k, v in value.items()]}
    if isinstance(value, np.ndarray):
        return {"array": _add(arrays, _plain(value))}
    if isinstance(value, np.generic):
        return {"scalar": _add(arrays, _plain(np.asarray(value)))}
    if isinstance(value, torch.Tensor):
        if value.requires_grad or value.is_sparse or value.device.type != "cpu":
            raise Unstorable(f"a {value.device.type} tensor (requires_grad={value.requires_grad})")
        t = value.detach().contiguous()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its 16 bits, as they are
            return {"tensor": _add(arrays, t.view(torch.int16).numpy()), "dtype": "bfloat16"}
        return {"tensor": _add(arrays, _plain(t.numpy())), "dtype": str(t.dtype).removeprefix("torch.")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        if not cls.__module__.startswith("posviz.") or "<locals>" in cls.__qualname__:
            raise Unstorable(f"a dataclass from outside posviz: {cls.__module__}.{cls.__qualname__}")
        return {"dataclass": f"{cls.__module__}:{cls.__qualname__}",
                "fields": [[f.name, encode(getattr(value, f.name), arrays)] for f in dataclasses.fields(value)]}
    if _is_frame(value):
        return {"frame": _encode_frame(value, arrays)}
    raise Unstorable(f"a {type(value).__module__}.{type(value).__qualname__}")


def decode(node, arrays):
    """The value ``encode`` made ``node`` from; ``arrays`` maps the names it refers to to their arrays."""
    if not isinstance(node, dict):
        return node
    (tag, body), *rest = node.items()
    if tag == "float":
        return float(body)
    if tag in ("bytes", "bytearray"):
        return (bytes if tag == "bytes" else bytearray)(base64.b64decode(body))
    if tag == "tuple":
        return tuple(decode(v, arrays) for v in body)
    if tag == "list":
        return [decode(v, arrays) for v in body]
    if tag in ("set", "frozenset"):
        return (set if tag == "set" else frozenset)(decode(v, arrays) for v in body)
    if tag == "dict":
        return {decode(k, arrays): decode(v, arrays) for k, v in body}
    if tag == "array":
        return arrays[body]
    if tag == "scalar":
        return arrays[body][()]
    if tag == "tensor":
        dtype = node["dtype"]
        if dtype == "bfloat16":
            return torch.from_numpy(arrays[body].copy()).view(torch.bfloat16)
        return torch.from_numpy(arrays[body].copy())
    if tag == "dataclass":
        module, qualname = body.split(":")
        if not module.startswith("posviz."):
            raise Unstorable(f"a dataclass from outside posviz: {body}")
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        obj = object.__new__(cls)  # as it was, whatever its __init__ or __post_init__ would do
        for name, v in node["fields"]:
            object.__setattr__(obj, name, decode(v, arrays))
        return obj
    if tag == "frame":
        return _decode_frame(body, arrays)
    raise ValueError(f"unknown tag {tag!r} in a stored result")


def _add(arrays: dict, array: np.ndarray) -> str:
    name = f"a{len(arrays)}"
    arrays[name] = array
    return name


def _plain(array: np.ndarray) -> np.ndarray:
    if array.dtype.hasobject:
        raise Unstorable("an array of Python objects")
    return array


def _is_frame(value) -> bool:
    pd = sys.modules.get("pandas")  # a DataFrame can only exist once pandas is imported
    return pd is not None and isinstance(value, pd.DataFrame)


def _encode_frame(frame, arrays: dict) -> dict:
    """A DataFrame with a plain RangeIndex, its columns one by one: numbers and bools as arrays, strings
    (and None) as lists. Anything else (categories, dates, a MultiIndex) is Unstorable."""
    import pandas as pd

    if not isinstance(frame.index, pd.RangeIndex) or isinstance(frame.columns, pd.MultiIndex):
        raise Unstorable("a DataFrame with an index of its own")
    columns = []
    for name in frame.columns:
        column = frame[name]
        if column.dtype.kind in "biuf":
            columns.append({"array": _add(arrays, column.to_numpy(copy=True))})
        elif isinstance(column.dtype, pd.StringDtype):  # pandas 3's strings: missing ones are NaN or NA
            missing = column.isna().tolist()
            na = "nan" if column.dtype.na_value is not pd.NA else "NA"
            columns.append({"strings": [None if m else str(v) for v, m in zip(column.tolist(), missing)],
                            "storage": column.dtype.storage, "na": na})
        elif column.dtype == object and all(v is None or type(v) is str for v in column.tolist()):
            columns.append({"strings": column.tolist()})
        else:
            raise Unstorable(f"a DataFrame column of dtype {column.dtype}")
    index = frame.index
    return {"columns": [encode(c, arrays) for c in frame.columns], "data": columns,
            "index": [index.start, index.stop, index.step], "attrs": encode(dict(frame.attrs), arrays)}


def _decode_frame(body: dict, arrays) -> object:
    import pandas as pd

    names = [decode(c, arrays) for c in body["columns"]]
    data = {}
    for name, column in zip(names, body["data"]):
        if "array" in column:
            data[name] = arrays[column["array"]]
        elif "storage" in column:
            dtype = pd.StringDtype(column["storage"], na_value=np.nan if column["na"] == "nan" else pd.NA)
            data[name] = pd.Series(column["strings"], dtype=dtype)
        else:
            data[name] = pd.Series(column["strings"], dtype=object)
    frame = pd.DataFrame(data, columns=names, index=pd.RangeIndex(*body["index"]))
    frame.attrs.update(decode(body["attrs"], arrays))
    return frame


def key_digest(key: Hashable) -> str:
    """A file name for ``key``: the sha256 of its encoding (a key holds no arrays)."""
    arrays: dict = {}
    tree = encode(key, arrays)
    if arrays:
        raise Unstorable("a key with arrays in it")
    return hashlib.sha256(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# The folder
# ---------------------------------------------------------------------------------------------
def source_digest(roots=("posviz", "views"), base: Path | None = None) -> str:
    """A digest of every Python source under ``roots`` (the code that computes and keys the results)."""
    base = base or Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def edition(device: str) -> str:
    """The subfolder a result belongs to: the code, the format, torch's and transformers' versions (a release can
    change what a published model computes: Falcon's eager ALiBi, twice in 5.24 and once in 5.25) and the device
    type."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        library = version("transformers")
    except PackageNotFoundError:
        library = "none"
    return (f"{source_digest()}-f{FORMAT}-torch{torch.__version__}-transformers{library}-{device}"
            .replace("/", "_").replace("+", "_"))


class ResultFiles:
    """One edition's results in ``root/<edition>/`` (see the module docstring), at most ``max_bytes``."""

    def __init__(self, root: str | Path, device: str = "cpu", max_bytes: int = 1 << 30, edition_name: str | None = None):
        self.root = Path(root)
        self.folder = self.root / (edition_name or edition(device))
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._bytes: int | None = None  # what this edition holds, counted on the first write
        self._pruned = False
        self.reads = self.writes = 0
        self.unstorable: dict[str, str] = {}  # a result's name (its key's first item) -> why it was not written

    def _paths(self, key: Hashable) -> tuple[Path, Path]:
        digest = key_digest(key)
        return self.folder / f"{digest}.json", self.folder / f"{digest}.npz"

    def has(self, key: Hashable) -> bool:
        try:
            return self._paths(key)[0].is_file()
        except Unstorable:
            return False

    def get(self, key: Hashable) -> tuple[bool, object]:
        """(True, value) when ``key``'s entry is on disk and readable, else (False, None)."""
        try:
            meta_path, array_path = self._paths(key)
            meta = json.loads(meta_path.read_text())
        except (Unstorable, OSError, ValueError):
            return False, None
        try:
            if meta.get("format") != FORMAT:
                return False, None
            if meta.get("arrays"):
                with np.load(array_path, allow_pickle=False) as npz:
                    arrays = {name: npz[name] for name in npz.files}
            else:
                arrays = {}
            value = decode(meta["value"], arrays)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError, Unstorable):
            return False, None  # an entry from a broken write or another layout is computed again
        self.reads += 1
        return True, value

    def put(self, key: Hashable, value) -> bool:
        """Write ``value`` as ``key``'s entry (npz first, then the JSON that makes it visible); False when
        it cannot be held exactly, or the edition is full."""
        arrays: dict[str, np.ndarray] = {}
        try:
            meta_path, array_path = self._paths(key)
            meta = {"format": FORMAT, "value": encode(value, arrays), "arrays": bool(arrays)}
            text = json.dumps(meta, separators=(",", ":"), allow_nan=False)
        except Unstorable as exc:
            name = key[0] if isinstance(key, tuple) and key else repr(key)[:40]
            self.unstorable.setdefault(str(name), str(exc))
            return False
        with self._lock:
            try:
                self._prune_other_editions()
                self.folder.mkdir(parents=True, exist_ok=True)
                if self._bytes is None:
                    self._bytes = sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file())
                size = len(text)
                blob = None
                if arrays:
                    buffer = io.BytesIO()
                    np.savez(buffer, **arrays)
                    blob = buffer.getvalue()
                    size += len(blob)
                if self._bytes + size > self.max_bytes:
                    return False
                tmp = f".tmp-{os.getpid()}-{threading.get_ident()}"
                if blob is not None:
                    array_path.with_name(array_path.name + tmp).write_bytes(blob)
                    os.replace(array_path.with_name(array_path.name + tmp), array_path)
                meta_path.with_name(meta_path.name + tmp).write_text(text)
                os.replace(meta_path.with_name(meta_path.name + tmp), meta_path)
                self._bytes += size
            except OSError:  # the disk is full or the folder went away: the result stays in memory only
                self._bytes = None
                return False
            self.writes += 1
        return True

    def _prune_other_editions(self) -> None:
        """Under the lock, once: remove the root's other editions (made by other code or for another device)."""
        if self._pruned:
            return
        self._pruned = True
        if self.root.is_dir():
            for other in self.root.iterdir():
                if other.is_dir() and other != self.folder:
                    shutil.rmtree(other, ignore_errors=True)
