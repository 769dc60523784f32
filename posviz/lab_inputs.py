"""Plumbing shared by the live labs (Extrapolation, KV cache, Context extension, Far-context retrieval,
Generation, Compare): the text a lab reads, the models it runs, and the limits on both.

No plotting and no Streamlit here: pages turn the labs' results into charts, and ``posviz_tools.bench``
times the same functions. Everything is capped by ``posviz.limits`` so a visitor cannot stall a server.

* A text becomes byte ids through ``prepare_text`` (capped, with notices for anything odd);
  ``characters_with_bits`` and ``moving_average`` turn per-byte losses into what a page draws.
* Models come from a bounded LRU cache (``get_model``) keyed on the checkpoint folder, the position
  overrides, the device and the weights file's stamp, so a retrained checkpoint is reloaded.
* ``length_cap`` / ``check_eval_length``: the longest evaluation length a lab runs on this device
  (16 x train_length on a CPU) and the checks every lab applies before running one.
* Losses are in bits (nats / ln 2); "bpb" is the mean bits per predicted byte.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .checkpoint import WEIGHTS, load_checkpoint
from .errors import PosvizError
from .limits import CACHE_ENTRIES, MAX_TEXT_BYTES, default_device, max_eval_length
from .model import GPT

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
    control = sum(1 for b in data if b < 32 and b not in (9, 10, 13)) + data.count(127)
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
# Models: a bounded LRU cache keyed on (folder, position overrides, device, file stamp)
# ---------------------------------------------------------------------------------------------
_MODELS: OrderedDict[tuple, GPT] = OrderedDict()
_MODELS_LOCK = threading.Lock()


def checkpoint_stamp(folder: str | Path) -> int:
    """Changes whenever the weights file is rewritten, so a retrained checkpoint is reloaded."""
    path = Path(folder) / WEIGHTS
    return path.stat().st_mtime_ns if path.is_file() else 0


def _overrides_key(overrides: Mapping | None) -> tuple:
    return tuple(sorted((overrides or {}).items()))


def get_model(folder: str | Path, position_overrides: Mapping | None = None,
              device: str | torch.device | None = None) -> GPT:
    """Load a checkpoint once; later calls with the same arguments return the same model.

    At most ``CACHE_ENTRIES`` models are kept (least recently used dropped first). Models are in
    eval mode and must not be modified by callers.
    """
    device = torch.device(device) if device is not None else default_device()
    folder = Path(folder).resolve()
    key = (str(folder), _overrides_key(position_overrides), str(device), checkpoint_stamp(folder))
    with _MODELS_LOCK:
        if key in _MODELS:
            _MODELS.move_to_end(key)
            return _MODELS[key]
    model = load_checkpoint(folder, dict(position_overrides) if position_overrides else None, device=device)
    with _MODELS_LOCK:
        _MODELS[key] = model
        _MODELS.move_to_end(key)
        while len(_MODELS) > CACHE_ENTRIES:
            _MODELS.popitem(last=False)
    return model


def checkpoint_facts(folder: str | Path) -> dict:
    """What a page lays out its widgets with, from ``config.json`` alone: {train_length, n_layer, n_head,
    absolute, limit (positions the method has, None: any), cap (``length_cap`` on the default device)}.

    Why not ``get_model``: a page lists every shipped checkpoint, and loading all fourteen for these
    numbers was 0.6–1.4 s of a first visit that then runs two or three of them. A config that cannot
    be read or a missing weights file raises ``CheckpointError`` here; weights that are damaged
    otherwise raise when the model is first run, which the pages report for that model.
    """
    from .checkpoint import CONFIG, read_config
    from .config import ModelConfig
    from .errors import CheckpointError
    from .positions import ModelShape, build_position_method

    folder = Path(folder)
    config = read_config(folder)
    try:
        cfg = ModelConfig.from_dict(config.get("model") if isinstance(config.get("model"), dict) else {})
        position = build_position_method(cfg.position, ModelShape(cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd,
                                                                  cfg.train_length), cfg.position_options)
    except PosvizError as exc:
        raise CheckpointError(f"{folder / CONFIG}: {exc}") from exc
    if not (folder / WEIGHTS).is_file():
        raise CheckpointError(f"{folder / WEIGHTS}: file is missing.")
    return {"train_length": cfg.train_length, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "absolute": position.is_absolute, "limit": position.max_positions,
            "cap": max_eval_length(cfg.train_length, default_device())}


def cached_model_keys() -> list[tuple]:
    with _MODELS_LOCK:
        return list(_MODELS)


def clear_model_cache() -> None:
    with _MODELS_LOCK:
        _MODELS.clear()


def length_cap(model: GPT) -> int:
    """Longest live evaluation length for this model on its device (16 x train_length on a CPU)."""
    return max_eval_length(model.config.train_length, model.device)


def check_eval_length(model: GPT, length: int, n_bytes: int | None = None) -> None:
    """Reject lengths the lab will not run: too short, past the device cap, or longer than the text.

    A length the *method* cannot represent (learned past its table) is not rejected here: the model
    raises its own PositionLimitError, which the labs show as it is.
    """
    cap = length_cap(model)
    if not isinstance(length, (int, np.integer)) or length < 2:
        raise PosvizError(f"The evaluation length must be a whole number of at least 2 bytes, got {length!r}.")
    if length > cap:
        raise PosvizError(f"The evaluation length {length:,} is past this device's cap of {cap:,} bytes "
                          f"({cap // model.config.train_length} × the training length). Choose a shorter length.")
    if n_bytes is not None and length + 1 > n_bytes:
        raise PosvizError(f"The evaluation length {length:,} needs {length + 1:,} bytes of text, but the text has "
                          f"{n_bytes:,} bytes. "
                          "Choose a shorter length or a longer text.")


def _ids_on(model: GPT, ids) -> torch.Tensor:
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    return ids.to(model.device)
