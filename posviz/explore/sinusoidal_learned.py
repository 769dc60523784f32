"""The numbers behind the Sinusoidal & learned page: pure functions, no plotting, no Streamlit.

The sinusoidal table of Vaswani et al. (2017, §3.5) as waves, as binary-counting "digits", its shift
by a fixed rotation and its dot product by distance; the trained table of the ``learned`` checkpoint
(GPT-2 style) through its cosine similarities and its two main directions.

Every function returns numpy arrays, plain numbers or "column -> array" dicts that ``pandas.DataFrame``
takes as they are (long format, one row per plotted point). The maths lives in the method modules
(``posviz.positions.*``); this module calls them and arranges what they return so the page can show it.

Shape legend: T positions, d width of a table (model or head dimension), d/2 frequency pairs.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
import torch

from posviz.config import require
from posviz.positions.rope_scaling import base_inv_freq
from posviz.positions.sinusoidal import sinusoidal_shift_matrix, sinusoidal_table

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
# Learned tables of published models (GPT-2, OPT): a (rows, C) tensor, position 0 first
# =============================================================================================
def _as_table(table) -> np.ndarray:
    """A (rows >= 2, C) table as float64 numpy, from a torch tensor or an array."""
    if isinstance(table, torch.Tensor):
        table = table.detach().cpu().double().numpy()
    table = np.asarray(table, dtype=float)
    require(table.ndim == 2 and table.shape[0] >= 2 and table.shape[1] >= 1, "need a (rows >= 2, C) position table")
    return table


def block_mean(matrix: np.ndarray, max_side: int) -> tuple[np.ndarray, int]:
    """A matrix averaged over square blocks of ``block`` x ``block`` entries, the smallest block that
    leaves at most ``max_side`` rows and columns; the last blocks average what is left. Returns
    (pooled, block); block 1 gives the matrix as it is."""
    matrix = np.asarray(matrix, dtype=float)
    require(matrix.ndim == 2 and max_side >= 1, "need a 2-D matrix and max_side >= 1")
    h, w = matrix.shape
    block = max(1, math.ceil(max(h, w) / max_side))
    if block == 1:
        return matrix, 1
    rows = np.add.reduceat(matrix, np.arange(0, h, block), axis=0)
    sums = np.add.reduceat(rows, np.arange(0, w, block), axis=1)
    counts = np.outer(np.diff(np.append(np.arange(0, h, block), h)), np.diff(np.append(np.arange(0, w, block), w)))
    return sums / counts, block


def position_similarity(table, max_side: int = 512) -> tuple[np.ndarray, int]:
    """Cosine similarity between every two positions of a (rows, C) table, pooled to at most
    ``max_side`` a side (GPT-2's 1,024 rows in 2 x 2 blocks, OPT's 2,048 in 4 x 4). Returns (matrix, block)."""
    return block_mean(cosine_similarity(_as_table(table)), max_side)


def neighbour_similarity(table) -> float:
    """The mean cosine similarity of positions p and p + 1: near 1 when the table varies smoothly."""
    t = _as_table(table)
    norms = np.linalg.norm(t, axis=1)
    norms = np.where(norms == 0, 1.0, norms)
    return float(np.mean((t[:-1] * t[1:]).sum(axis=1) / (norms[:-1] * norms[1:])))


@dataclasses.dataclass(frozen=True)
class TableComponents:
    """The leading principal components of a position table (SVD of the table minus its mean row)."""

    coords: np.ndarray  # (rows, k): each position's coordinate along each component
    explained: np.ndarray  # (k,) share of the table's variance along each component

    def columns(self) -> Columns:
        """Long format for a line chart: position, component (1..k), value."""
        rows, k = self.coords.shape
        return {"position": np.tile(np.arange(rows), k), "component": np.repeat(np.arange(1, k + 1), rows),
                "value": self.coords.T.ravel()}


def principal_components(table, k: int = 4) -> TableComponents:
    """The first ``k`` principal components of a (rows, C) table against position.

    The rows are centred (the mean row removed); ``coords[:, j]`` = u_j s_j of its SVD, the position's
    coordinate along direction j, with the sign chosen so that the coordinate of largest magnitude is
    positive (SVD signs are arbitrary). ``explained[j]`` = s_j² / Σ s². Fewer than ``k`` when the table
    has fewer rows or columns.

    Computed from the eigenvectors of the smaller Gram matrix (C x C, or rows x rows), whose eigenvalues
    are the s_j²: a full SVD of OPT's 2,048 x 768 table took seconds to tens of seconds on 2 shared cores.
    """
    t = _as_table(table)
    require(k >= 1, "k must be >= 1")
    centred = t - t.mean(axis=0)
    k = min(k, *centred.shape)
    by_column = centred.shape[0] >= centred.shape[1]
    values, vectors = np.linalg.eigh(centred.T @ centred if by_column else centred @ centred.T)  # ascending
    values, vectors = np.clip(values[::-1], 0, None), vectors[:, ::-1]
    coords = centred @ vectors[:, :k] if by_column else vectors[:, :k] * np.sqrt(values[:k])
    biggest = coords[np.abs(coords).argmax(axis=0), np.arange(k)]
    coords = coords * np.where(biggest < 0, -1.0, 1.0)
    total = float(values.sum())
    explained = values[:k] / total if total > 0 else np.zeros(k)
    return TableComponents(coords, explained)


def published_learned_table(table, k: int = 4, max_side: int = 512) -> dict[str, Any]:
    """What the Sinusoidal & learned page shows of a published learned table (rows, C): shape,
    similarity (``position_similarity``, pooled to ``max_side``) and its block, neighbours
    (``neighbour_similarity``) and components (``principal_components``, the first ``k``)."""
    t = _as_table(table)
    similarity, block = position_similarity(t, max_side)
    return {"shape": t.shape, "similarity": similarity, "block": block, "neighbours": neighbour_similarity(t),
            "components": principal_components(t, k)}


def pe_sentence(length: int, dim: int, base: float) -> str:
    """What the sinusoidal table shows, in one sentence from its own waves: how many of its pairs repeat within the
    positions drawn, and how many barely move there (less than a tenth of a turn)."""
    waves = wavelengths(dim, base)
    turns = length / waves
    return (f"Each of the {length:,} rows is one position's {dim} values. The fastest of the {len(waves)} pairs "
            f"repeats every {waves.min():.1f} positions; {int((turns >= 1).sum())} pairs complete a turn within these "
            f"{length:,} positions, and {int((turns < 0.1).sum())} move less than a tenth of a turn: almost constant.")
