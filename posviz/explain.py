"""The numbers behind the explorer pages: pure functions, no plotting, no Streamlit.

Every function returns numpy arrays, plain numbers or "column -> array" dicts that ``pandas.DataFrame``
takes as they are (long format, one row per plotted point). The maths lives in the method modules
(``posviz.positions.*``); this module calls them and arranges what they return so a page can show it.

Shape legend: T positions, d width of a table (model or head dimension), d/2 frequency pairs,
H heads, n visible keys (keys at distances 0 .. n-1 from the query).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from .config import require
from .positions import POSITION_METHODS, ModelShape, build_position_method, method_names
from .positions.rope import RopeOptions, apply_rotary, rope_cos_sin
from .positions.rope_scaling import ROPE_SCALINGS, base_inv_freq
from .positions.sinusoidal import sinusoidal_shift_matrix, sinusoidal_table

Columns = dict[str, np.ndarray]


# =============================================================================================
# Sinusoidal absolute encodings (Vaswani et al. 2017, §3.5)
# =============================================================================================
def sinusoidal_pe(length: int, dim: int, base: float = 10000.0, offset: int = 0) -> np.ndarray:
    """The sinusoidal table in float64: (length, dim), columns interleaved (sin, cos) per pair."""
    return sinusoidal_table(length, dim, base, offset, dtype=torch.float64).numpy()


def wavelengths(dim: int, base: float) -> np.ndarray:
    """Wavelength in positions of each of the dim/2 frequency pairs: 2*pi / theta_i, (d/2,).

    The same geometric ladder serves sinusoidal tables (pair i = columns 2i, 2i+1) and RoPE
    (pair i = features i, i + d/2).
    """
    return (2 * math.pi / base_inv_freq(dim, base)).numpy()


def sinusoid_waves(length: int, dim: int, base: float, dims: Sequence[int]) -> Columns:
    """Chosen columns of the table as waves over position: columns position, dimension, value."""
    require(all(0 <= d < dim for d in dims), f"dimensions must be in 0..{dim - 1}, got {list(dims)}")
    table = sinusoidal_pe(length, dim, base)
    dims = [int(d) for d in dims]
    return {
        "position": np.tile(np.arange(length), len(dims)),
        "dimension": np.repeat(dims, length),
        "value": table[:, dims].T.ravel(),
    }


def binary_counting(length: int, dim: int, base: float = 10000.0) -> dict[str, Any]:
    """The binary-counting analogy: bits of p next to the sign bits of the sinusoidal table.

    Bit b of p flips every 2^b positions (period 2^(b+1)); the sign of sin(p * theta_i) flips every
    half wavelength. Both are "digits" that turn over at geometrically slower rates: the fastest on
    the left, the slowest on the right. Sinusoids are the smooth, continuous version, whose "digits"
    can be rotated into each other by a fixed linear map (see ``shift_check``).

    Returns bits (length, n_bits) of p, least significant first; sign_bits (length, d/2), 1 where
    sin(p * theta_i) < 0 (the second half of each period, like a binary digit being 1);
    bit_periods (n_bits,) = 2^(b+1) and pair_wavelengths (d/2,), both in positions.
    """
    require(length >= 1, "length must be at least 1")
    n_bits = max(1, int(length - 1).bit_length())
    p = np.arange(length)
    bits = (p[:, None] >> np.arange(n_bits)[None, :]) & 1
    sines = sinusoidal_pe(length, dim, base)[:, 0::2]  # (T, d/2)
    return {
        "bits": bits.astype(int),
        "sign_bits": (sines < 0).astype(int),
        "bit_periods": 2.0 ** (np.arange(n_bits) + 1),
        "pair_wavelengths": wavelengths(dim, base),
    }


@dataclasses.dataclass(frozen=True)
class ShiftCheck:
    """PE(p + k) = M_k PE(p), checked for every p in 0 .. length-1."""

    matrix: np.ndarray  # (d, d) M_k, block-diagonal 2x2 rotations
    errors: np.ndarray  # (length,) max_i |PE(p+k)_i - (M_k PE(p))_i| per position p
    max_error: float  # the largest of those
    example_position: int
    example_shifted: np.ndarray  # (d,) PE(p + k) at the example position
    example_mapped: np.ndarray  # (d,) M_k PE(p) at the example position


def shift_check(length: int, dim: int, k: int, base: float = 10000.0, example_position: int = 0) -> ShiftCheck:
    """Max error of PE(p + k) - M_k PE(p) over p = 0 .. length-1, in float64 (about 1e-15)."""
    require(length >= 1 and k >= 0, "need length >= 1 and k >= 0")
    require(0 <= example_position < length, f"example_position must be in 0..{length - 1}")
    m = sinusoidal_shift_matrix(dim, k, base).numpy()  # (d, d)
    table = sinusoidal_pe(length + k, dim, base)  # rows 0 .. length+k-1
    here, there = table[:length], table[k:length + k]  # PE(p), PE(p+k): (T, d)
    mapped = here @ m.T  # (T, d): M_k PE(p) for every p
    errors = np.abs(there - mapped).max(axis=1)
    p = example_position
    return ShiftCheck(m, errors, float(errors.max()), p, there[p], mapped[p])


def dot_product_vs_distance(dim: int, base: float, max_distance: int, references: Sequence[int]) -> Columns:
    """PE(p) . PE(p + delta) for delta in -max_distance .. max_distance, for each reference p.

    The curves for different p coincide (the dot product depends on delta only) and are symmetric in
    delta (it cannot tell before from after). Columns: reference, distance, dot.
    """
    require(max_distance >= 0, "max_distance must be >= 0")
    require(all(p >= max_distance for p in references), "every reference position must be >= max_distance")
    top = max(references) + max_distance + 1
    table = sinusoidal_pe(top, dim, base)
    deltas = np.arange(-max_distance, max_distance + 1)
    ref, dist, dot = [], [], []
    for p in references:
        ref.append(np.full(deltas.size, p))
        dist.append(deltas)
        dot.append(table[p + deltas] @ table[p])
    return {"reference": np.concatenate(ref), "distance": np.concatenate(dist), "dot": np.concatenate(dot)}


# =============================================================================================
# Learned absolute table (GPT-2 style)
# =============================================================================================
def learned_table(model) -> np.ndarray:
    """The trained position table of a ``learned`` model: (max_len, C) float64."""
    require(model.config.position == "learned", f"expected a 'learned' model, got {model.config.position!r}")
    return model.position.table.weight.detach().cpu().double().numpy()


def cosine_similarity(table: np.ndarray) -> np.ndarray:
    """(T, T) cosine similarity between the rows (positions) of a table."""
    table = np.asarray(table, dtype=float)
    norms = np.linalg.norm(table, axis=1, keepdims=True)
    unit = table / np.where(norms == 0, 1.0, norms)
    return unit @ unit.T


def pca_2d(table: np.ndarray) -> dict[str, Any]:
    """Project the rows onto their two main directions (SVD of the centred table).

    Returns position, pc1, pc2 (T,) and explained (2,) = share of the variance each direction holds.
    Signs are fixed so that the last position has non-negative coordinates (SVD signs are arbitrary).
    """
    table = np.asarray(table, dtype=float)
    require(table.ndim == 2 and table.shape[0] >= 2, "need a (T >= 2, C) table")
    centred = table - table.mean(axis=0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    coords = u[:, :2] * s[:2]  # (T, 2)
    if coords.shape[1] < 2:
        coords = np.pad(coords, ((0, 0), (0, 2 - coords.shape[1])))
    coords = coords * np.where(coords[-1] < 0, -1.0, 1.0)
    total = float((s**2).sum())
    explained = (s[:2] ** 2) / total if total > 0 else np.zeros(2)
    return {"position": np.arange(table.shape[0]), "pc1": coords[:, 0], "pc2": coords[:, 1],
            "explained": np.pad(explained, (0, 2 - explained.size))}


# =============================================================================================
# RoPE (Su et al. 2021)
# =============================================================================================
def _rotate(vectors: np.ndarray, positions: Sequence[int] | np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate row t of ``vectors`` (T, d) by position ``positions[t]`` with posviz's rotary code."""
    pos = torch.as_tensor(np.asarray(positions), dtype=torch.float64)
    cos, sin = rope_cos_sin(pos, torch.as_tensor(inv_freq, dtype=torch.float64), dtype=torch.float64)
    x = torch.as_tensor(np.asarray(vectors, dtype=float))
    return apply_rotary(x, cos, sin).numpy()


def rotate_2d(vector: Sequence[float], positions: Sequence[int], theta: float) -> np.ndarray:
    """One RoPE pair: the 2-D ``vector`` rotated by m * theta for each m in ``positions``: (len, 2)."""
    vec = np.asarray(vector, dtype=float)
    require(vec.shape == (2,), "vector must have two components")
    return _rotate(np.tile(vec, (len(positions), 1)), positions, np.array([theta]))


def rope_pair_path(vector: Sequence[float], max_position: int, theta: float) -> Columns:
    """The tip of one rotated pair at positions 0 .. max_position.

    Columns: position, x, y, angle_deg (the rotation m * theta, in degrees), norm (never changes).
    """
    pos = np.arange(max_position + 1)
    tips = rotate_2d(vector, pos, theta)
    return {"position": pos, "x": tips[:, 0], "y": tips[:, 1], "angle_deg": np.degrees(pos * theta),
            "norm": np.linalg.norm(tips, axis=1)}


def _angle_deg(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Signed angle from b to a in degrees, in [-180, 180]."""
    cross = b[..., 0] * a[..., 1] - b[..., 1] * a[..., 0]
    return np.degrees(np.arctan2(cross, (a * b).sum(axis=-1)))


def rope_pair_example(query: Sequence[float], key: Sequence[float], theta: float,
                      placements: Sequence[tuple[int, int]]) -> Columns:
    """A query and a key (2-D) placed at positions (m, n): their rotated forms, angle and dot product.

    The angle between the rotated vectors, and so q.k, depends on m - n only. Columns: m, n,
    offset, q_x, q_y, k_x, k_y (rotated), angle_deg (from k to q), dot.
    """
    ms = np.array([m for m, _ in placements])
    ns = np.array([n for _, n in placements])
    q = rotate_2d(query, ms, theta)
    k = rotate_2d(key, ns, theta)
    return {"m": ms, "n": ns, "offset": ms - ns, "q_x": q[:, 0], "q_y": q[:, 1], "k_x": k[:, 0], "k_y": k[:, 1],
            "angle_deg": _angle_deg(q, k), "dot": (q * k).sum(axis=1)}


def rope_frequency_table(head_dim: int, base: float, train_length: int) -> Columns:
    """Each rotary pair (GPT-NeoX split: features i and i + d/2): its speed, wavelength and turns.

    Columns: pair, first_feature, second_feature, theta (radians per position), wavelength
    (positions per full turn), turns_in_training (full turns within ``train_length`` positions).
    """
    require(head_dim >= 2 and head_dim % 2 == 0, "head_dim must be even and >= 2")
    theta = base_inv_freq(head_dim, base).numpy()
    half = head_dim // 2
    return {"pair": np.arange(half), "first_feature": np.arange(half), "second_feature": np.arange(half) + half,
            "theta": theta, "wavelength": 2 * math.pi / theta, "turns_in_training": train_length * theta / (2 * math.pi)}


def random_qk(head_dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A reproducible random query and key of one head: (d,), (d,)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(head_dim), rng.standard_normal(head_dim)


def rope_scores(query: np.ndarray, key: np.ndarray, length: int, base: float) -> np.ndarray:
    """(T, T) matrix of q_m . k_n: the query rotated to position m (row) and the key to n (column).

    Every diagonal (fixed m - n) is constant: the score depends on the offset only.
    """
    d = len(query)
    inv_freq = base_inv_freq(d, base).numpy()
    pos = np.arange(length)
    q = _rotate(np.tile(query, (length, 1)), pos, inv_freq)  # (T, d)
    k = _rotate(np.tile(key, (length, 1)), pos, inv_freq)  # (T, d)
    return q @ k.T


@dataclasses.dataclass(frozen=True)
class ShiftInvariance:
    score: float  # q_m . k_n
    shifted_score: float  # q_(m+s) . k_(n+s)
    difference: float  # |shifted_score - score|
    unrotated_score: float  # q . k before any rotation, for scale


def rope_shift_invariance(query: np.ndarray, key: np.ndarray, m: int, n: int, shift: int, base: float) -> ShiftInvariance:
    """q.k at (m, n) against (m + s, n + s), in float64: they agree to ~1e-15 relative."""
    d = len(query)
    inv_freq = base_inv_freq(d, base).numpy()
    q = _rotate(np.stack([query, query]), [m, m + shift], inv_freq)
    k = _rotate(np.stack([key, key]), [n, n + shift], inv_freq)
    a, b = float(q[0] @ k[0]), float(q[1] @ k[1])
    return ShiftInvariance(a, b, abs(a - b), float(np.dot(query, key)))


def rope_decay_bound(head_dim: int, base: float, max_distance: int, inv_freq: np.ndarray | None = None) -> Columns:
    """RoFormer §3.4.3 long-term decay: the relative upper bound of |q_m . k_n| against distance.

    With theta_k the pair speeds and S_j = sum_{k<j} exp(i (m-n) theta_k) (S_0 = 0), Abel summation
    bounds |sum_j h_j exp(i (m-n) theta_j)| by (max_j |h_(j+1) - h_j|) * sum_{j=1}^{d/2} |S_j|.
    The curve is the paper's Figure 2 quantity (1/(d/2)) sum_{j=1}^{d/2} |S_j|, for m - n = 0 ..
    max_distance. Columns: distance, bound.
    """
    require(max_distance >= 0, "max_distance must be >= 0")
    theta = base_inv_freq(head_dim, base).numpy() if inv_freq is None else np.asarray(inv_freq, dtype=float)
    distances = np.arange(max_distance + 1)
    bound = np.empty(distances.size)
    chunk = max(1, (1 << 20) // theta.size)  # keep the complex (chunk, d/2) block near 16 MB
    for start in range(0, distances.size, chunk):
        r = distances[start:start + chunk, None]  # (c, 1)
        partial = np.cumsum(np.exp(1j * r * theta[None, :]), axis=1)  # (c, d/2): S_1 .. S_(d/2)
        bound[start:start + chunk] = np.abs(partial).mean(axis=1)
    return {"distance": distances, "bound": bound}


def rope_norms(head_dim: int, base: float, length: int, seed: int = 0) -> Columns:
    """|x| before and after rotating one random vector to each position 0 .. length-1.

    Rotations are orthogonal, so the norm never changes. Columns: position, norm_before,
    norm_after, relative_change.
    """
    x, _ = random_qk(head_dim, seed)
    pos = np.arange(length)
    rotated = _rotate(np.tile(x, (length, 1)), pos, base_inv_freq(head_dim, base).numpy())
    before = np.full(length, np.linalg.norm(x))
    after = np.linalg.norm(rotated, axis=1)
    return {"position": pos, "norm_before": before, "norm_after": after, "relative_change": np.abs(after - before) / before}


def scaling_wavelengths(rot_dim: int, base: float, factor: float, original_length: int,
                        seq_len: int | None = None) -> Columns:
    """Wavelength of every rotary pair under every registered scaling (``ROPE_SCALINGS``).

    ``seq_len`` is the sequence length the dynamic scaling adapts to; by default the extended
    length factor * original_length. Columns: scaling, pair, wavelength (positions), theta,
    attention_factor (multiplies cos and sin), logit_scale (its square: what the logits are scaled by).
    """
    require(factor >= 1, f"factor must be >= 1, got {factor}")
    seq_len = int(round(factor * original_length)) if seq_len is None else seq_len
    out: dict[str, list] = {"scaling": [], "pair": [], "wavelength": [], "theta": [], "attention_factor": []}
    for name, fn in ROPE_SCALINGS.items():
        opts = RopeOptions(base=base, scaling=name, factor=factor, original_length=original_length)
        inv_freq, attention = fn(rot_dim, opts, seq_len)
        theta = inv_freq.double().numpy()
        out["scaling"] += [name] * theta.size
        out["pair"] += list(range(theta.size))
        out["wavelength"] += list(2 * math.pi / theta)
        out["theta"] += list(theta)
        out["attention_factor"] += [float(attention)] * theta.size
    columns = {k: np.asarray(v) for k, v in out.items()}
    columns["logit_scale"] = columns["attention_factor"] ** 2
    return columns


# =============================================================================================
# Checkpoints: the method table, the headline chart, the per-checkpoint facts
# =============================================================================================
ACTS_ON_LABEL = {
    "input": "input (added)",
    "q/k": "queries & keys (rotated)",
    "logits": "logits (bias)",
    "nothing": "nowhere",
}
KV_CACHE_REASON = {  # why a method works with a KV cache: shown as help next to the table
    "input": "the position is baked into each cached key and value",
    "q/k": "keys are cached already rotated to their own positions",
    "logits": "the bias is recomputed from the cached keys' positions",
    "nothing": "there is no position to keep",
}
EXTRAPOLATION_MULTIPLE = 16  # "extrapolates": bits/byte at 16x the training length against 1x
EXTRAPOLATES_WITHIN_BPB = 0.05  # at most this much worse: "yes"
DEGRADES_WITHIN_BPB = 0.5  # at most this much worse: "partly"; worse still: "no"


def train_length_of(metrics: Mapping[str, Any]) -> int | None:
    """The training length of a checkpoint, read from its eval block (the length at multiple 1)."""
    ratios = (metrics.get("eval") or {}).get("lengths_x_train") or {}
    ones = [int(n) for n, r in ratios.items() if r == 1]
    return ones[0] if ones else None


def bpb_by_length(metrics: Mapping[str, Any]) -> dict[int, float | None]:
    """{evaluation length: bits/byte or None (cannot run)} from a metrics.json dict."""
    table = (metrics.get("eval") or {}).get("nonoverlapping_bpb") or {}
    return {int(n): (None if v is None else float(v)) for n, v in sorted(table.items(), key=lambda kv: int(kv[0]))}


def extrapolation(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """bits/byte at 1x and at 16x (or the longest evaluated multiple) the training length, and a verdict.

    Keys: bpb_1x, bpb_long, long_multiple, verdict ("yes", "partly", "no" or "unknown"), reason.
    """
    if not metrics:
        return {"bpb_1x": None, "bpb_long": None, "long_multiple": None, "verdict": "unknown", "reason": "no checkpoint"}
    train = train_length_of(metrics)
    table = bpb_by_length(metrics)
    if train is None or train not in table or table[train] is None:
        return {"bpb_1x": None, "bpb_long": None, "long_multiple": None, "verdict": "unknown",
                "reason": "not evaluated yet"}
    longer = [n for n in table if n > train]
    target = train * EXTRAPOLATION_MULTIPLE
    long = target if target in table else (max(longer) if longer else None)
    if long is None:
        return {"bpb_1x": table[train], "bpb_long": None, "long_multiple": None, "verdict": "unknown",
                "reason": "not evaluated past the training length"}
    multiple = long / train
    if table[long] is None:
        return {"bpb_1x": table[train], "bpb_long": None, "long_multiple": multiple, "verdict": "no",
                "reason": f"cannot run past {train:,} positions"}
    worse = table[long] - table[train]
    verdict = "yes" if worse <= EXTRAPOLATES_WITHIN_BPB else "partly" if worse <= DEGRADES_WITHIN_BPB else "no"
    return {"bpb_1x": table[train], "bpb_long": table[long], "long_multiple": multiple, "verdict": verdict,
            "reason": f"{worse:+.2f} bits/byte at {multiple:g}x"}


def extrapolation_label(ext: Mapping[str, Any]) -> str:
    """The verdict, plus why when the numbers beside it do not say it (no run, or a shorter multiple)."""
    if ext["bpb_long"] is None:
        return "no (cannot run)" if ext["verdict"] == "no" else f"{ext['verdict']} ({ext['reason']})"
    if ext["long_multiple"] != EXTRAPOLATION_MULTIPLE:
        return f"{ext['verdict']} ({ext['reason']})"
    return ext["verdict"]


def method_rows(metrics_by_name: Mapping[str, Mapping[str, Any] | None], train_length: int | None = None) -> list[dict]:
    """One row per registered method (display order) for the home page's comparison table.

    Built from each method's ClassVars; "extrapolates" from the shipped metrics (``extrapolation``).
    Position limits use each checkpoint's training length, else ``train_length``, else the recipe's.
    """
    from .train import TrainConfig

    rows = []
    for name in method_names():
        cls = POSITION_METHODS[name]
        metrics = metrics_by_name.get(name)
        length = (metrics and train_length_of(metrics)) or train_length or TrainConfig().train_length
        method = build_position_method(name, ModelShape(1, 1, 2, 2, length))
        limit = method.max_positions
        cache = "yes" if limit is None else f"yes (≤ {limit:,})"  # positions: the table has that many rows
        ext = extrapolation(metrics_by_name.get(name))
        rows.append({
            "method": name,
            "summary": cls.summary,
            "absolute / relative": cls.kind if cls.kind != "none" else "neither",
            "fixed / learned": "learned" if cls.learned else "fixed",
            "acts on": ACTS_ON_LABEL.get(cls.acts_on, cls.acts_on),
            "KV-cacheable": cache,
            "bits/byte @ 1×": ext["bpb_1x"],
            f"bits/byte @ {EXTRAPOLATION_MULTIPLE}×": ext["bpb_long"],
            "extrapolates": extrapolation_label(ext),
            "paper": cls.paper,
        })
    return rows


def bpb_vs_length_rows(metrics_by_name: Mapping[str, Mapping[str, Any]]) -> Columns:
    """Long-format rows of the headline chart: checkpoint, length, multiple, bpb (runs that exist)."""
    out: dict[str, list] = {"checkpoint": [], "length": [], "multiple": [], "bpb": []}
    for name, metrics in metrics_by_name.items():
        train = train_length_of(metrics)
        for n, bpb in bpb_by_length(metrics).items():
            if bpb is None:
                continue
            out["checkpoint"].append(name)
            out["length"].append(n)
            out["multiple"].append(n / train if train else float("nan"))
            out["bpb"].append(bpb)
    return {k: np.asarray(v) for k, v in out.items()}


def checkpoint_rows(configs: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, Mapping[str, Any]]) -> list[dict]:
    """Per-checkpoint facts for the About page from config.json and metrics.json dicts."""
    rows = []
    for name, config in configs.items():
        m = metrics.get(name) or {}
        trained = config.get("trained_on") or {}
        model = config.get("model") or {}
        rows.append({
            "checkpoint": name,
            "parameters": m.get("parameters"),
            "training tokens (bytes)": m.get("tokens"),
            "steps": m.get("steps"),
            "train length": model.get("train_length"),
            "training time (min)": None if trained.get("seconds") is None else round(trained["seconds"] / 60, 1),
            "device": " · ".join(str(x) for x in (trained.get("device"), trained.get("processor")) if x),
            "val bits/byte @ train length": m.get("val_bpb_at_train_length"),
        })
    return rows


def recipe_rows() -> list[dict]:
    """The shared training recipe: every TrainConfig field with its default (the shipped set's value)."""
    from .train import TrainConfig

    recipe = TrainConfig()
    rows = []
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("method", "position_options"):
            continue  # the one thing that differs between checkpoints
        value = getattr(recipe, f.name)
        rows.append({"setting": f.name, "value": "(standard library of this Python)" if value is None and f.name == "corpus"
                     else str(value)})
    rows.insert(0, {"setting": "steps", "value": str(recipe.steps)})
    return rows


def train_curve_rows(metrics_by_name: Mapping[str, Mapping[str, Any]]) -> Columns:
    """Long-format training curves: checkpoint, tokens, train_bpb (from each metrics.json's train_curve)."""
    out: dict[str, list] = {"checkpoint": [], "tokens": [], "train_bpb": []}
    for name, metrics in metrics_by_name.items():
        for point in metrics.get("train_curve") or []:
            out["checkpoint"].append(name)
            out["tokens"].append(point.get("tokens"))
            out["train_bpb"].append(point.get("train_bpb"))
    return {k: np.asarray(v) for k, v in out.items()}
