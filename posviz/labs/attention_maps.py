"""Attention maps of the live labs: one layer's attention over a text, pooled to draw, and per-head summaries.

Used by the Extrapolation lab (every head's map at a length, and how each head's mean attention
distance and entropy grow with the length) and by the Compare lab (one head's map under two methods,
or at L against 2L). No plotting and no Streamlit here.

Shape legend as in ``model.py``: H heads, T bytes (the evaluation length). Maps are causal: a query
puts no mass on later keys, which are drawn as NaN (``display_attention``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from posviz.errors import PosvizError
from posviz.labs.inputs import LN2, Progress, _no_progress
from posviz.models.interface import LabModel
from posviz.models.attention import block_elements


@torch.inference_mode()
def attention_probs(model: LabModel, ids, length: int, layer: int, on_device: bool = False) -> torch.Tensor:
    """Attention probabilities of every head of ``layer`` over the first ``length`` bytes: (H, T, T), on
    the CPU, or where the model is with ``on_device`` (for statistics and pooling: at the GPU cap the
    maps are 1 GiB, and only the pooled image and per-head numbers need to come to the CPU)."""
    ids = model.ids_on_device(ids)
    length = model.checked(length, ids.numel())
    out = model(ids[None, :length], attention_layer=layer)
    probs = as_drawn(model, layer, out.attention[0].float())
    return probs if on_device else probs.cpu()


def as_drawn(model: LabModel, layer: int, weights: torch.Tensor) -> torch.Tensor:
    """``layer``'s map (.., T, Tk) as a lab reads it: attention's probabilities as they are; a recurrent layer's
    implied matrix (``LabModel.layer_kind``) as each row's |w| shares (``implied_shares``)."""
    return weights if model.layer_kind(layer) == "attention" else implied_shares(weights)


def implied_shares(weights: torch.Tensor) -> torch.Tensor:
    """A recurrent layer's implied matrix (H, T, T) (o_t = sum_s w_ts v_s; signed, rows need not sum to 1) as
    what a map of attention draws: each weight's share of its row's sum of |w|. Its distance and entropy then read
    as attention's do, of where the layer's output comes from."""
    magnitude = weights.abs()
    return magnitude / magnitude.sum(-1, keepdim=True).clamp(min=torch.finfo(magnitude.dtype).tiny)


def attention_stats_per_query(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head and query: attention distance sum_j p_ij (i - j) in bytes and entropy
    -sum_j p_ij log2 p_ij in bits. probs (H, T, T) causal. Returns two (H, T) tensors.

    One matrix-vector product and one elementwise pass: at 4,096 bytes the maps are 64 M entries
    a head, so anything that builds a (T, T) helper per head costs more than the forward pass.
    """
    probs = probs.float()
    H, T, Tk = probs.shape
    idx = torch.arange(Tk, dtype=torch.float32, device=probs.device)
    # sum_j p_ij (i - j) = i * sum_j p_ij - sum_j p_ij j; rows of a causal softmax put no mass on j > i
    distance = torch.arange(T, dtype=torch.float32, device=probs.device) * probs.sum(-1) - probs @ idx  # (H, T)
    # entr(p) = -p ln p (0 at p = 0), a block of rows at a time: a whole-map temporary would cost a
    # page-faulted allocation as large as the map (256 MB at 4,096 bytes) and twice the time
    flat, entropy = probs.reshape(H * T, Tk), torch.empty(H * T, device=probs.device)
    rows = max(1, block_elements(probs.device) // Tk)
    for r0 in range(0, H * T, rows):
        entropy[r0:r0 + rows] = torch.special.entr(flat[r0:r0 + rows]).sum(-1)
    return distance, entropy.view(H, T) / LN2


def attention_stats(probs: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per head: mean attention distance (bytes) and mean entropy (bits) over the queries: two (H,) arrays."""
    distance, entropy = attention_stats_per_query(probs)
    return distance.mean(-1).cpu().numpy().astype(float), entropy.mean(-1).cpu().numpy().astype(float)


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
        return m.double().cpu().numpy(), 1
    valid = ~torch.isnan(m)
    padded = F.pad(torch.where(valid, m, 0.0), (0, nw * block - w, 0, nh * block - h))
    counts = F.pad(valid.float(), (0, nw * block - w, 0, nh * block - h))
    sums = padded.view(nh, block, nw, block).sum((1, 3), dtype=torch.float64)
    counts = counts.view(nh, block, nw, block).sum((1, 3), dtype=torch.float64)
    return (sums / counts).cpu().numpy(), block  # 0 / 0 = NaN for fully masked blocks


def _causal_counts(T: int, block: int, n: int, device=None) -> torch.Tensor:
    """(n, n): how many (query i, key j <= i) pairs fall in each block x block cell of a (T, T) map."""
    i = torch.arange(T, device=device)
    starts = torch.arange(n, device=device) * block
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
    return (sums.double() / _causal_counts(T, block, n, probs.device)).cpu().numpy(), block


LOG_FLOOR = 1e-6  # probabilities below this are drawn as this: log10 range [-6, 0]


def display_attention(probs_2d: torch.Tensor | np.ndarray, log_scale: bool) -> np.ndarray:
    """(T, T) probabilities to the drawn values: masked (future) keys NaN; log10 when asked."""
    p = torch.as_tensor(np.asarray(probs_2d) if not isinstance(probs_2d, torch.Tensor) else probs_2d).double()
    future = torch.ones(p.shape, dtype=torch.bool, device=p.device).triu(1)
    p = p.masked_fill(future, float("nan"))
    if log_scale:
        p = torch.log10(p.clamp(min=LOG_FLOOR))  # NaN stays NaN
    return p.cpu().numpy()


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
    kind: str = "attention"  # ``LabModel.layer_kind``: else a recurrent layer, its maps each row's |w| shares


def _view_from_probs(probs: torch.Tensor, length: int, layer: int, log_scale: bool, max_side: int,
                     start: float) -> AttentionView:
    distance, entropy = attention_stats_per_query(probs)  # (H, T) each
    # Pool probabilities first (an average of probabilities means something), then take the log.
    pooled, block = pool_attention(probs, max_side)
    if log_scale:
        with np.errstate(invalid="ignore"):
            pooled = np.log10(np.clip(pooled, LOG_FLOOR, None))
    distance, entropy = distance.cpu(), entropy.cpu()  # (H, T): small, unlike the maps
    return AttentionView(int(length), layer, list(pooled), block, distance.mean(-1).numpy().astype(float),
                         entropy.mean(-1).numpy().astype(float), time.perf_counter() - start,
                         distance.numpy(), entropy.numpy())


def attention_view(model: LabModel, ids, length: int, layer: int, log_scale: bool = True, max_side: int = 512) -> AttentionView:
    start = time.perf_counter()
    view = _view_from_probs(attention_probs(model, ids, length, layer, on_device=True), length, layer, log_scale,
                            max_side, start)
    view.kind = model.layer_kind(layer)
    return view


def beside_view(model: LabModel, ids, length: int, layer: int, log_scale: bool = True, max_side: int = 512) -> AttentionView:
    """The view of the mixer beside ``layer``'s attention (``LabModel.beside_kind``: Falcon-H1's Mamba-2), drawn as
    a recurrent layer's map is: each row's |implied weight| shares."""
    start = time.perf_counter()
    ids = model.ids_on_device(ids)
    length = model.checked(length, ids.numel())
    probs = implied_shares(model.beside_map(ids[:length], layer).float())
    view = _view_from_probs(probs, length, layer, log_scale, max_side, start)
    view.kind = model.beside_kind(layer)
    return view


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


def attention_growth(model: LabModel, ids, lengths: Iterable[int], layer: int,
                     progress: Progress = _no_progress) -> list[dict]:
    """Rows {length, head, distance, entropy} for each length (one forward pass per length)."""
    lengths = list(lengths)
    rows = []
    for i, n in enumerate(lengths):
        distance, entropy = attention_stats(attention_probs(model, ids, n, layer, on_device=True))
        rows += [{"length": n, "head": h, "distance": float(distance[h]), "entropy": float(entropy[h])}
                 for h in range(len(distance))]
        progress((i + 1) / len(lengths))
    return rows
