"""The numbers behind the Attention biases page: pure functions, no plotting, no Streamlit.

Every bias method's curve by distance, the learned values of its checkpoint, and the largest
attention weight a key can get under it (the page's common yardstick). Arrays are numpy; "columns"
dicts go straight into ``pandas.DataFrame`` (long format, one row per plotted point).
Shape legend: T positions, H heads, n visible keys (keys at distances 0 .. n-1 from the query).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from posviz.config import require
from posviz.positions.alibi import alibi_bias, alibi_slopes
from posviz.positions.shaw import shaw_clip_matrix
from posviz.positions.t5 import t5_bucket

Columns = dict[str, np.ndarray]


# -- Distances to plot ------------------------------------------------------------------------------
def distance_grid(n_keys: int, points: int = 320) -> np.ndarray:
    """Distances 0 .. n_keys-1 to plot: every one up to 64, then about ``points`` log-spaced ones.

    Charts of 8,192 distances x 64 heads would send half a million points to the browser.
    """
    require(n_keys >= 1, "n_keys must be >= 1")
    dense = np.arange(min(n_keys, 65))
    if n_keys <= 65:
        return dense
    sparse = np.geomspace(64, n_keys - 1, points).round().astype(int)
    return np.unique(np.concatenate([dense, sparse, [n_keys - 1]]))


def max_weight_columns(log_weights: Mapping[str, np.ndarray], distances: np.ndarray) -> Columns:
    """Long-format rows of "largest weight vs distance" curves, one series per label.

    ``log_weights``: {label: (n,) natural-log bound}; rows only at ``distances``. Columns: series,
    distance, max_weight, log10_max_weight (finite even where the weight underflows to 0).
    """
    out: dict[str, list] = {"series": [], "distance": [], "max_weight": [], "log10_max_weight": []}
    for label, lw in log_weights.items():
        lw = np.asarray(lw, dtype=float)[distances]
        out["series"] += [label] * distances.size
        out["distance"] += list(distances)
        out["max_weight"] += list(np.exp(lw))
        out["log10_max_weight"] += list(lw / math.log(10))
    return {k: np.asarray(v) for k, v in out.items()}


# -- ALiBi, T5, Shaw ----------------------------------------------------------------------------------
def comparison_sentence(log_weights: Mapping[str, np.ndarray], far: int, n_keys: int, margin: float) -> str | None:
    """What the side-by-side chart shows at the relevant key's distance ``far``, in one sentence from its curves."""
    at = {name: float(np.exp(lw[far])) for name, lw in log_weights.items() if far < len(lw) and np.isfinite(lw[far])}
    if not at:
        return None
    ranked = sorted(at, key=at.get)
    most, least = ranked[-1], ranked[0]
    return (f"A relevant key {far:,} positions back, among {n_keys:,} keys and ahead by a margin of {margin:g} logits, "
            f"can get at most {at[most]:.3g} of the weight under {most} and {at[least]:.3g} under {least}, "
            f"of {len(at)} drawn.")


def alibi_slope_table(n_heads: int) -> Columns:
    """ALiBi slopes per head, with the distance at which each head's bias costs one logit and the
    distance at which it halves the attention a key would otherwise get (ln 2 / slope).

    Columns: head, slope, one_logit_distance, half_weight_distance.
    """
    slopes = alibi_slopes(n_heads).double().numpy()
    return {"head": np.arange(n_heads), "slope": slopes, "one_logit_distance": 1.0 / slopes,
            "half_weight_distance": math.log(2) / slopes}


def alibi_bias_matrices(n_heads: int, length: int) -> np.ndarray:
    """(H, T, T) ALiBi bias -slope * (i - j); NaN above the diagonal (future keys are masked)."""
    pos = torch.arange(length)
    bias = alibi_bias(alibi_slopes(n_heads).double(), pos, pos).numpy()
    return np.where(np.tril(np.ones((length, length), bool))[None], bias, np.nan)


def alibi_bias_by_distance(n_heads: int, n_keys: int) -> np.ndarray:
    """(H, n) ALiBi bias for the keys at distance 0 .. n-1 from a query."""
    q_pos = torch.tensor([n_keys - 1])
    k_pos = n_keys - 1 - torch.arange(n_keys)  # key at distance d sits at position n-1-d
    return alibi_bias(alibi_slopes(n_heads).double(), q_pos, k_pos)[:, 0, :].numpy()


def t5_bucket_table(max_shown: int, num_buckets: int = 32, max_distance: int = 128) -> Columns:
    """T5 bucket of every distance 0 .. max_shown: causal, and bidirectional for a key before / after.

    Columns: distance, causal, bidirectional_before, bidirectional_after.
    """
    d = torch.arange(max_shown + 1)
    return {
        "distance": d.numpy(),
        "causal": t5_bucket(-d, False, num_buckets, max_distance).numpy(),
        "bidirectional_before": t5_bucket(-d, True, num_buckets, max_distance).numpy(),
        "bidirectional_after": t5_bucket(d, True, num_buckets, max_distance).numpy(),
    }


def t5_bucket_matrix(length: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """(T, T) bucket index of each (query row, key column); causal: NaN above the diagonal."""
    pos = torch.arange(length)
    buckets = t5_bucket(pos[None, :] - pos[:, None], bidirectional, num_buckets, max_distance).double().numpy()
    return buckets if bidirectional else np.where(np.tril(np.ones((length, length), bool)), buckets, np.nan)


def t5_bias_by_distance(bucket_weights: np.ndarray, n_keys: int, max_distance: int) -> np.ndarray:
    """(H, n) learned T5 bias for keys at distance 0 .. n-1 (causal), from a (num_buckets, H) table."""
    weights = np.asarray(bucket_weights, dtype=float)
    buckets = t5_bucket(-torch.arange(n_keys), False, weights.shape[0], max_distance).numpy()
    return weights[buckets].T


def t5_bias_matrix(bucket_weights: np.ndarray, head: int, length: int, max_distance: int) -> np.ndarray:
    """(T, T) learned T5 bias of one head (causal model); NaN above the diagonal."""
    weights = np.asarray(bucket_weights, dtype=float)
    buckets = t5_bucket_matrix(length, False, weights.shape[0], max_distance)
    filled = np.nan_to_num(buckets, nan=0).astype(int)
    return np.where(np.isnan(buckets), np.nan, weights[filled, head])


def trained_position(model, expected: str):
    """The trained ``PositionMethod`` of ``model`` (a GPT or a LabModel: both answer ``.position``),
    checked to be the method ``expected``."""
    position = model.position
    require(position.name == expected, f"expected a {expected!r} model, got {position.name!r}")
    return position


def t5_learned(model) -> dict[str, Any]:
    """The learned part of a ``t5`` model: weights (num_buckets, H) float64, num_buckets, max_distance."""
    position = trained_position(model, "t5")
    opts = position.options
    return {"weights": position.bucket_bias.weight.detach().cpu().double().numpy(),
            "num_buckets": opts.num_buckets, "max_distance": opts.max_distance}


def shaw_learned(model) -> dict[str, Any]:
    """The learned part of a ``shaw`` model: rel_keys (n_layer, k+1, hs) float64 and max_distance k."""
    position = trained_position(model, "shaw")
    return {"rel_keys": position.rel_keys.detach().cpu().double().numpy(),
            "max_distance": position.options.max_distance}


def shaw_clip(length: int, max_distance: int, causal: bool = True) -> np.ndarray:
    """(T, T) index of the relative embedding each pair uses; causal: NaN above the diagonal."""
    index = shaw_clip_matrix(length, max_distance, causal).double().numpy()
    return np.where(index < 0, np.nan, index)


# -- The largest attention weight a key at distance d can get ----------------------------------
def _log_sum_others(logits: np.ndarray) -> np.ndarray:
    """log sum_{j != i} exp(logits_j) for every i, over the last axis, without cancellation.

    Prefix and suffix sums of positive terms (shifted by the max) never subtract, so a key that
    dominates does not lose the others to rounding. Empty sums give -inf.
    """
    top = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - top)
    before = np.concatenate([np.zeros_like(e[..., :1]), np.cumsum(e, axis=-1)[..., :-1]], axis=-1)
    after = np.concatenate([np.flip(np.cumsum(np.flip(e[..., 1:], -1), axis=-1), -1), np.zeros_like(e[..., :1])], axis=-1)
    with np.errstate(divide="ignore"):
        return np.log(before + after) + top


def max_attention_weight(bias_by_distance: np.ndarray, margin: float) -> np.ndarray:
    """Largest softmax weight each key can get, given the position bias and a content margin.

    Setting: one query, n visible keys at distances d = 0 .. n-1, logits z_d = s_d + b_d with b_d
    the position bias (``bias_by_distance``, (..., n), already in logit units) and s_d the content
    score q.k_d / sqrt(hs). "Largest" means: the supremum of softmax(z)_d over every content score
    vector in which the key at distance d beats each other key by at most ``margin`` logits
    (s_d - s_j <= margin for all j). Since softmax(z)_d = 1 / (1 + sum_{j != d} exp(z_j - z_d))
    decreases in each s_d - s_j, the supremum is reached when all other content scores equal
    s_d - margin, giving

        max weight(d) = 1 / (1 + exp(-margin) * sum_{j != d} exp(b_j - b_d)).

    Returns (..., n). ``log_max_attention_weight`` gives the same in log space, which never
    underflows.
    """
    return np.exp(log_max_attention_weight(bias_by_distance, margin))


def log_max_attention_weight(bias_by_distance: np.ndarray, margin: float) -> np.ndarray:
    """Natural log of ``max_attention_weight``: -log(1 + exp(log_sum_others - b_d - margin))."""
    b = np.asarray(bias_by_distance, dtype=float)
    x = _log_sum_others(b) - b - margin
    return -np.logaddexp(0.0, x)


def shaw_log_max_attention_weight(rel_keys: np.ndarray, n_keys: int, margin: float,
                                  query_norm: float | None) -> np.ndarray:
    """Log of an upper bound on the weight of the key at distance d = 0 .. n-1 under Shaw's clipping.

    Shaw's position term is query-dependent: b_j = q . a_c(j) / sqrt(hs) with c(j) = min(j, k) and
    a the layer's (k+1, hs) relative keys ``rel_keys``. For any query with |q| <= ``query_norm``
    (Cauchy-Schwarz) b_j - b_d >= -|q| |a_c(j) - a_c(d)| / sqrt(hs), so with the content margin as in
    ``max_attention_weight``

        weight(d) <= 1 / (1 + exp(-margin) * sum_{j != d} exp(-query_norm |a_c(j) - a_c(d)| / sqrt(hs))).

    ``query_norm=None`` allows any query: only keys sharing d's embedding (every key at distance
    >= k when d >= k) are certain to compete, so the bound is 1 for d < k and
    1 / (1 + exp(-margin) (n - k - 1)) beyond: past k, position cannot single a key out. (n,)
    """
    a = np.asarray(rel_keys, dtype=float)  # (k+1, hs)
    k = a.shape[0] - 1
    hs = a.shape[1]
    d = np.arange(n_keys)
    clip = np.minimum(d, k)  # (n,)
    counts = np.bincount(clip, minlength=k + 1)  # keys using each embedding
    gaps = np.linalg.norm(a[:, None, :] - a[None, :, :], axis=-1) / math.sqrt(hs)  # (k+1, k+1)
    if query_norm is None or math.isinf(query_norm):
        per_pair = (gaps == 0).astype(float)
    else:
        per_pair = np.exp(-float(query_norm) * gaps)
    others = (per_pair * counts[None, :]).sum(axis=1) - 1.0  # sum over j != d, grouped by embedding
    others = np.maximum(others[clip], 0.0)
    with np.errstate(divide="ignore"):
        x = np.log(others) - margin
    return -np.logaddexp(0.0, x)


def strongest_head(log_weights: np.ndarray) -> np.ndarray:
    """(n,) the most lenient head's bound at each distance, from (H, n) per-head log bounds."""
    return np.asarray(log_weights, dtype=float).max(axis=0)


def no_bias_log_max_weight(n_keys: int, margin: float) -> np.ndarray:
    """(n,) the bound with no position bias at all (NoPE): 1 / (1 + exp(-margin) (n - 1)) at every distance."""
    return log_max_attention_weight(np.zeros(n_keys), margin)




# -- Any distance-only bias, read off a model: ALiBi, T5, KERPLE, FIRE ------------------------------
def bias_by_distance(position, layer: int, n_keys: int) -> np.ndarray:
    """(H, n) bias a method adds for the *last* query of an n-key context, for keys at distance 0 .. n-1.

    The method's own ``bias_by_distance`` (``PositionMethod``: its ``logit_bias`` hook asked with a zero
    query), so the curve is what the model computes, for any method whose bias does not depend on the
    query's content. FIRE's bias also depends on where the query sits: this is a query at position n-1.
    """
    bias = position.bias_by_distance(layer, n_keys)
    require(bias is not None, f"{position.name} adds no bias to the logits that is a curve of distance")
    return bias.numpy()


def bias_curves(position, layers: Sequence[int], lengths: Sequence[int], grid_points: int = 200) -> Columns:
    """Long-format rows of ``bias_by_distance`` for several layers and context lengths.

    Columns: layer, context (n), head, distance, bias. Distances on ``distance_grid`` of each n.
    """
    out: dict[str, list] = {"layer": [], "context": [], "head": [], "distance": [], "bias": []}
    for layer in layers:
        for n in lengths:
            grid = distance_grid(n, grid_points)
            bias = bias_by_distance(position, layer, n)[:, grid]  # (H, g)
            for h, row in enumerate(bias):
                out["layer"] += [layer] * grid.size
                out["context"] += [n] * grid.size
                out["head"] += [h] * grid.size
                out["distance"] += list(grid)
                out["bias"] += list(row)
    return {k: np.asarray(v) for k, v in out.items()}


def kerple_formula(r1: float, r2: float, distances: np.ndarray) -> np.ndarray:
    """KERPLE's logarithmic bias -r1 log(1 + r2 d) for given r1, r2 (the page's sliders)."""
    return -float(r1) * np.log1p(float(r2) * np.asarray(distances, dtype=float))


def kerple_learned(model) -> dict[str, np.ndarray]:
    """The learned (r1, r2) of a ``kerple`` model, each (n_layer, H), as the forward pass uses them."""
    position = trained_position(model, "kerple")
    pairs = [position.parameters_of(layer) for layer in range(position.shape.n_layer)]
    return {"r1": np.stack([r1.detach().double().cpu().numpy() for r1, _ in pairs]),
            "r2": np.stack([r2.detach().double().cpu().numpy() for _, r2 in pairs])}


def fire_normalised_distance(lengths: Sequence[int], c: float, threshold: float, grid_points: int = 200) -> Columns:
    """What FIRE's MLP sees: psi(d) / psi(max(L, i)) with psi(x) = log(c x + 1), for the last query of
    contexts of each length (i = n - 1). Columns: context, distance, normalised (in [0, 1]).
    Every context maps its distances onto the same [0, 1] range, which is why the learned function
    is only ever asked about inputs it saw in training."""
    out: dict[str, list] = {"context": [], "distance": [], "normalised": []}
    for n in lengths:
        d = distance_grid(n, grid_points).astype(float)
        psi = lambda x: np.log(abs(c) * x + 1)  # noqa: E731
        out["context"] += [n] * d.size
        out["distance"] += list(d)
        out["normalised"] += list(psi(d) / (psi(max(float(threshold), n - 1.0)) + 1e-6))
    return {k: np.asarray(v) for k, v in out.items()}


def fire_learned(model) -> Columns:
    """FIRE's learned scalars per layer: c (psi's scale) and the threshold L, with L's starting value.
    Columns: layer, c, threshold, threshold_init (a shared FIRE gives the same row for every layer)."""
    position = trained_position(model, "fire")
    fns = [position.function(layer) for layer in range(position.shape.n_layer)]
    return {"layer": np.arange(len(fns)), "c": np.array([float(fn.c.detach()) for fn in fns]),
            "threshold": np.array([float(fn.threshold.detach()) for fn in fns]),
            "threshold_init": np.array([fn.threshold_init for fn in fns])}


def far_bias_by_head(curves: np.ndarray) -> tuple[float, float]:
    """(least, most) bias the heads add at the farthest distance of (H, n) curves: how differently the
    heads treat a far key (one number for all heads when they share one curve)."""
    far = np.asarray(curves, dtype=float)[:, -1]
    return float(far.min()), float(far.max())


def relative_key_tables(model, layer: int) -> np.ndarray:
    """(k+1, hs) relative keys of a Shaw-style model (``shaw``: learned per layer; ``nezha``: fixed)."""
    return model.position.relative_keys(layer, torch.tensor([0]), torch.tensor([0])).detach().double().cpu().numpy()


def nezha_table(max_distance: int, head_dim: int, base: float = 10000.0) -> np.ndarray:
    """(k+1, hs) NEZHA's fixed relative keys, without a model (the formula of ``positions.nezha``)."""
    from posviz.positions.sinusoidal import sinusoidal_table
    return sinusoidal_table(max_distance + 1, head_dim, base, dtype=torch.float64).numpy()


# -- Transformer-XL's four terms ------------------------------------------------------------------------
TXL_TERMS = ("content-content", "content-position", "global content bias", "global position bias")


def transformer_xl_terms(model, ids: Sequence[int], layer: int) -> dict[str, np.ndarray]:
    """The four logit terms of a ``transformer_xl`` model's attention in one layer, on byte ids ``ids``.

    Runs the model up to that layer (the forward hook reads the layer's normalised input), takes the
    content queries and keys from its own projection, and asks the method for the terms. Returns each
    term (H, T, T) plus "logit" (their sum) and "weight" (the softmax over visible keys), NaN above
    the diagonal (future keys, masked). ``model``: the GPT, or a shipped LabModel (its ``net``).
    """
    model = getattr(model, "net", model)
    require(model.config.position == "transformer_xl", f"expected a 'transformer_xl' model, got {model.config.position!r}")
    require(0 <= layer < model.config.n_layer, f"layer must be in 0..{model.config.n_layer - 1}")
    x = torch.tensor([list(ids)], dtype=torch.long, device=model.device)  # (1, T)
    seen: dict[str, torch.Tensor] = {}
    attn = model.blocks[layer].attn
    hook = model.blocks[layer].ln_1.register_forward_hook(lambda mod, inp, out: seen.setdefault("x", out))
    try:
        with torch.inference_mode():
            model(x)
    finally:
        hook.remove()
    B, T, C = seen["x"].shape
    H = model.config.n_head
    with torch.inference_mode():
        q, k, _ = attn.c_attn(seen["x"]).split(C, dim=2)
        q, k = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k))  # (1, H, T, hs)
        pos = torch.arange(T, device=q.device)
        terms = model.position.four_terms(layer, q.float(), k.float(), pos, pos)
    future = np.triu(np.ones((T, T), bool), 1)
    out = {name: np.where(future, np.nan, terms[name][0].double().cpu().numpy()) for name in TXL_TERMS}
    logit = sum(out[name] for name in TXL_TERMS)
    masked = np.where(future, -np.inf, logit)
    weight = np.exp(masked - masked.max(axis=-1, keepdims=True))
    out["logit"] = logit
    out["weight"] = np.where(future, np.nan, weight / weight.sum(axis=-1, keepdims=True))
    return out


def transformer_xl_query_rows(terms: Mapping[str, np.ndarray], head: int, query: int,
                              text: Sequence[str]) -> Columns:
    """Long-format rows for one query's stacked view: one row per (key, term), with the key's byte.

    Columns: key (position), byte (the character shown), term, value (logits), total, weight.
    """
    keys = np.arange(query + 1)
    out: dict[str, list] = {"key": [], "byte": [], "term": [], "value": [], "total": [], "weight": []}
    for name in TXL_TERMS:
        out["key"] += list(keys)
        out["byte"] += [text[j] for j in keys]
        out["term"] += [name] * keys.size
        out["value"] += list(terms[name][head, query, keys])
        out["total"] += list(terms["logit"][head, query, keys])
        out["weight"] += list(terms["weight"][head, query, keys])
    return {k: np.asarray(v) for k, v in out.items()}


def deciding_term(terms: Mapping[str, np.ndarray], head: int, query: int) -> dict[str, float]:
    """How much each term moves the logit of the key the query attends to most, against the mean key.

    The term with the largest share is the one that "decides where the query looks". Returns
    {term: logit of the top key minus the mean over visible keys}.
    """
    top = int(np.nanargmax(terms["weight"][head, query, : query + 1]))
    return {name: float(terms[name][head, query, top] - np.nanmean(terms[name][head, query, : query + 1]))
            for name in TXL_TERMS}


def distance_only_bias_methods() -> list[str]:
    """Registered methods whose logit bias is a function of positions alone (ALiBi, T5, KERPLE, FIRE):
    the ones ``bias_by_distance`` can draw as curves. Read off the registry, so a new one shows up."""
    from posviz.positions import POSITION_METHODS, method_names
    return [n for n in method_names() if POSITION_METHODS[n].draws_bias_by_distance()]


def fixed_method(name: str, n_layer: int, n_head: int, head_dim: int, train_length: int):
    """A method without parameters (ALiBi), built for a model shape: its curve needs no checkpoint."""
    from posviz.positions import ModelShape, build_position_method
    return build_position_method(name, ModelShape(n_layer, n_head, head_dim, n_head * head_dim, train_length))


# -- Published ALiBi models (BLOOM, Falcon, MPT): their slopes against the paper's ----------------------
def published_alibi_slopes(slopes) -> Columns:
    """Each head's slope as a published model adds it (``slopes``: (H,), logits per token of distance)
    next to the ALiBi paper's geometric slopes for the same head count (``alibi_slopes``).

    Columns: head, slope, paper_slope, ratio (slope / paper_slope), half_weight_distance (ln 2 / slope:
    the distance that halves a key's weight, in tokens), paper_half_weight_distance.
    """
    ours = (slopes.detach().cpu().double().numpy() if isinstance(slopes, torch.Tensor)
            else np.asarray(slopes, dtype=float))
    require(ours.ndim == 1 and ours.size >= 1, "slopes must be a non-empty (H,) vector")
    require(bool(np.all(ours > 0)), "slopes must be positive")
    paper = alibi_slopes(ours.size).double().numpy()
    return {"head": np.arange(ours.size), "slope": ours, "paper_slope": paper, "ratio": ours / paper,
            "half_weight_distance": math.log(2) / ours, "paper_half_weight_distance": math.log(2) / paper}


def published_alibi(model) -> dict[str, Any]:
    """What the Attention biases page shows of a published ALiBi model: name, family, n_head, head_dim,
    columns (``published_alibi_slopes`` of its slopes as it adds them), ratio_range (the smallest and
    largest slope / paper slope) and notes (where it computes something else than the paper)."""
    require(getattr(model, "method", None) == "alibi", f"expected an ALiBi model, got {getattr(model, 'method', None)!r}")
    pos = model.position
    columns = published_alibi_slopes(pos.slopes)
    return {"name": model.name, "family": pos.family, "n_head": int(columns["head"].size), "head_dim": pos.head_dim,
            "columns": columns, "ratio_range": (float(columns["ratio"].min()), float(columns["ratio"].max())),
            "notes": list(pos.notes)}
