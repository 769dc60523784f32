"""How much a bits-per-byte number moves with the text it was measured on: bootstrap intervals over the
evaluation windows (Efron & Tibshirani 1993, the percentile interval).

A score is the mean of its non-overlapping windows' bits per byte (every window has the same number of bytes).
Resampling the windows with replacement and taking the mean again, many times, gives the spread a score would
have on another text drawn like this one; its 2.5th and 97.5th percentiles are the 95 % interval. Two models
scored on the same windows are compared window by window (a paired bootstrap of the differences): the text's
own difficulty cancels, so a difference can be far surer than either score.

What this does not measure: the training seed (each shipped checkpoint is one training run), nor the windows'
neighbours being alike (windows of one file are resampled as if independent, so the intervals are if anything
narrow). Seeded, so that the same windows always give the same interval.
"""
from __future__ import annotations

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0


def bootstrap_means(values, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(resamples,) the mean of ``values`` over windows drawn with replacement, ``resamples`` times."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"a bootstrap needs at least 2 windows, got {x.size}")
    draws = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    return x[draws].mean(axis=1)


def mean_interval(values, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """(low, high): the percentile bootstrap interval of the mean of ``values`` at ``level``."""
    means = bootstrap_means(values, resamples, seed)
    tail = (1.0 - level) / 2.0
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


def difference_interval(a, b, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """(low, high) of mean(a) - mean(b) for two models scored on the same windows (paired: window i of ``a`` and
    of ``b`` are the same bytes)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired windows must match: {a.shape} and {b.shape}")
    return mean_interval(a - b, level, resamples, seed)


def half_width(values, level: float = LEVEL) -> float:
    """The larger side of the interval around the mean: what "± x" says of a score."""
    low, high = mean_interval(values, level)
    mean = float(np.mean(values))
    return max(mean - low, high - mean)
