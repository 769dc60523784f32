"""The scorer every lab and the evaluation share: bits per byte of non-overlapping windows (the ALiBi paper's
evaluation), each position's loss, and a strided sliding window. The labs and ``posviz.training.evaluate`` both read
it here, so that neither room imports the other for it.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from posviz.errors import PosvizError
from posviz.models.interface import CheckedLength, LabModel

if TYPE_CHECKING:  # the byte GPT itself (training) is scored too
    from posviz.models.byte_gpt import GPT

LN2 = math.log(2.0)


def as_id_tensor(data) -> torch.Tensor:
    """Ids (bytes for our checkpoints; a tensor, array or sequence of ints) as a flat (T,) LongTensor."""
    if isinstance(data, torch.Tensor):
        return data.long().flatten()
    return torch.as_tensor(np.asarray(data, dtype=np.int64)).flatten()


def check_length(length: int, n_bytes: int) -> None:
    """``length`` is the number of positions the model sees: a window needs length + 1 bytes. A length a lab
    already checked (``CheckedLength``) passes: the lab checked it against this text where the request entered."""
    if isinstance(length, CheckedLength):
        return
    if not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 2:
        raise PosvizError(f"evaluation length must be an integer of at least 2 bytes, got {length!r}")
    if length + 1 > n_bytes:
        raise PosvizError(f"evaluation length {length:,} needs {length + 1:,} bytes of text (inputs plus the next byte "
                          f"to predict), but the text has {n_bytes:,} bytes")


@torch.inference_mode()
def position_losses(model: LabModel | GPT, data, length: int, batch_tokens: int = 1 << 15, max_windows: int | None = None,
                    progress: bool = False) -> torch.Tensor:
    """Loss in nats of every prediction in non-overlapping windows of ``length`` positions.

    Returns (n_windows, length): row w, column i is the loss of predicting the id after position i
    of window w from the i + 1 ids before it *in its window* (the ALiBi paper's non-overlapping
    evaluation). The model sees positions 0 .. length-1, exactly as in training at that length. ``model``:
    any model a lab runs, or the byte GPT itself (training); ``data``: its ids.
    """
    data = as_id_tensor(data)
    check_length(length, data.numel())
    n_windows = (data.numel() - 1) // length
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    inputs = data[: n_windows * length].view(n_windows, length).to(model.device)  # (W, L)
    targets = data[1 : n_windows * length + 1].view(n_windows, length).to(model.device)  # (W, L)
    per_batch = max(1, batch_tokens // length)
    out = []
    for start in tqdm(range(0, n_windows, per_batch), disable=not progress, desc=f"L={length}", leave=False):
        logits = model(inputs[start : start + per_batch]).logits.float()  # (b, L, V)
        out.append(F.cross_entropy(logits.transpose(1, 2), targets[start : start + per_batch], reduction="none").cpu())
    return torch.cat(out)


def bits_per_byte(model: LabModel | GPT, data, length: int, **kw) -> float:
    return float(position_losses(model, data, length, **kw).mean()) / LN2


@torch.inference_mode()
def sliding_window_bpb(model: LabModel | GPT, data, window: int, stride: int, progress: bool = False,
                       id_bytes: np.ndarray | None = None) -> float:
    """Every id scored once, with up to ``window`` ids of context: windows advance by ``stride`` and only
    their last ``stride`` predictions count (the first window counts all of its own). Bits per byte of the
    text: ``id_bytes`` are the bytes each id of ``data`` covers (None: one each, ids are bytes)."""
    data = as_id_tensor(data)
    check_length(window, data.numel())
    if window >= data.numel():  # a window of W predictions needs W + 1 bytes
        raise PosvizError(f"a sliding window of {window:,} bytes needs at least {window + 1:,} bytes of text, "
                          f"got {data.numel():,}")
    if not isinstance(stride, (int, np.integer)) or not 1 <= stride <= window:
        raise PosvizError(f"stride must be an integer between 1 and the window ({window}), got {stride!r}")
    sizes = np.ones(data.numel(), dtype=np.int64) if id_bytes is None else np.asarray(id_bytes, dtype=np.int64)
    total, count = 0.0, 0
    last = data.numel() - window - 1  # start of the window that predicts the final byte
    starts = list(range(0, last, stride)) + [last]  # the last window scores the tail a stride would skip
    scored = 0  # bytes 1..scored already have a loss
    for s in tqdm(starts, disable=not progress, desc=f"sliding W={window} s={stride}", leave=False):
        chunk = data[s : s + window + 1].to(model.device)[None]
        logits = model(chunk[:, :-1]).logits.float()
        losses = F.cross_entropy(logits[0], chunk[0, 1:], reduction="none")  # predictions of bytes s+1..s+W
        first = max(scored - s, 0)
        total, count = total + float(losses[first:].sum()), count + int(sizes[s + 1 + first : s + window + 1].sum())
        scored = s + window
    return total / count / LN2
