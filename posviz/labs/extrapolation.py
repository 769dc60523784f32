"""The numbers behind the Extrapolation lab: a text's loss at an evaluation length, live and as shipped.

No plotting and no Streamlit here (the page draws; ``bench`` times the same functions). The attention
maps the page shows next to the scores are in ``posviz.labs.attention_maps``; ``inspect_at_length`` gives
both from one forward pass when it can.

Conventions (shape legend as in ``model.py``: T bytes, H heads, L evaluation length):

* **Evaluation at a length L** runs *non-overlapping windows of L positions* over the text: window
  w reads bytes wL .. wL+L-1 and makes L predictions, of bytes wL+1 .. wL+L (the last one is the
  first byte of the next window, predicted with a full window of context). As many windows as fit
  in ``budget`` bytes, the device's length cap (``limits.max_eval_length``, 16 x train_length on a
  CPU), so every length costs about one forward pass over ``budget`` bytes and scores (nearly) the
  same bytes. It is the same quantity as the shipped bpb-vs-length curve (the same windows over
  131 kB). Only byte 0 has no prediction: its loss is NaN. The prediction at position i of a window
  sees i + 1 bytes, so the byte after a window starts is predicted from one byte of context.
* Losses are in bits (nats / ln 2); "bpb" is the mean bits per predicted byte.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from posviz.labs.attention_maps import AttentionView, _view_from_probs, as_drawn, attention_view, beside_view
from posviz.errors import PosvizError
from posviz.labs import intervals
from posviz.labs.scoring import position_losses
from posviz.labs.inputs import LN2
from posviz.models.interface import LabModel, open_model

# The checkpoints the lab scores when a visitor picked none: one of each kind of position method (none,
# absolute computed and learned, a fixed and a learned bias, rotation, a content gate), in the order of the
# story they tell past the training length. All eighteen pretrained ones took 2.4 s of forward passes at
# the training length on 2 cores (0.13 s each), most of a new server's first visit; these seven take about 0.9 s.
FIRST_VIEW = ("nope", "sinusoidal", "learned", "alibi", "fire", "rope", "fox")


@dataclass
class LengthScore:
    """Losses of non-overlapping windows of ``length`` ids over the first ``n_ids`` ids of a text."""

    length: int
    n_windows: int
    n_ids: int  # ids covered: n_windows * length inputs plus the id the last position predicts
    bpb: float  # bits per byte of the predicted ids' text
    position_bits: np.ndarray  # (length,) mean loss of the prediction made at each position of a window
    id_bits: np.ndarray  # (n_ids,) loss of each id in bits; NaN at id 0, which nothing predicts
    seconds: float


def windows_for(length: int, n_ids: int, budget: int) -> int:
    """How many non-overlapping windows of ``length`` fit in ``min(n_ids, budget)`` (at least one)."""
    return max(1, min(n_ids, budget) // length)


def single_window(length: int, n_ids: int, budget: int) -> bool:
    """Whether scoring a text of ``n_ids`` ids at ``length`` is one window: then an attention map's
    forward pass over the first ``length`` ids is the score's forward pass too."""
    return windows_for(length, n_ids - 1, budget) == 1


def _length_score(bits: np.ndarray, length: int, seconds: float, id_bytes: np.ndarray) -> LengthScore:
    """A LengthScore from the bits of every prediction, (n_windows, length); ``id_bytes``: the bytes each
    predicted id covers, so that bits per byte compare across tokenizers."""
    id_bits = np.concatenate(([np.nan], bits.reshape(-1)))  # id 0 has no context; id j is predicted at j-1
    bpb = float(bits.sum(dtype=np.float64) / id_bytes.sum())
    return LengthScore(int(length), bits.shape[0], bits.shape[0] * length + 1, bpb, bits.mean(axis=0), id_bits, seconds)


def _predicted_bytes(model: LabModel, ids: torch.Tensor, n: int) -> np.ndarray:
    """Bytes covered by ids 1..n (the predicted ones)."""
    return np.asarray(model.bytes_per_id(ids[1 : n + 1]))  # the ids as they are: no list of 65,536 ints per score


@torch.inference_mode()
def score_at_length(model: LabModel, ids, length: int, budget: int | None = None) -> LengthScore:
    """Bits per byte of ``ids`` at evaluation length ``length`` (see the module docstring).

    Raises PosvizError for a length past the cap or the text, and the model's own
    PositionLimitError when the method cannot represent the positions (learned past its table).
    """
    ids = model.ids_on_device(ids)
    length = model.checked(length, ids.numel())  # once per request: inner steps take it as checked
    budget = budget or model.length_cap
    n_windows = windows_for(length, ids.numel() - 1, budget)
    start = time.perf_counter()
    # the same code as the shipped curves: windows of `length` positions, each predicting the next byte
    bits = position_losses(model, ids[: n_windows * length + 1], length).numpy() / LN2  # (n, L)
    return _length_score(bits, length, time.perf_counter() - start, _predicted_bytes(model, ids, n_windows * length))


@torch.inference_mode()
def score_with_stride(model: LabModel, ids, length: int, stride: int, budget: int | None = None,
                      batch_tokens: int = 1 << 15) -> LengthScore:
    """Bits per byte of ``ids`` scored with sliding windows, as YaRN's and Press et al.'s evaluations do:
    windows of ``length`` ids start every ``stride`` ids; the first window's predictions all count, each
    later window's last ``stride`` only, so every id is predicted once and (past the first window) from at
    least ``length - stride`` ids of context. Over the first ``budget`` ids (the device cap), as
    ``score_at_length``; ``stride == length`` is exactly ``score_at_length``.

    ``position_bits``: the mean loss at each position of a window over the windows where it counts (the
    first window fills every position). ``n_windows``: windows run.
    """
    ids = model.ids_on_device(ids)
    length = model.checked(length, ids.numel())  # once per request: inner steps take it as checked
    if not isinstance(stride, (int, np.integer)) or not 1 <= stride <= length:
        raise PosvizError(f"The stride must be a whole number between 1 and the window ({length:,}), got {stride!r}.")
    budget = budget or model.length_cap
    span = min(ids.numel() - 1, budget)  # predictions available: of ids 1..span
    starts = list(range(0, span - length + 1, stride))  # at least one: check_length holds length + 1 <= ids
    n_pred = starts[-1] + length
    bits = np.full(n_pred, np.nan)
    pos_sum, pos_count = np.zeros(length), np.zeros(length)
    start_time = time.perf_counter()
    offsets = torch.arange(length, device=ids.device)
    k, per_batch = 0, 1  # the first window alone tells the vocabulary's size: then batches of at most 1 GiB of logits
    while k < len(starts):
        first = torch.tensor(starts[k : k + per_batch], device=ids.device)[:, None]
        rows = first + offsets  # (b, L) ids of each window
        logits = model(ids[rows]).logits.float()  # (b, L, V)
        lost = (F.cross_entropy(logits.transpose(1, 2), ids[rows + 1], reduction="none") / LN2).cpu().numpy()
        batch, k = starts[k : k + per_batch], k + per_batch
        per_batch = max(1, min(batch_tokens // length, (1 << 28) // (length * logits.shape[-1])))
        for s, row in zip(batch, lost):
            counted = 0 if s == 0 else length - stride  # positions before it were scored by an earlier window
            bits[s + counted : s + length] = row[counted:]
            pos_sum[counted:] += row[counted:]
            pos_count[counted:] += 1
    bpb = float(bits.sum(dtype=np.float64) / _predicted_bytes(model, ids, n_pred).sum())
    return LengthScore(int(length), len(starts), n_pred + 1, bpb, pos_sum / pos_count, np.concatenate(([np.nan], bits)),
                       time.perf_counter() - start_time)


def shipped_bpb_curve(model: LabModel) -> list[tuple[int, float | None]]:
    """The model's stored bpb vs length ([(length, bpb or None)], sorted); [] when absent."""
    table = model.stored_metrics().get("eval", {}).get("nonoverlapping_bpb", {})
    out = []
    for key, value in table.items():
        try:
            out.append((int(key), None if value is None else float(value)))
        except (TypeError, ValueError):
            continue
    return sorted(out)


def seed_band(model: LabModel) -> list[tuple[int, float, float, int]]:
    """[(length, lowest, highest, seeds)] of the stored bpb curve over the model's training seeds (its own run and
    each one ``stored_seeds`` holds), at the lengths where at least two seeds have a number; [] with one seed."""
    runs = [model.stored_metrics()] + model.stored_seeds()
    by_length: dict[int, list[float]] = {}
    for run in runs:
        table = run.get("eval", {}).get("nonoverlapping_bpb") if isinstance(run, dict) else None
        for key, value in (table if isinstance(table, dict) else {}).items():
            if isinstance(value, (int, float)) and str(key).isdigit():
                by_length.setdefault(int(key), []).append(float(value))
    return [(n, min(v), max(v), len(v)) for n, v in sorted(by_length.items()) if len(v) >= 2]


_INTERVALS: dict[tuple, dict[int, str]] = {}  # model key -> its intervals: the page asks on every run
_INTERVALS_KEPT = 64


def shipped_bpb_intervals(model: LabModel) -> dict[int, str]:
    """{length: "low–high (95 %, n windows)"}: how far each stored score moves with the evaluation windows (a
    bootstrap, ``labs.intervals``), for the lengths whose windows the model stored; {} when none. Computed
    once per model (about 30 ms of resampling each), then kept."""
    kept = _INTERVALS.get(model.key)
    if kept is not None:
        return kept
    stored = model.stored_metrics().get("eval", {}).get("nonoverlapping_window_bpb", {})
    out = {}
    for key, values in stored.items():
        if len(values) >= 2:
            low, high = intervals.mean_interval(values)
            out[int(key)] = f"{low:.3f}–{high:.3f} (95 %, {len(values)} windows)"
    if len(_INTERVALS) >= _INTERVALS_KEPT:
        _INTERVALS.clear()
    return _INTERVALS.setdefault(model.key, out)


def length_options(train_length: int, cap: int, minimum: int = 4) -> list[int]:
    """Slider stops from a few bytes to ``cap``: powers of two and the 1.5x steps between them."""
    stops = set()
    p = minimum
    while p <= cap:
        stops.add(p)
        if p * 3 // 2 <= cap and p >= 4:
            stops.add(p * 3 // 2)
        p *= 2
    stops.add(min(train_length, cap))
    stops.add(cap)
    return sorted(s for s in stops if minimum <= s <= cap)


# ---------------------------------------------------------------------------------------------
# Models of different units or trained contexts (a byte-level checkpoint next to a published model):
# one slider in multiples of each model's own trained context
# ---------------------------------------------------------------------------------------------
MULTIPLES = (0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)


def mixed_contexts(models: Sequence[LabModel]) -> bool:
    """Whether a length in ids means something else to some of ``models`` (``LabModel.id_axis``): then the lab
    compares them at the same multiple of their own context. Byte-level checkpoints share the byte axis
    (a fine-tuned one trained on 1,024 bytes next to the 256-byte ones)."""
    return len({m.id_axis for m in models}) > 1


def length_at_multiple(model: LabModel, multiple: float) -> int:
    """The evaluation length, in the model's ids, at ``multiple`` x its trained context."""
    return max(2, round(multiple * model.train_length))


def reach(model: LabModel, n_ids: int) -> int:
    """The longest evaluation length the model runs on a text of ``n_ids`` ids: its device cap and the text
    (a length L needs L + 1 ids)."""
    return min(model.length_cap, n_ids - 1)


def multiple_options(models: Sequence[LabModel], n_ids: Sequence[int]) -> list[float]:
    """Slider stops (multiples of each model's trained context) up to the furthest any model reaches here."""
    furthest = max(reach(m, n) / m.train_length for m, n in zip(models, n_ids))
    return [m for m in MULTIPLES if m <= furthest + 1e-9]


def cannot_run_at(model: LabModel, length: int, n_ids: int) -> str | None:
    """Why ``model`` cannot be scored at ``length`` ids on a text of ``n_ids`` ids, in a page's words; None
    when it can: its method (a learned table past its rows), its device cap, or the text."""
    problem = model.cannot_run(length)
    if problem:
        return problem
    unit, cap = model.unit, model.length_cap
    if length > cap:
        return f"{model.name} cannot run {length:,} {unit}s here: past its cap of {cap:,} {unit}s ({model.length_cap_reason})."
    if length + 1 > n_ids:
        return (f"{model.name} cannot run {length:,} {unit}s on this text: it is only {n_ids:,} {unit}s long. "
                "Paste a longer text.")
    return None


@torch.inference_mode()
def inspect_at_length(model: LabModel, ids, length: int, layer: int, log_scale: bool = True,
                      max_side: int = 512) -> tuple[LengthScore, AttentionView]:
    """``score_at_length`` and ``attention_view`` together, for the model a page inspects.

    When the text and the length cap hold a single window of ``length`` (always so at the cap,
    16 x train_length on a CPU), the map's forward pass over the first ``length`` bytes *is* the
    score's forward pass: it runs once and gives both. Otherwise the two run separately.
    """
    ids = model.ids_on_device(ids)
    length = model.checked(length, ids.numel())  # once per request: inner steps take it as checked
    if not single_window(length, ids.numel(), model.length_cap):
        return score_at_length(model, ids, length), attention_view(model, ids, length, layer, log_scale, max_side)
    start = time.perf_counter()
    out = model(ids[None, :length], attention_layer=layer)
    bits = (F.cross_entropy(out.logits[0].float(), ids[1:length + 1], reduction="none") / LN2).cpu().numpy()  # (L,)
    score = _length_score(bits[None], length, time.perf_counter() - start, _predicted_bytes(model, ids, length))
    view = _view_from_probs(as_drawn(model, layer, out.attention[0].float()), length, layer, log_scale, max_side,
                            start)  # pooled where it is
    view.kind = model.layer_kind(layer)
    return score, view


# ---------------------------------------------------------------------------------------------
# The lab's live computations as jobs: a key in the server's store of results and how to compute
# it. The page runs them for its visitor; ``warm_default_view`` runs the same ones ahead of time.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveJob:
    name: str  # what it computes: "extrapolation-score" (a dict of LengthScore), "-inspect" ((dict, AttentionView)), "-attention"
    key: tuple  # everything the result depends on: the model's key (identity and weights' stamp), text, length, options
    compute: Callable[[], object]


def score_job(model: LabModel, text: bytes, length: int) -> LiveJob:
    return LiveJob("extrapolation-score", model.key + (text, length),
                   lambda: dataclasses.asdict(score_at_length(model, model.tokenize(text).ids, length)))


def inspect_job(model: LabModel, text: bytes, length: int, layer: int, log_scale: bool) -> LiveJob:
    """Score and attention map from one forward pass (for a text that holds a single window)."""
    def compute():
        score, view = inspect_at_length(model, model.tokenize(text).ids, length, layer, log_scale=log_scale)
        return dataclasses.asdict(score), view

    return LiveJob("extrapolation-inspect", model.key + (text, length, layer, log_scale), compute)


def attention_job(model: LabModel, text: bytes, length: int, layer: int, log_scale: bool) -> LiveJob:
    return LiveJob("extrapolation-attention", model.key + (text, length, layer, log_scale),
                   lambda: attention_view(model, model.tokenize(text).ids, length, layer, log_scale=log_scale))


def beside_job(model: LabModel, text: bytes, length: int, layer: int, log_scale: bool) -> LiveJob:
    """The map of the mixer beside ``layer``'s attention (Falcon-H1's Mamba-2), as a job of the page."""
    return LiveJob("extrapolation-beside", model.key + (text, length, layer, log_scale),
                   lambda: beside_view(model, model.tokenize(text).ids, length, layer, log_scale=log_scale))


def stride_job(model: LabModel, text: bytes, length: int, stride: int) -> LiveJob:
    """``score_with_stride`` as a job of the page (a dict of LengthScore)."""
    return LiveJob("extrapolation-stride", model.key + (text, length, stride),
                   lambda: dataclasses.asdict(score_with_stride(model, model.tokenize(text).ids, length, stride)))


def scoring_job(model: LabModel, text: bytes, length: int, inspected: bool, layer: int, log_scale: bool) -> LiveJob:
    """The job that scores one model as the page does: the inspected one from its map's forward pass
    when the text holds a single window at this length (the map is then free), the others plainly."""
    if inspected and single_window(length, model.count_ids(text), model.length_cap):
        return inspect_job(model, text, length, layer, log_scale)
    return score_job(model, text, length)


def warm_default_view(results, queue, refs: Sequence[str | Path], text: bytes, log_scale: bool = True,
                      stop: threading.Event | None = None) -> int:
    """Compute the lab's default view (these checkpoints on this text, the first inspected at its last
    layer) at every slider stop, as background work of ``queue``, into ``results`` (a
    ``serving.SharedResults``): the training length first, then the longer stops, then the shorter.

    Visitors' computations go first (background work starts only when none waits), and a stop a
    visitor asks for meanwhile is computed once for both. A checkpoint that cannot reach a length
    (learned past its table) is skipped there. Returns the number of jobs run.
    """
    if not refs:
        return 0
    models = [open_model(ref) for ref in refs]
    train_length, layer = models[0].train_length, models[0].n_layer - 1
    cap = min(m.length_cap for m in models)
    stops = length_options(train_length, min(cap, len(text)))
    start = min(train_length, stops[-1])
    order = [start] + [n for n in stops if n > start] + [n for n in reversed(stops) if n < start]
    done = 0
    for length in order:
        for i in range(len(models)):
            if stop is not None and stop.is_set():
                return done
            job = scoring_job(models[i], text, length, i == 0, layer, log_scale)

            def run(job=job):
                with queue.turn(background=True):
                    return job.compute()

            try:
                results.get_or_compute((job.name, job.key), run)
                done += 1
            except PosvizError:
                continue
    return done
