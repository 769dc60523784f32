"""The numbers behind the RoPE page (Su et al. 2021): pure functions, no plotting, no Streamlit.

One rotary pair turning with the position, a query and a key whose dot product depends on their
offset only, every pair's speed and wavelength, the long-term decay bound, the norm a rotation keeps,
and the wavelengths under every registered context-extension scaling.

Every function returns numpy arrays, plain numbers or "column -> array" dicts that ``pandas.DataFrame``
takes as they are (long format, one row per plotted point). The rotations are posviz's own rotary
code (``posviz.positions.rope``, the method itself) run in float64; this module arranges what it
returns so the page can show it. The Context extension lab's live numbers are in
``posviz.labs.context_extension``.

Shape legend: T positions, d head dimension, d/2 frequency pairs (GPT-NeoX split: features i and i + d/2).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
import torch

from posviz.config import require
from posviz.positions.rope import RopeOptions, apply_rotary, rope_cos_sin
from posviz.positions.rope_scaling import ROPE_SCALINGS, base_inv_freq

Columns = dict[str, np.ndarray]


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


def frequency_sentence(table, train_length: int) -> str:
    """What the frequency chart shows, in one sentence from its rows (``rope_frequency_table``)."""
    wavelength, turns = np.asarray(table["wavelength"]), np.asarray(table["turns_in_training"])
    never = int((turns < 1).sum())
    return (f"The fastest of the {len(wavelength)} pairs turns once every {wavelength.min():,.1f} positions, the slowest "
            f"once every {wavelength.max():,.0f}; {never} of them never complete a turn in the {train_length:,} positions "
            "of training.")


def decay_sentence(table) -> str:
    """What the decay chart shows, in one sentence from its rows (``rope_decay_bound``)."""
    distance, bound = np.asarray(table["distance"]), np.asarray(table["bound"])
    at = int(distance[-1])
    return (f"The bound on a query–key score starts at {bound[0]:.2f} for a key at the query's own position and is "
            f"{bound[-1]:.2f} at distance {at:,}: {bound[-1] / bound[0]:.0%} of it.")


def pairs_beside_rope(inv_freq, plain_inv_freq, train_length: int) -> Columns:
    """A rotary method's pairs next to RoPE's with the same θ (p-RoPE: its fastest pairs turn as RoPE's, the
    rest stand still). Columns: pair, theta and wavelength (NaN for a pair that stands still: it never turns),
    plain_theta, plain_wavelength, turns_in_training (0 for a still pair), rotates (bool)."""
    theta = np.asarray(inv_freq, dtype=np.float64)
    plain = np.asarray(plain_inv_freq, dtype=np.float64)
    require(theta.shape == plain.shape, "the two methods must have as many pairs")
    rotates = theta > 0
    with np.errstate(divide="ignore"):
        wavelength = np.where(rotates, 2 * math.pi / np.where(rotates, theta, 1.0), np.nan)
    return {"pair": np.arange(len(theta)), "theta": theta, "wavelength": wavelength, "plain_theta": plain,
            "plain_wavelength": 2 * math.pi / plain, "turns_in_training": train_length * theta / (2 * math.pi),
            "rotates": rotates}


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
# Published RoPE models: their own frequencies against the plain θ ladder
# =============================================================================================
SAME_RTOL = 1e-4  # transformers builds inv_freq in float32: the same ladder agrees to ~1e-6 relative


def published_wavelengths(inv_freq, theta: float, rotary_dims: int) -> Columns:
    """Each rotary pair of a published model: its speed and wavelength as the model computes them
    (``inv_freq`` from its own rotary module, under its own scaling) next to the plain ladder
    θ^(−2i/d) over its ``rotary_dims`` rotated features.

    Columns: pair, first_feature, second_feature (features i and i + d/2 of the rotated part),
    inv_freq (radians per token), wavelength (tokens per full turn), plain_inv_freq, plain_wavelength,
    ratio (wavelength / plain_wavelength) and band: "as θ gives" (ratio 1), "stretched ×s" (the
    largest ratio s > 1, e.g. llama3's and YaRN's slow pairs, every pair under linear scaling) or
    "in between" (a blend, e.g. llama3's smoothed band).
    """
    require(rotary_dims >= 2 and rotary_dims % 2 == 0, f"rotary_dims must be even and >= 2, got {rotary_dims}")
    speed = (inv_freq.detach().cpu().double().numpy() if isinstance(inv_freq, torch.Tensor)
             else np.asarray(inv_freq, dtype=float))
    half = rotary_dims // 2
    require(speed.shape == (half,), f"expected {half} frequencies for {rotary_dims} rotated features, got {speed.shape}")
    require(bool(np.all(speed > 0)), "frequencies must be positive")
    plain = base_inv_freq(rotary_dims, theta).double().numpy()
    ratio = plain / speed  # wavelength / plain wavelength
    top = float(ratio.max())
    same = np.isclose(ratio, 1.0, rtol=SAME_RTOL, atol=0)
    stretched = ~same & (top > 1 + SAME_RTOL) & np.isclose(ratio, top, rtol=SAME_RTOL, atol=0)
    band = np.where(same, "as θ gives", np.where(stretched, f"stretched ×{top:.3g}", "in between"))
    return {"pair": np.arange(half), "first_feature": np.arange(half), "second_feature": np.arange(half) + half,
            "inv_freq": speed, "wavelength": 2 * math.pi / speed, "plain_inv_freq": plain,
            "plain_wavelength": 2 * math.pi / plain, "ratio": ratio, "band": band}


@dataclasses.dataclass(frozen=True)
class PublishedRope:
    """What the RoPE page shows of one published RoPE model, read from the model itself."""

    name: str
    family: str
    theta: float
    rope_type: str  # transformers' name of its scaling: default, llama3, yarn, linear, dynamic, ...
    factor: float | None  # the scaling's factor (None: no scaling)
    original_length: int | None  # the context the scaling extends (llama3, yarn), in tokens
    train_length: int  # the context its config states, in tokens
    rotary_dims: int
    head_dim: int
    attention_factor: float  # multiplies cos and sin (YaRN's 0.1 ln s + 1)
    notes: list[str]
    columns: Columns  # ``published_wavelengths``

    @property
    def rotary_share(self) -> float:
        """The share of each head's features that rotate (Pythia: 0.25; the rest carry no position)."""
        return self.rotary_dims / self.head_dim


def published_rope(model) -> PublishedRope:
    """The frequencies of a published RoPE model (a ``PublishedModel`` whose method is rope) under its
    own scaling, against the plain ladder of its own θ."""
    require(getattr(model, "method", None) == "rope", f"expected a RoPE model, got {getattr(model, 'method', None)!r}")
    pos = model.position
    params = dict(model.rope_parameters or {})
    theta = float(params.get("rope_theta", 10000.0))
    factor = params.get("factor")
    original = params.get("original_max_position_embeddings")
    return PublishedRope(
        name=model.name, family=pos.family, theta=theta, rope_type=str(params.get("rope_type", "default")),
        factor=None if factor is None else float(factor), original_length=None if original is None else int(original),
        train_length=int(model.train_length), rotary_dims=int(pos.rotary_dims), head_dim=int(pos.head_dim),
        attention_factor=float(pos.attention_factor), notes=list(pos.notes),
        columns=published_wavelengths(pos.inv_freq, theta, int(pos.rotary_dims)))


@dataclasses.dataclass
class RemapView:
    """What the RoPE page draws of a training-free remap at ``length``: the relative position every causal pair is
    attended at (NaN above the diagonal), its parameters there and the largest position a pair sees."""

    matrix: np.ndarray  # (length, length)
    parameters: dict
    largest: float  # the largest relative position any pair sees
    plain_largest: int  # length - 1: what plain RoPE would show it


def remap_view(name: str, train_length: int, length: int) -> RemapView:
    """``rope_remaps.relative_position_matrix`` of ``name`` with its defaults covering ``length``."""
    from posviz.positions.rope_remaps import ROPE_REMAPS, relative_position_matrix

    matrix = relative_position_matrix(name, None, train_length, length).numpy()
    return RemapView(matrix, ROPE_REMAPS[name].settings(None, train_length, length), float(np.nanmax(matrix)), length - 1)
