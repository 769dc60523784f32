"""Byte-level corpus: the Python standard library of the running interpreter, or any folder of text.

The split is by file, decided by a hash of the file's path relative to the corpus root, so it is the
same on every machine with the same interpreter, and no validation file ever leaks into training.
Nothing is downloaded and no third-party text is stored in the repository.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sys
import sysconfig
from pathlib import Path

import numpy as np
import torch

from posviz.errors import PosvizError

# Folders of the standard library that are not "ordinary code": test suites (huge, repetitive) and
# third-party packages installed into the interpreter.
_EXCLUDED_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
DOC_SEPARATOR = b"\n\n"
VALIDATION_PERCENT = 5
LONG_DOCUMENT_BYTES = 8192  # evaluation documents must hold a 32 x 256 window on their own


def stdlib_root() -> Path:
    """This interpreter's standard library, or ``$POSVIZ_STDLIB``: another interpreter's, copied, so that a
    machine with another Python (a GPU machine, say) trains and evaluates on the very same bytes; then
    ``$POSVIZ_STDLIB_VERSION`` names its version in the corpus description."""
    return Path(os.environ.get("POSVIZ_STDLIB") or sysconfig.get_paths()["stdlib"])


def stdlib_version() -> str:
    return (os.environ.get("POSVIZ_STDLIB_VERSION") if os.environ.get("POSVIZ_STDLIB") else None) or sys.version.split()[0]


def is_validation(relative_path: str, percent: int = VALIDATION_PERCENT) -> bool:
    digest = hashlib.sha256(relative_path.replace(os.sep, "/").encode()).hexdigest()
    return int(digest[:8], 16) % 100 < percent


def _looks_like_text(data: bytes) -> bool:
    return b"\x00" not in data[:8192]


def corpus_files(root: Path, suffixes: tuple[str, ...] | None) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        # prune in place so site-packages (often larger than the library itself) is never walked
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_PARTS and not d.startswith("test_"))
        for name in sorted(filenames):
            if name.startswith("test_") or (suffixes is not None and Path(name).suffix not in suffixes):
                continue
            files.append(Path(dirpath) / name)
    return sorted(files)


@dataclasses.dataclass
class Corpus:
    train: np.ndarray  # uint8 bytes of every training file, joined by DOC_SEPARATOR
    validation: np.ndarray  # the same for the validation files
    eval_documents: list[bytes]  # validation files of at least LONG_DOCUMENT_BYTES, in path order
    description: dict

    def eval_stream(self, n_bytes: int) -> np.ndarray:
        """The first ``n_bytes`` of the long validation documents, joined: the evaluation text."""
        joined = DOC_SEPARATOR.join(self.eval_documents)
        if len(joined) < n_bytes:
            raise PosvizError(f"the validation documents hold only {len(joined):,} bytes; {n_bytes:,} were asked for")
        return np.frombuffer(joined[:n_bytes], dtype=np.uint8)


@functools.lru_cache(maxsize=4)
def load_corpus(folder: str | None = None, validation_percent: int = VALIDATION_PERCENT) -> Corpus:
    """Load the standard library (``folder=None``) or every text file under ``folder``."""
    if folder is None:
        root, suffixes, name = stdlib_root(), (".py",), f"Python {stdlib_version()} standard library (.py, no tests)"
    else:
        root, suffixes, name = Path(folder).expanduser().resolve(), None, f"text files under {folder}"
        if not root.is_dir():
            raise PosvizError(f"corpus folder {folder!r} does not exist or is not a folder")
    train, val, long_docs, n_train, n_val = [], [], [], 0, 0
    names = hashlib.sha256()
    for path in corpus_files(root, suffixes):
        data = path.read_bytes()
        if not data or not _looks_like_text(data):
            continue
        rel = path.relative_to(root).as_posix()
        names.update(rel.encode() + b"\0")
        if is_validation(rel, validation_percent):
            val.append(data)
            n_val += 1
            if len(data) >= LONG_DOCUMENT_BYTES:
                long_docs.append(data)
        else:
            train.append(data)
            n_train += 1
    if not train or not val:
        raise PosvizError(f"{name}: found {n_train} training and {n_val} validation files; need at least one of each")
    train_bytes = DOC_SEPARATOR.join(train)
    val_bytes = DOC_SEPARATOR.join(val)
    description = {
        "name": name,
        "root": str(root) if folder is not None else "stdlib",
        "train_files": n_train,
        "validation_files": n_val,
        "train_bytes": len(train_bytes),
        "validation_bytes": len(val_bytes),
        "long_validation_documents": len(long_docs),
        "validation_percent": validation_percent,
        "file_list_sha256": names.hexdigest()[:16],
    }
    return Corpus(np.frombuffer(train_bytes, np.uint8), np.frombuffer(val_bytes, np.uint8), long_docs, description)


def batch_offsets(n_bytes: int, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, n_bytes - length - 1, (batch_size,), generator=generator)


def begin_rows(x: torch.Tensor, y: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (B, T) that start with the byte ``first``: [first, x0 .. x_{T-2}] predicting [x0 .. x_{T-1}]."""
    return torch.cat((torch.full_like(x[:, :1], first), x[:, :-1]), 1), torch.cat((x[:, :1], y[:, :-1]), 1)


def get_batch(data: np.ndarray, offsets: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets, both (B, length), starting at ``offsets``."""
    rows = np.stack([data[o : o + length + 1] for o in offsets.tolist()]).astype(np.int64)
    rows = torch.from_numpy(rows)
    return rows[:, :-1], rows[:, 1:]


def plant_repeats(x: torch.Tensor, y: torch.Tensor, probability: float, min_bytes: int, max_bytes: int,
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy a span of each chosen row to a later place in the same row (inputs and targets alike).

    Why: a model learns to copy from its context (an induction head: a previous-byte head plus a
    matching head, Olsson et al. 2022) only once copying pays, and ordinary code repeats whole spans
    too rarely inside a 256-byte window for a small model to learn it in a CPU budget. A planted
    repeat makes copying pay in every chosen row, with any gap the window allows. Exactly the same
    draws for every method (``generator`` is the data order's), so the recipe stays one recipe.

    x, y: (B, T) inputs and next-byte targets of contiguous text (y is x shifted by one). The span
    of length L in [min_bytes, max_bytes] is taken from the row's text and written, whole, after it.
    """
    if probability <= 0:  # no draws either: a recipe without repeats keeps its data order
        return x, y
    B, T = x.shape
    draws = torch.rand(B, 4, generator=generator)  # for every row, so the stream never depends on the data
    row = torch.cat((x, y[:, -1:]), dim=1)  # (B, T+1): the text the row was cut from
    max_bytes = min(max_bytes, (T + 1) // 2)
    for b in range(B):
        chosen, u_len, u_src, u_dst = draws[b].tolist()
        if chosen >= probability:
            continue
        span = min_bytes + int(u_len * (max_bytes - min_bytes + 1))
        src = int(u_src * (T + 2 - 2 * span))  # the copy must fit after the source
        dst = src + span + int(u_dst * (T + 2 - 2 * span - src))
        row[b, dst:dst + span] = row[b, src:src + span].clone()
    return row[:, :-1], row[:, 1:]


def encode_text(text: str | bytes) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a (T,) LongTensor; bytes are taken as they are (any byte is a token)."""
    data = text.encode("utf-8", errors="surrogateescape") if isinstance(text, str) else bytes(text)
    if not data:
        raise PosvizError("the text is empty: paste at least one character, or pick a validation document")
    return torch.tensor(list(data), dtype=torch.long)

from posviz.labs.scoring import as_id_tensor  # noqa: E402,F401 (its home: the scorer every lab shares)


def decode_bytes(ids) -> str:
    """Text for display: invalid UTF-8 is shown with U+FFFD instead of failing."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def pack_stdlib(out: Path) -> dict:
    """Write this interpreter's corpus files (the standard library's, as ``load_corpus`` picks them) into the
    tar.xz ``out``, with its version in ``POSVIZ_VERSION``: unpacked elsewhere and named by ``$POSVIZ_STDLIB``,
    it is the same corpus on a machine with another Python."""
    import io
    import tarfile

    root = stdlib_root()
    with tarfile.open(out, "w:xz") as tar:
        for path in corpus_files(root, (".py",)):
            tar.add(path, arcname=path.relative_to(root).as_posix())
        version = stdlib_version().encode()
        info = tarfile.TarInfo("POSVIZ_VERSION")
        info.size = len(version)
        tar.addfile(info, io.BytesIO(version))
    return load_corpus().description


if __name__ == "__main__":  # python -m posviz.training.data --pack-stdlib FILE
    import argparse

    parser = argparse.ArgumentParser(description="The training corpus: describe it, or pack it for another machine.")
    parser.add_argument("--pack-stdlib", type=Path, help="write the standard library's corpus files to this .tar.xz")
    args = parser.parse_args()
    if args.pack_stdlib:
        print(pack_stdlib(args.pack_stdlib))
    else:
        print(load_corpus().description)
