"""The numbers behind the Compare lab: two methods on the same text, or one method at L against 2L.

No plotting and no Streamlit here. Losses come from ``posviz.labs.extrapolation.score_at_length`` (the
same windows as the Extrapolation lab) and attention maps from ``posviz.labs.attention_maps``; this
module lines them up position by position and takes their differences.
"""
from __future__ import annotations

import warnings

import numpy as np

from posviz.labs.attention_maps import attention_probs, display_attention, pool_matrix
from posviz.labs.extrapolation import score_at_length, windows_for
from posviz.models.interface import LabModel


def aligned(model_a: LabModel, model_b: LabModel, text: bytes) -> bool:
    """Whether A and B read ``text`` as the same ids, so that their losses and attention line up position by
    position (``LabModel.reads_alike``): two byte-level checkpoints always do, whatever their trained
    contexts; a tokenized model and a byte-level one never."""
    return model_a.reads_alike(model_b, text)


def attention_pair(model_a: LabModel, ids_a, length_a: int, model_b: LabModel, ids_b, length_b: int, layer: int,
                   head: int, max_side: int = 512, log_scale: bool = False) -> dict:
    """One head's attention map of A over its first ``length_a`` ids and of B over its first ``length_b`` ids,
    each pooled to at most ``max_side`` a side, for two models whose ids do not line up (no difference map)."""
    out = {}
    for key, model, ids, length in (("a", model_a, ids_a, length_a), ("b", model_b, ids_b, length_b)):
        probs = display_attention(attention_probs(model, ids, length, layer)[head], log_scale=log_scale)
        out[key], out[f"block_{key}"] = pool_matrix(probs, max_side)
        out[f"length_{key}"] = length
    return out


def compare_methods(model_a: LabModel, model_b: LabModel, ids, length: int) -> dict:
    """Per-position mean loss (bits) of A and B on the same windows, and B - A."""
    a, b = score_at_length(model_a, ids, length), score_at_length(model_b, ids, length)
    return {"length": length, "position": np.arange(length), "a": a.position_bits, "b": b.position_bits,
            "diff": b.position_bits - a.position_bits, "bpb_a": a.bpb, "bpb_b": b.bpb, "n_windows": a.n_windows}


def compare_lengths(model: LabModel, ids, length: int) -> dict:
    """Each byte scored in windows of 2L and of L over the same bytes; by position in the 2L window:
    the mean loss both ways and their difference (2L - L).

    Positions below L see the same context either way (the difference is 0 by causality); at
    positions L..2L-1 the 2L window gives L more bytes of context, at positions past what the
    method saw in training when 2L > train_length.
    """
    ids = model.ids_on_device(ids)
    twice = model.check_length(2 * length, ids.numel())  # handed on checked; L is checked where it is scored
    budget = model.length_cap
    n = windows_for(twice, ids.numel() - 1, budget) * twice  # predictions scored both ways
    long = score_at_length(model, ids[: n + 1], twice, budget=n)
    short = score_at_length(model, ids[: n + 1], length, budget=n)
    # id_bits[j + 1] is the prediction made at text position j: fold both into rows of 2L positions
    long_bits = long.id_bits[1:].reshape(-1, 2 * length)  # (windows, 2L)
    short_bits = short.id_bits[1:].reshape(-1, 2 * length)  # the same predictions, in windows of L
    diff = long_bits - short_bits
    return {"length": length, "position": np.arange(2 * length), "long": _col_mean(long_bits),
            "short": _col_mean(short_bits), "diff": _col_mean(diff), "bpb_long": long.bpb, "bpb_short": short.bpb,
            "n_windows": long_bits.shape[0]}


def _col_mean(x: np.ndarray) -> np.ndarray:
    """Mean of each column ignoring NaN; an all-NaN column (no prediction there) stays NaN."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=0)


def attention_difference(model_a: LabModel, model_b: LabModel, ids, length: int, layer: int, head: int,
                         max_side: int = 512, log_scale: bool = False) -> dict:
    """One head's attention maps of A and of B on the same ``length`` bytes, and B - A, each pooled to
    at most ``max_side`` a side (masked future entries NaN). ``block``: entries per pooled cell.
    ``log_scale``: A and B as log10 probability (as the Extrapolation lab draws them); B - A stays the
    difference of probabilities."""
    a = display_attention(attention_probs(model_a, ids, length, layer)[head], log_scale=False)
    b = display_attention(attention_probs(model_b, ids, length, layer)[head], log_scale=False)
    shown = [display_attention(m, log_scale) for m in (a, b)] if log_scale else [a, b]
    (pa, block), (pb, _), (pd_, _) = (pool_matrix(m, max_side) for m in (*shown, b - a))
    return {"a": pa, "b": pb, "diff": pd_, "block": block, "length": length,
            "max_abs_diff": float(np.nanmax(np.abs(b - a)))}


def length_attention_difference(model: LabModel, ids, length: int, layer: int, head: int, max_side: int = 512,
                                log_scale: bool = False) -> dict:
    """How one head's attention on the same L bytes changes when L more bytes come before them.

    ``short``: the head's map over bytes L..2L-1 alone (positions 0..L-1). ``long``: the block of
    the 2L map with queries and keys in L..2L-1 (positions L..2L-1). ``diff`` = long - short. All
    pooled to at most ``max_side`` a side. ``far_mass`` (L,): per query of the second half, the
    attention the 2L window puts on the first L bytes, i.e. what the extra context draws away.
    ``log_scale``: ``short`` and ``long`` as log10 probability; ``diff`` stays a difference of probabilities.
    """
    ids = model.ids_on_device(ids)
    twice = model.check_length(2 * length, ids.numel())  # handed on checked; L is checked where it is drawn
    long = attention_probs(model, ids, twice, layer)[head]  # (2L, 2L)
    short = display_attention(attention_probs(model, ids[length:], length, layer)[head], False)  # (L, L)
    block = display_attention(long[length:, length:], False)
    shown = [display_attention(m, log_scale) for m in (short, block)] if log_scale else [short, block]
    (ps, size), (pl, _), (pd_, _) = (pool_matrix(m, max_side) for m in (*shown, block - short))
    return {"short": ps, "long": pl, "diff": pd_, "block": size, "length": length,
            "far_mass": long[length:, :length].sum(-1).numpy().astype(float)}


OPENING_PAIR = ("rope", "alibi")  # rotary vs a linear bias: one fails past its training length where the other goes on


def opening_pair(shipped: list[str]) -> tuple[str, str]:
    """The pair the Compare page opens on: ``OPENING_PAIR`` where both are shipped, else the first and last."""
    if all(n in shipped for n in OPENING_PAIR):
        return OPENING_PAIR
    return shipped[0], shipped[-1]


def shared_range(*maps) -> tuple[float, float] | None:
    """The lowest and highest finite value over every map: one colour scale for maps read side by side."""
    finite = [np.asarray(m, dtype=float)[np.isfinite(np.asarray(m, dtype=float))] for m in maps]
    finite = [f for f in finite if f.size]
    if not finite:
        return None
    return float(min(f.min() for f in finite)), float(max(f.max() for f in finite))
