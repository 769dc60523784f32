"""The text the live labs (Extrapolation, KV cache, Context extension, Far-context retrieval, Generation,
Compare) read, and what a page draws of per-byte losses. The models they run are ``posviz.models.interface``'s.

No plotting and no Streamlit here. Everything is capped by ``posviz.limits`` so a visitor cannot stall a server.

* A visitor's text becomes bytes through ``prepare_text`` (capped, with notices for anything odd); a
  model turns bytes into its own ids (``LabModel.encode``).
* ``characters_with_bits`` and ``moving_average`` turn per-byte losses into what a page draws.
* ``shared_unit``, ``unit_note`` and ``in_units`` say what a page's lengths are counted in: bytes for
  our checkpoints, tokens for a published model, "ids" for a mix of both.
* Losses are in bits (nats / ln 2); "bpb" is the mean bits per predicted byte.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from posviz.errors import PosvizError
from posviz.limits import MAX_TEXT_BYTES

LN2 = math.log(2.0)
Progress = Callable[[float], None]  # called with the fraction done, 0..1


def _no_progress(_: float) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TextInput:
    """A text as byte ids, with anything the user should be told about it."""

    ids: torch.Tensor  # (T,) int64 bytes
    notices: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.ids.numel())

    def as_bytes(self) -> bytes:
        return bytes(self.ids.tolist())


CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 13)) + b"\x7f"  # not text: tab, LF and CR are


def prepare_text(text: str | bytes, max_bytes: int = MAX_TEXT_BYTES) -> TextInput:
    """UTF-8 bytes of ``text``, cut to ``max_bytes``. Empty text is an error; oddities are notices.

    Any byte is a valid token for a byte-level model, so control characters are scored, not
    rejected; but the checkpoints were trained on Python source, so the user is told.
    """
    data = text.encode("utf-8", errors="surrogateescape") if isinstance(text, str) else bytes(text)
    if not data.strip():
        raise PosvizError("The text is empty. Paste at least a few lines of text, or pick a validation document.")
    notices = []
    if len(data) > max_bytes:
        notices.append(f"The text has {len(data):,} bytes; only the first {max_bytes:,} are used (the live labs' cap).")
        data = data[:max_bytes]
    control = len(data) - len(data.translate(None, CONTROL_BYTES))  # C speed: a page reads 64 kB on every rerun
    if control:
        notices.append(f"The text contains {control:,} non-text (control) bytes. They are scored like any other byte, "
                       "but the models were trained on Python source and will find them surprising.")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        notices.append("The text is not valid UTF-8; invalid bytes are shown as \ufffd but scored as they are.")
    return TextInput(torch.tensor(list(data), dtype=torch.long), tuple(notices))


def document_label(index: int, document: bytes) -> str:
    """A readable name for a validation document: its number, size and first meaningful line."""
    first = ""
    for line in document.decode("utf-8", errors="replace").splitlines():
        stripped = line.strip().strip("#").strip('"').strip("'").strip()
        if len(stripped) > 8 and not stripped.startswith(("!", "-*-", "coding")):
            first = stripped
            break
    first = first if len(first) <= 60 else first[:57] + "…"
    return f"#{index} · {len(document):,} bytes · {first}"


def characters_with_bits(ids: torch.Tensor | Sequence[int], byte_bits: np.ndarray) -> list[tuple[str, float]]:
    """Group bytes into UTF-8 characters, each with the bits of its bytes summed (NaN if none scored).

    A multi-byte character costs the sum of its bytes' losses; bytes that are not valid UTF-8 become
    one U+FFFD each, so every byte belongs to exactly one displayed character.
    """
    data = bytes(int(i) for i in ids)
    out, i = [], 0
    while i < len(data):
        lead = data[i]
        width = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
        chunk = data[i : i + width]
        try:
            char = chunk.decode("utf-8")
        except UnicodeDecodeError:
            char, width = "\ufffd", 1
        values = byte_bits[i : i + width]
        value = float(np.nansum(values)) if np.isfinite(values).any() else float("nan")
        out.append((char, value))
        i += width
    return out


def id_characters_with_bits(model, ids, id_bits: np.ndarray) -> list[tuple[str, float]]:
    """``characters_with_bits`` for ids of ``model``: each id's bits are shared equally among the bytes it
    covers, so a character costs its share of its token's loss (a byte model's: its byte's)."""
    ids = torch.as_tensor(ids).flatten()
    sizes, data = np.asarray(model.bytes_per_id(ids), dtype=np.int64), model.decode(ids)
    if len(data) != sizes.sum():  # a tokenizer whose ids do not decode one by one to their bytes: decode each
        pieces = [model.decode(ids[k : k + 1]) for k in range(ids.numel())]
        sizes, data = np.array([len(p) for p in pieces], dtype=np.int64), b"".join(pieces)
    per_byte = np.repeat(np.asarray(id_bits[: ids.numel()], dtype=float) / np.maximum(sizes, 1), sizes)
    return characters_with_bits(np.frombuffer(data, dtype=np.uint8), per_byte)


def moving_average(values: np.ndarray, width: int) -> np.ndarray:
    """Centred moving average that skips NaN; ``width`` <= 1 returns the values unchanged."""
    values = np.asarray(values, dtype=float)
    if width <= 1 or values.size == 0:
        return values
    finite = np.isfinite(values)
    kernel = np.ones(width)
    total = np.convolve(np.where(finite, values, 0.0), kernel, mode="same")
    count = np.convolve(finite.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


# ---------------------------------------------------------------------------------------------
# Units: what a page says an id is
# ---------------------------------------------------------------------------------------------
UNIT_SHORT = {"byte": "B", "token": "tok"}  # a unit in an axis title or a tooltip
UNIT_FOR_A_MIX = "id"  # checkpoints (bytes) next to published models (tokens): lengths in each one's own ids


def shared_unit(models: Iterable) -> str:
    """The unit the models' ids share ("byte" or "token"), "id" when they differ, "byte" for none: what a
    length or gap drawn for all of them is counted in."""
    units = {model.unit for model in models}
    return units.pop() if len(units) == 1 else ("byte" if not units else UNIT_FOR_A_MIX)


def unit_note(unit: str) -> str:
    """How to read a length in ``unit``, for a label: "bytes", "tokens", or what "ids" means in a mix."""
    return "ids: bytes for a checkpoint, tokens for a published model" if unit == UNIT_FOR_A_MIX else f"{unit}s"


def when_not_bytes(unit: str, words: str) -> str:
    """``words`` where a page's lengths are not bytes (a tokenizer's tokens, or ids of a mix), "" where they are:
    a label explains its unit only when it is not the bytes the page was written for."""
    return "" if unit == "byte" else words  # wording only: the one place a label asks what an id is


def in_units(words: str, unit: str) -> str:
    """``words`` written for bytes, said in ``unit``: "bytes" -> "tokens" (unchanged for "byte")."""
    return words.replace("bytes", f"{unit}s").replace("byte", unit)
