"""Inference behind the live labs: run the real checkpoints on a text and return plain numbers.

No plotting and no Streamlit here: pages turn these results into charts, and ``bench_labs`` times
the same functions. Everything is capped by ``posviz.limits`` so a visitor cannot stall a server.

Conventions (shape legend as in ``model.py``: T bytes, H heads, L evaluation length, W window):

* **Evaluation at a length L** runs *non-overlapping windows of L positions* over the text: window
  w reads bytes wL .. wL+L-1 and makes L predictions, of bytes wL+1 .. wL+L (the last one is the
  first byte of the next window, predicted with a full window of context). As many windows as fit
  in ``budget`` bytes, the device's length cap (``limits.max_eval_length``, 16 x train_length on a
  CPU), so every length costs about one forward pass over ``budget`` bytes and scores (nearly) the
  same bytes. It is the same quantity as the shipped bpb-vs-length curve (the same windows over
  131 kB). Only byte 0 has no prediction: its loss is NaN. The prediction at position i of a window
  sees i + 1 bytes, so the byte after a window starts is predicted from one byte of context.
* Losses are in bits (nats / ln 2); "bpb" is the mean bits per predicted byte.
* **Sliding-window scoring** predicts byte t+1 from the W bytes ending at byte t, one byte at a time,
  as a text generator would. Three strategies, see ``STRATEGIES``.
"""
from __future__ import annotations

import math
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoint import WEIGHTS, load_checkpoint, read_config, read_metrics
from .errors import PosvizError, PositionLimitError
from .evaluate import position_losses, copy_probe
from .limits import (
    CACHE_ENTRIES,
    MAX_KV_CACHE_POSITIONS,
    MAX_SLIDING_BYTES,
    MAX_TEXT_BYTES,
    default_device,
    max_eval_length,
)
from .model import BLOCK_ELEMENTS, GPT, KVCache
from .positions import ModelShape, build_position_method
from .positions.alibi import alibi_slopes
from .positions.rope_scaling import ROPE_SCALINGS

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


# ---------------------------------------------------------------------------------------------
# Scoring a text at one evaluation length
# ---------------------------------------------------------------------------------------------
@dataclass
class LengthScore:
    """Losses of non-overlapping windows of ``length`` bytes over the first ``n_bytes`` of a text."""

    length: int
    n_windows: int
    n_bytes: int  # bytes covered: n_windows * length inputs plus the byte the last position predicts
    bpb: float  # mean bits per predicted byte
    position_bits: np.ndarray  # (length,) mean loss of the prediction made at each position of a window
    byte_bits: np.ndarray  # (n_bytes,) loss of each byte; NaN at byte 0, which nothing predicts
    seconds: float


def windows_for(length: int, n_bytes: int, budget: int) -> int:
    """How many non-overlapping windows of ``length`` fit in ``min(n_bytes, budget)`` (at least one)."""
    return max(1, min(n_bytes, budget) // length)


def single_window(length: int, text_bytes: int, budget: int) -> bool:
    """Whether scoring a text of ``text_bytes`` at ``length`` is one window: then an attention map's
    forward pass over the first ``length`` bytes is the score's forward pass too."""
    return windows_for(length, text_bytes - 1, budget) == 1


def _length_score(bits: np.ndarray, length: int, seconds: float) -> LengthScore:
    """A LengthScore from the bits of every prediction, (n_windows, length)."""
    byte_bits = np.concatenate(([np.nan], bits.reshape(-1)))  # byte 0 has no context; byte j is predicted at j-1
    return LengthScore(length, bits.shape[0], bits.shape[0] * length + 1, float(bits.mean()), bits.mean(axis=0),
                       byte_bits, seconds)


@torch.no_grad()  # not inference_mode: the position memo reads tensor versions
def score_at_length(model: GPT, ids, length: int, budget: int | None = None) -> LengthScore:
    """Bits per byte of ``ids`` at evaluation length ``length`` (see the module docstring).

    Raises PosvizError for a length past the cap or the text, and the model's own
    PositionLimitError when the method cannot represent the positions (learned past its table).
    """
    ids = _ids_on(model, ids)
    check_eval_length(model, length, ids.numel())
    budget = budget or length_cap(model)
    n_windows = windows_for(length, ids.numel() - 1, budget)
    start = time.perf_counter()
    # the same code as the shipped curves: windows of `length` positions, each predicting the next byte
    bits = position_losses(model, ids[: n_windows * length + 1], length).numpy() / LN2  # (n, L)
    return _length_score(bits, length, time.perf_counter() - start)


def shipped_bpb_curve(folder: str | Path) -> list[tuple[int, float | None]]:
    """The checkpoint's stored bpb vs length ([(length, bpb or None)], sorted); [] when absent."""
    try:
        table = read_metrics(folder).get("eval", {}).get("nonoverlapping_bpb", {})
    except PosvizError:
        return []
    out = []
    for key, value in table.items():
        try:
            out.append((int(key), None if value is None else float(value)))
        except (TypeError, ValueError):
            continue
    return sorted(out)


def train_length_of(folder: str | Path) -> int:
    return int(read_config(folder)["model"]["train_length"])


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
# Attention maps and their per-head summaries
# ---------------------------------------------------------------------------------------------
@torch.no_grad()  # not inference_mode: the position memo reads tensor versions
def attention_probs(model: GPT, ids, length: int, layer: int) -> torch.Tensor:
    """Attention probabilities of every head of ``layer`` over the first ``length`` bytes: (H, T, T), on CPU."""
    ids = _ids_on(model, ids)
    check_eval_length(model, length, ids.numel())
    out = model(ids[None, :length], attention_layer=layer)
    return out.attention[0].float().cpu()


def attention_stats_per_query(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head and query: attention distance sum_j p_ij (i - j) in bytes and entropy
    -sum_j p_ij log2 p_ij in bits. probs (H, T, T) causal. Returns two (H, T) tensors.

    One matrix-vector product and one elementwise pass: at 4,096 bytes the maps are 64 M entries
    a head, so anything that builds a (T, T) helper per head costs more than the forward pass.
    """
    probs = probs.float()
    H, T, Tk = probs.shape
    idx = torch.arange(Tk, dtype=torch.float32)
    # sum_j p_ij (i - j) = i * sum_j p_ij - sum_j p_ij j; rows of a causal softmax put no mass on j > i
    distance = torch.arange(T, dtype=torch.float32) * probs.sum(-1) - probs @ idx  # (H, T)
    # entr(p) = -p ln p (0 at p = 0), a block of rows at a time: a whole-map temporary would cost a
    # page-faulted allocation as large as the map (256 MB at 4,096 bytes) and twice the time
    flat, entropy = probs.reshape(H * T, Tk), torch.empty(H * T)
    rows = max(1, BLOCK_ELEMENTS // Tk)
    for r0 in range(0, H * T, rows):
        entropy[r0:r0 + rows] = torch.special.entr(flat[r0:r0 + rows]).sum(-1)
    return distance, entropy.view(H, T) / LN2


def attention_stats(probs: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per head: mean attention distance (bytes) and mean entropy (bits) over the queries: two (H,) arrays."""
    distance, entropy = attention_stats_per_query(probs)
    return distance.mean(-1).numpy().astype(float), entropy.mean(-1).numpy().astype(float)


def _pool_shape(h: int, w: int, max_side: int) -> tuple[int, int, int]:
    block = max(1, math.ceil(max(h, w) / max_side))
    return block, -(-h // block), -(-w // block)


def pool_matrix(matrix: np.ndarray | torch.Tensor, max_side: int) -> tuple[np.ndarray, int]:
    """Block-mean down to at most ``max_side`` a side, ignoring NaN; returns (matrix, block size).

    A block with no finite entry (fully masked) is NaN."""
    m = torch.as_tensor(np.asarray(matrix, dtype=np.float32) if not isinstance(matrix, torch.Tensor) else matrix,
                        dtype=torch.float32)
    h, w = m.shape
    block, nh, nw = _pool_shape(h, w, max_side)
    if block == 1:
        return m.double().numpy(), 1
    valid = ~torch.isnan(m)
    padded = F.pad(torch.where(valid, m, 0.0), (0, nw * block - w, 0, nh * block - h))
    counts = F.pad(valid.float(), (0, nw * block - w, 0, nh * block - h))
    sums = padded.view(nh, block, nw, block).sum((1, 3), dtype=torch.float64)
    counts = counts.view(nh, block, nw, block).sum((1, 3), dtype=torch.float64)
    return (sums / counts).numpy(), block  # 0 / 0 = NaN for fully masked blocks


def _causal_counts(T: int, block: int, n: int) -> torch.Tensor:
    """(n, n): how many (query i, key j <= i) pairs fall in each block x block cell of a (T, T) map."""
    i = torch.arange(T)
    starts = torch.arange(n) * block
    ends = (starts + block).clamp(max=T)
    per_row = ((i[:, None] + 1).clamp(max=ends[None, :]) - starts[None, :]).clamp(min=0)  # (T, n) keys seen in cell col
    per_row = F.pad(per_row, (0, 0, 0, n * block - T))
    return per_row.view(n, block, n).sum(1).double()


def pool_attention(probs: torch.Tensor, max_side: int) -> tuple[np.ndarray, int]:
    """Causal maps (H, T, T) block-averaged over their *visible* entries: (H, n, n) and the block size.

    The same numbers as ``pool_matrix(display_attention(p))`` per head (future keys do not count;
    fully masked cells are NaN) in one pass over all heads: masked entries are exactly 0, so the
    block sums need no masking and the number of visible entries per cell is known in advance.
    """
    H, T, _ = probs.shape
    block, n, _ = _pool_shape(T, T, max_side)
    if block == 1:
        return np.stack([display_attention(p, False) for p in probs]), 1
    probs = probs.float()
    if n * block != T:
        probs = F.pad(probs, (0, n * block - T, 0, n * block - T))
    sums = probs.view(H, n, block, n, block).sum((2, 4))  # (H, n, n); float32 is exact enough for <= block^2 terms
    return (sums.double() / _causal_counts(T, block, n)).numpy(), block


LOG_FLOOR = 1e-6  # probabilities below this are drawn as this: log10 range [-6, 0]


def display_attention(probs_2d: torch.Tensor | np.ndarray, log_scale: bool) -> np.ndarray:
    """(T, T) probabilities to the drawn values: masked (future) keys NaN; log10 when asked."""
    p = torch.as_tensor(np.asarray(probs_2d) if not isinstance(probs_2d, torch.Tensor) else probs_2d).double()
    future = torch.ones(p.shape, dtype=torch.bool).triu(1)
    p = p.masked_fill(future, float("nan"))
    if log_scale:
        p = torch.log10(p.clamp(min=LOG_FLOOR))  # NaN stays NaN
    return p.numpy()


@dataclass
class AttentionView:
    """What the Extrapolation lab draws for one layer at one length."""

    length: int
    layer: int
    maps: list[np.ndarray]  # per head, drawn values (log10 prob or prob), pooled to <= max_side
    block: int  # each drawn cell averages block x block attention entries
    distance: np.ndarray  # (H,) mean attention distance in bytes
    entropy: np.ndarray  # (H,) mean attention entropy in bits
    seconds: float
    query_distance: np.ndarray  # (H, T) per query, for prefix_growth
    query_entropy: np.ndarray


def _view_from_probs(probs: torch.Tensor, length: int, layer: int, log_scale: bool, max_side: int,
                     start: float) -> AttentionView:
    distance, entropy = attention_stats_per_query(probs)  # (H, T) each
    # Pool probabilities first (an average of probabilities means something), then take the log.
    pooled, block = pool_attention(probs, max_side)
    if log_scale:
        with np.errstate(invalid="ignore"):
            pooled = np.log10(np.clip(pooled, LOG_FLOOR, None))
    return AttentionView(length, layer, list(pooled), block, distance.mean(-1).numpy().astype(float),
                         entropy.mean(-1).numpy().astype(float), time.perf_counter() - start,
                         distance.numpy(), entropy.numpy())


def attention_view(model: GPT, ids, length: int, layer: int, log_scale: bool = True, max_side: int = 512) -> AttentionView:
    start = time.perf_counter()
    return _view_from_probs(attention_probs(model, ids, length, layer), length, layer, log_scale, max_side, start)


@torch.no_grad()  # not inference_mode: the position memo reads tensor versions
def inspect_at_length(model: GPT, ids, length: int, layer: int, log_scale: bool = True,
                      max_side: int = 512) -> tuple[LengthScore, AttentionView]:
    """``score_at_length`` and ``attention_view`` together, for the model a page inspects.

    When the text and the length cap hold a single window of ``length`` (always so at the cap,
    16 x train_length on a CPU), the map's forward pass over the first ``length`` bytes *is* the
    score's forward pass: it runs once and gives both. Otherwise the two run separately.
    """
    ids = _ids_on(model, ids)
    check_eval_length(model, length, ids.numel())
    if not single_window(length, ids.numel(), length_cap(model)):
        return score_at_length(model, ids, length), attention_view(model, ids, length, layer, log_scale, max_side)
    start = time.perf_counter()
    out = model(ids[None, :length], attention_layer=layer)
    bits = (F.cross_entropy(out.logits[0].float(), ids[1:length + 1], reduction="none") / LN2).cpu().numpy()  # (L,)
    score = _length_score(bits[None], length, time.perf_counter() - start)
    view = _view_from_probs(out.attention[0].float().cpu(), length, layer, log_scale, max_side, start)
    return score, view


def prefix_growth(view: AttentionView, lengths: Iterable[int]) -> list[dict]:
    """``attention_growth`` rows for lengths up to ``view.length``, read off the one long forward pass.

    In a causal model the first n queries of a forward over T >= n bytes attend exactly as a forward
    over those n bytes alone would (same positions 0..n-1, no key past n-1 visible), so the mean
    over the first n queries *is* the statistic at length n: one pass instead of one per length.
    (Not for length-dependent RoPE scaling such as dynamic NTK, whose frequencies change with T.)
    """
    rows = []
    for n in lengths:
        if not 1 <= n <= view.length:
            raise PosvizError(f"length {n} is outside 1..{view.length}, the lengths this view covers")
        d, e = view.query_distance[:, :n].mean(-1), view.query_entropy[:, :n].mean(-1)
        rows += [{"length": n, "head": h, "distance": float(d[h]), "entropy": float(e[h])} for h in range(len(d))]
    return rows


def growth_lengths(length: int, train_length: int, limit: int | None = None, minimum: int = 16) -> list[int]:
    """Lengths at which to summarise attention on the way to ``length``: powers of two, plus
    train_length and ``length`` itself; none past ``limit`` (the positions a method can represent)."""
    out = {length, min(train_length, length)}
    p = minimum
    while p < length:
        out.add(p)
        p *= 2
    return sorted(x for x in out if x >= min(minimum, length) and (limit is None or x <= limit))


def attention_growth(model: GPT, ids, lengths: Iterable[int], layer: int,
                     progress: Progress = _no_progress) -> list[dict]:
    """Rows {length, head, distance, entropy} for each length (one forward pass per length)."""
    lengths = list(lengths)
    rows = []
    for i, n in enumerate(lengths):
        distance, entropy = attention_stats(attention_probs(model, ids, n, layer))
        rows += [{"length": n, "head": h, "distance": float(distance[h]), "entropy": float(entropy[h])}
                 for h in range(len(distance))]
        progress((i + 1) / len(lengths))
    return rows


# ---------------------------------------------------------------------------------------------
# Sliding-window scoring with and without a KV cache
# ---------------------------------------------------------------------------------------------
STRATEGIES = ("reencode", "shifted_cache", "cached_window")
STRATEGY_TITLES = {
    "reencode": "Re-encode the window",
    "shifted_cache": "Shifted KV cache",
    "cached_window": "Cached window, true positions",
}
STRATEGY_HOW = {
    "reencode": "Every step runs the last W bytes again with positions 0..W-1. Always correct; costs a full "
                "forward pass of W bytes per generated byte.",
    "shifted_cache": "Keep the keys and values already computed, drop the oldest, and call the window 0..W-1 "
                     "again: the new byte gets position min(t, W-1). Fast, but every cached key keeps the "
                     "position it was computed at.",
    "cached_window": "Keep the cache (at most W entries) and give every byte its true position t. Distances "
                     "are right; absolute positions keep growing.",
}


def strategy_verdict(model: GPT, strategy: str) -> str:
    """What to expect from ``strategy`` for this model's position method, in one sentence."""
    pos = model.position
    name = model.config.position
    if strategy == "reencode":
        return "Correct for every method: positions are always 0..W-1, as in training."
    if strategy == "shifted_cache":
        if pos.acts_on == "nothing":
            return "Correct: NoPE has no positions, so relabelling the window changes nothing."
        if pos.acts_on == "logits":
            return (f"Correct: {name} adds its bias at attention time from the positions, and shifting every "
                    "position by one keeps every distance.")
        return (f"Broken: {name} baked each key's position in when it was computed ({pos.acts_on}), so cached keys "
                "disagree with the positions the window now claims.")
    if strategy == "cached_window":
        if model.position.max_positions is not None:
            return (f"Cannot run past byte {model.position.max_positions:,}: the {name} table has no rows for "
                    "later positions.")
        if pos.is_absolute:
            return (f"Runs, but {name} then sees absolute positions it never saw in training (up to the document "
                    "length), as in the Extrapolation lab past the training length.")
        return "Correct: only distances matter and they are the true ones (0..W-1)."
    raise PosvizError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


@dataclass
class SlidingResult:
    strategy: str
    window: int
    bpb: float | None  # over every prediction; None when the method cannot run this strategy
    bpb_full: float | None  # over predictions made after the first eviction (t >= W), where strategies differ
    ms_per_byte: float
    n_scored: int  # predictions made (bytes 1..n)
    byte_bits: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))  # (n_scored,)
    error: str | None = None


def check_sliding(model: GPT, ids: torch.Tensor, window: int, n_bytes: int | None) -> int:
    n = ids.numel() if n_bytes is None else min(n_bytes, ids.numel())
    if n < 2:
        raise PosvizError("Sliding-window scoring needs a text of at least 2 bytes.")
    if n > MAX_SLIDING_BYTES:
        raise PosvizError(f"Sliding-window scoring is capped at {MAX_SLIDING_BYTES:,} bytes (one forward pass per "
                          f"byte); {n:,} were asked for.")
    if not 2 <= window <= MAX_KV_CACHE_POSITIONS:
        raise PosvizError(f"The window must be between 2 and {MAX_KV_CACHE_POSITIONS:,} bytes, got {window}.")
    return n


def _sync(model: GPT) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()  # not inference_mode: the position memo reads tensor versions
def sliding_score(model: GPT, ids, window: int, strategy: str, n_bytes: int | None = None,
                  progress: Progress = _no_progress, one_pass_prefix: bool = True) -> SlidingResult:
    """Score bytes 1..n-1 of ``ids`` one at a time, each from (at most) the ``window`` bytes ending
    just before it, under ``strategy`` (see STRATEGY_HOW).

    Until the window is full nothing is evicted and every strategy sees the same bytes at the same
    positions, so with ``one_pass_prefix`` those first ``window`` predictions come from one forward
    pass (which also fills the cache); only the steps after it run byte by byte. ``ms_per_byte``
    times those steady-state steps, where the strategies differ in cost.
    """
    if strategy not in STRATEGIES:
        raise PosvizError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    ids = _ids_on(model, ids)
    n = check_sliding(model, ids, window, n_bytes)
    dev = model.device
    steps = n - 1
    bits = np.full(steps, np.nan)
    fresh_cache = lambda: KVCache(model.config.n_layer, max_size=window) if strategy != "reencode" else None
    cache = fresh_cache()
    error = None
    every = max(1, steps // 50)
    first = 0  # the first step run byte by byte
    _sync(model)
    start = time.perf_counter()
    if one_pass_prefix:
        m = min(window, steps)  # steps 0..m-1 predict bytes 1..m from the whole prefix
        try:
            logits = model(ids[None, :m], cache=cache).logits[0].float()  # (m, V)
            bits[:m] = (F.cross_entropy(logits, ids[1:m + 1], reduction="none") / LN2).cpu().numpy()
            first = m
        except PositionLimitError:  # the method cannot hold the window: step, to say where it stops
            cache = fresh_cache()
        progress(first / steps)
    _sync(model)
    loop_start = time.perf_counter()
    for t in range(first, steps):  # step t predicts byte t + 1 from bytes up to t
        try:
            if strategy == "reencode":
                logits = model(ids[None, max(0, t - window + 1) : t + 1]).logits[0, -1]
            elif strategy == "cached_window":
                logits = model(ids[None, t : t + 1], positions=torch.tensor([t], device=dev), cache=cache).logits[0, -1]
            else:
                p = min(t, window - 1)
                held = len(cache)
                if held:
                    # Relabel the window so that it ends just before p; cached keys keep what they baked in.
                    cache.positions = torch.arange(p - held, p, device=dev)
                logits = model(ids[None, t : t + 1], positions=torch.tensor([p], device=dev), cache=cache).logits[0, -1]
        except PositionLimitError as exc:
            error = f"Stopped at byte {t:,}: {exc}"
            break
        bits[t] = float(F.cross_entropy(logits.float()[None], ids[t + 1 : t + 2])) / LN2
        if t % every == 0:
            progress((t + 1) / steps)
    _sync(model)
    end = time.perf_counter()
    progress(1.0)
    done = int(np.isfinite(bits).sum())
    stepped = done - first
    seconds, per = (end - loop_start, stepped) if stepped > 0 else (end - start, max(1, done))
    full = bits[window:]  # step t >= W: the window has evicted at least one byte
    return SlidingResult(strategy, window, None if error else float(np.nanmean(bits)),
                         None if error or full.size == 0 else float(full.mean()),
                         1000 * seconds / per, done, bits, error)


def two_pass_diagram(window: int, t: int | None = None) -> list[dict]:
    """Which position each byte of the window holds in pass t and pass t+1, per strategy.

    Rows: {strategy, pass ("t" or "t+1"), byte (index in the document), position (what attention
    uses in this pass), baked (the position the byte's cached key was computed at, or the same
    as position when it is recomputed), recomputed (bool), consistent (position == baked or the
    method adds positions only at attention time)}. ``t`` defaults to a step well after the window is full.
    """
    if window < 2:
        raise PosvizError("the diagram needs a window of at least 2 bytes")
    t = 2 * window if t is None else t
    if t < window:
        raise PosvizError("draw the diagram for a step after the window is full (t >= window)")
    rows = []
    for strategy in STRATEGIES:
        for label, step in (("t", t), ("t+1", t + 1)):
            first = step - window + 1
            for j in range(first, step + 1):
                slot = j - first  # 0..W-1 inside the window
                if strategy == "reencode":
                    position, baked, recomputed = slot, slot, True
                elif strategy == "shifted_cache":
                    # Once the window is full every new byte is computed at W-1 and then slides left.
                    position, baked, recomputed = slot, window - 1 if j >= window - 1 else j, j == step
                else:
                    position, baked, recomputed = j, j, j == step
                rows.append({"strategy": strategy, "pass": label, "byte": j, "position": position, "baked": baked,
                             "recomputed": recomputed, "consistent": position == baked})
    return rows


@torch.no_grad()  # not inference_mode: the position memo reads tensor versions
def cache_check(model: GPT, ids, length: int, time_reencode: bool = True,
                progress: Progress = _no_progress) -> dict:
    """Cached byte-by-byte decoding vs one full forward pass over the first ``length`` bytes.

    Returns {max_abs_diff (largest logit difference), full_ms (one forward of ``length``),
    cached_ms_per_byte, reencode_ms_per_byte (re-running the whole prefix per byte, or None),
    length}. For T5 this shows a relative bias works with a KV cache: the bias is looked up from
    the query's and each cached key's positions, so nothing needs recomputing.
    """
    ids = _ids_on(model, ids)
    if not 2 <= length <= min(ids.numel(), MAX_KV_CACHE_POSITIONS):
        raise PosvizError(f"The cache check length must be between 2 and {min(ids.numel(), MAX_KV_CACHE_POSITIONS):,} "
                          f"bytes (the text and the {MAX_KV_CACHE_POSITIONS:,}-position cache cap), got {length}.")
    x = ids[None, :length]
    model(x[:, :8])  # warm up kernels so the first timing is not an outlier
    _sync(model)
    start = time.perf_counter()
    full = model(x).logits[0].float()
    _sync(model)
    full_ms = 1000 * (time.perf_counter() - start)
    cache = KVCache(model.config.n_layer)
    rows = []
    start = time.perf_counter()
    for t in range(length):
        rows.append(model(x[:, t : t + 1], cache=cache).logits[0, -1].float())
        if t % max(1, length // 25) == 0:
            progress(0.5 * (t + 1) / length if time_reencode else (t + 1) / length)
    _sync(model)
    cached_ms = 1000 * (time.perf_counter() - start) / length
    diff = float((torch.stack(rows) - full).abs().max())
    reencode_ms = None
    if time_reencode:
        start = time.perf_counter()
        for t in range(length):
            model(x[:, : t + 1])
            if t % max(1, length // 25) == 0:
                progress(0.5 + 0.5 * (t + 1) / length)
        _sync(model)
        reencode_ms = 1000 * (time.perf_counter() - start) / length
    progress(1.0)
    return {"length": length, "max_abs_diff": diff, "logit_scale": float(full.abs().max()), "full_ms": full_ms,
            "cached_ms_per_byte": cached_ms, "reencode_ms_per_byte": reencode_ms}


# ---------------------------------------------------------------------------------------------
# RoPE context extension
# ---------------------------------------------------------------------------------------------
def scaling_overrides(scaling: str, factor: float) -> dict:
    """Position overrides that apply ``scaling`` at ``factor`` to the rope checkpoint."""
    if scaling not in ROPE_SCALINGS:
        raise PosvizError(f"Unknown RoPE scaling {scaling!r}. Known scalings: {', '.join(ROPE_SCALINGS)}.")
    if scaling == "none":
        return {}
    return {"scaling": scaling, "factor": float(factor)}


def extension_lengths(train_length: int, cap: int, n_bytes: int) -> list[int]:
    """train_length x 1, 2, 4, ... up to the device cap and the text."""
    out, n = [], train_length
    while n <= min(cap, n_bytes):
        out.append(n)
        n *= 2
    return out


def rope_scaling_curves(folder: str | Path, factor: float, ids, lengths: Sequence[int],
                        scalings: Sequence[str] | None = None, progress: Progress = _no_progress) -> list[dict]:
    """Rows {scaling, factor, length, bpb} for the rope checkpoint under each scaling at ``factor``."""
    scalings = list(ROPE_SCALINGS) if scalings is None else list(scalings)
    rows, total, done = [], len(scalings) * len(lengths), 0
    for scaling in scalings:
        model = get_model(folder, scaling_overrides(scaling, factor) or None)
        for n in lengths:
            score = score_at_length(model, ids, n)
            rows.append({"scaling": scaling, "factor": 1.0 if scaling == "none" else float(factor), "length": n,
                         "bpb": score.bpb})
            done += 1
            progress(done / total)
    return rows


def shipped_scaling_curves(folder: str | Path) -> list[dict]:
    """Rows {scaling, length, bpb, factor} from the rope checkpoint's metrics.json (static scalings
    were stored at factor = length / train_length, dynamic at 2)."""
    try:
        ev = read_metrics(folder).get("eval", {})
    except PosvizError:
        return []
    rows = [{"scaling": "none", "length": int(n), "bpb": v, "factor": 1.0}
            for n, v in ev.get("nonoverlapping_bpb", {}).items() if v is not None]
    for scaling, block in ev.get("rope_scalings", {}).items():
        factors = block.get("factor", {})
        for n, v in block.get("nonoverlapping_bpb", {}).items():
            if v is not None:
                rows.append({"scaling": scaling, "length": int(n), "bpb": float(v), "factor": factors.get(n)})
    return sorted(rows, key=lambda r: (r["scaling"], r["length"]))


def rope_wavelengths(folder: str | Path, factor: float, seq_len: int | None = None,
                     scalings: Sequence[str] | None = None) -> list[dict]:
    """Rows {scaling, pair, wavelength (positions per full turn = 2 pi / theta_i), attention_factor}.

    Built from the checkpoint's config through ``Rotary.frequencies``: no weights needed.
    ``seq_len`` matters only for dynamic NTK (defaults to factor x train_length).
    """
    model_cfg = read_config(folder)["model"]
    n_embd, n_head = model_cfg["n_embd"], model_cfg["n_head"]
    shape = ModelShape(model_cfg["n_layer"], n_head, n_embd // n_head, n_embd, model_cfg["train_length"])
    seq_len = seq_len or int(factor * shape.train_length)
    rows = []
    for scaling in (list(ROPE_SCALINGS) if scalings is None else scalings):
        options = {**model_cfg.get("position_options", {}), "scaling": scaling,
                   "factor": 1.0 if scaling == "none" else float(factor)}
        rotary = build_position_method("rope", shape, options)
        inv_freq, attention = rotary.frequencies(seq_len)
        for i, theta in enumerate(inv_freq.tolist()):
            rows.append({"scaling": scaling, "pair": i, "wavelength": 2 * math.pi / theta,
                         "attention_factor": float(attention)})
    return rows


# ---------------------------------------------------------------------------------------------
# Far-context retrieval (copy probe) and ALiBi's reach
# ---------------------------------------------------------------------------------------------
RANDOM_STRING_BITS = math.log2(36)  # the probe's strings are drawn from 36 symbols: a blind guess costs this


def probe_gaps(max_total: int, string_length: int) -> list[int]:
    """Gaps 0, 16, 32, 64, ... whose probe (two copies + gap) fits in ``max_total`` bytes."""
    gaps, g = [0], 16
    while 2 * string_length + g <= max_total:
        gaps.append(g)
        g *= 2
    return gaps


def copy_probe_live(model: GPT, filler, gaps: Sequence[int], string_length: int = 32, trials: int = 4,
                    progress: Progress = _no_progress) -> dict[int, float | None]:
    """``evaluate.copy_probe`` gap by gap (for a progress bar), capped at the device's length cap.

    None where the method cannot represent the positions (learned past its table).
    """
    if not 4 <= string_length <= 256:
        raise PosvizError(f"The random string must have 4 to 256 bytes, got {string_length}.")
    if not 1 <= trials <= 32:
        raise PosvizError(f"Use 1 to 32 trials, got {trials}.")
    cap = length_cap(model)
    filler = torch.as_tensor(np.asarray(filler, dtype=np.int64)).flatten()
    out = {}
    for i, gap in enumerate(gaps):
        if 2 * string_length + gap > cap:
            raise PosvizError(f"A gap of {gap:,} with two {string_length}-byte copies is past this device's cap of "
                              f"{cap:,} bytes.")
        if gap + 2 > filler.numel():
            raise PosvizError(f"The filler text has {filler.numel():,} bytes, too short for a gap of {gap:,}.")
        out[int(gap)] = copy_probe(model, filler, [gap], string_length=string_length, trials=trials,
                                   seed=gap)[str(gap)]
        progress((i + 1) / len(gaps))
    return out


def shipped_copy_probe(folder: str | Path) -> list[tuple[int, float | None]]:
    try:
        table = read_metrics(folder).get("eval", {}).get("copy_probe", {})
    except PosvizError:
        return []
    return sorted((int(g), None if v is None else float(v)) for g, v in table.items())


def alibi_attenuation(n_head: int, distances: Sequence[int]) -> list[dict]:
    """Rows {head, slope, distance, penalty, factor}: ALiBi subtracts ``penalty = slope * distance``
    from the logit of a key ``distance`` bytes back, i.e. multiplies its weight by ``factor =
    exp(-penalty)`` before normalisation, whatever the input."""
    slopes = alibi_slopes(n_head).double()
    return [{"head": h, "slope": float(m), "distance": int(d), "penalty": float(m) * d, "factor": math.exp(-float(m) * d)}
            for h, m in enumerate(slopes) for d in distances]


# ---------------------------------------------------------------------------------------------
# Comparisons: method A vs B, or length L vs 2L
# ---------------------------------------------------------------------------------------------
def compare_methods(model_a: GPT, model_b: GPT, ids, length: int) -> dict:
    """Per-position mean loss (bits) of A and B on the same windows, and B - A."""
    a, b = score_at_length(model_a, ids, length), score_at_length(model_b, ids, length)
    return {"length": length, "position": np.arange(length), "a": a.position_bits, "b": b.position_bits,
            "diff": b.position_bits - a.position_bits, "bpb_a": a.bpb, "bpb_b": b.bpb, "n_windows": a.n_windows}


def compare_lengths(model: GPT, ids, length: int) -> dict:
    """Each byte scored in windows of 2L and of L over the same bytes; by position in the 2L window:
    the mean loss both ways and their difference (2L - L).

    Positions below L see the same context either way (the difference is 0 by causality); at
    positions L..2L-1 the 2L window gives L more bytes of context, at positions past what the
    method saw in training when 2L > train_length.
    """
    ids = _ids_on(model, ids)
    check_eval_length(model, 2 * length, ids.numel())
    budget = length_cap(model)
    n = windows_for(2 * length, ids.numel() - 1, budget) * 2 * length  # predictions scored both ways
    long = score_at_length(model, ids[: n + 1], 2 * length, budget=n)
    short = score_at_length(model, ids[: n + 1], length, budget=n)
    # byte_bits[j + 1] is the prediction made at text position j: fold both into rows of 2L positions
    long_bits = long.byte_bits[1:].reshape(-1, 2 * length)  # (windows, 2L)
    short_bits = short.byte_bits[1:].reshape(-1, 2 * length)  # the same predictions, in windows of L
    diff = long_bits - short_bits
    return {"length": length, "position": np.arange(2 * length), "long": _col_mean(long_bits),
            "short": _col_mean(short_bits), "diff": _col_mean(diff), "bpb_long": long.bpb, "bpb_short": short.bpb,
            "n_windows": long_bits.shape[0]}


def _col_mean(x: np.ndarray) -> np.ndarray:
    """Mean of each column ignoring NaN; an all-NaN column (no prediction there) stays NaN."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=0)


def attention_difference(model_a: GPT, model_b: GPT, ids, length: int, layer: int, head: int,
                         max_side: int = 512) -> dict:
    """One head's attention maps of A and of B on the same ``length`` bytes, and B - A, each pooled to
    at most ``max_side`` a side (masked future entries NaN). ``block``: entries per pooled cell."""
    a = display_attention(attention_probs(model_a, ids, length, layer)[head], log_scale=False)
    b = display_attention(attention_probs(model_b, ids, length, layer)[head], log_scale=False)
    (pa, block), (pb, _), (pd_, _) = (pool_matrix(m, max_side) for m in (a, b, b - a))
    return {"a": pa, "b": pb, "diff": pd_, "block": block, "length": length,
            "max_abs_diff": float(np.nanmax(np.abs(b - a)))}


def length_attention_difference(model: GPT, ids, length: int, layer: int, head: int, max_side: int = 512) -> dict:
    """How one head's attention on the same L bytes changes when L more bytes come before them.

    ``short``: the head's map over bytes L..2L-1 alone (positions 0..L-1). ``long``: the block of
    the 2L map with queries and keys in L..2L-1 (positions L..2L-1). ``diff`` = long - short. All
    pooled to at most ``max_side`` a side. ``far_mass`` (L,): per query of the second half, the
    attention the 2L window puts on the first L bytes, i.e. what the extra context draws away.
    """
    ids = _ids_on(model, ids)
    check_eval_length(model, 2 * length, ids.numel())
    long = attention_probs(model, ids, 2 * length, layer)[head]  # (2L, 2L)
    short = display_attention(attention_probs(model, ids[length:], length, layer)[head], False)  # (L, L)
    block = display_attention(long[length:, length:], False)
    (ps, size), (pl, _), (pd_, _) = (pool_matrix(m, max_side) for m in (short, block, block - short))
    return {"short": ps, "long": pl, "diff": pd_, "block": size, "length": length,
            "far_mass": long[length:, :length].sum(-1).numpy().astype(float)}
