"""Bootstrap intervals over evaluation windows (posviz.labs.intervals) against what they must be."""
from __future__ import annotations

import numpy as np
import pytest

from posviz.labs import intervals


def test_the_interval_of_a_mean_matches_the_normal_approximation_on_many_windows():
    """For many independent windows the percentile interval is mean ± 1.96 sd / sqrt(n), to a few percent."""
    rng = np.random.default_rng(1)
    x = rng.normal(1.5, 0.4, size=2000)
    low, high = intervals.mean_interval(x)
    se = x.std(ddof=1) / np.sqrt(x.size)
    assert low < x.mean() < high
    assert (high - low) / (2 * 1.96 * se) == pytest.approx(1.0, rel=0.08)


def test_a_paired_difference_is_surer_than_either_score():
    """Two models on the same windows: the text's difficulty moves both, and cancels in their difference."""
    rng = np.random.default_rng(2)
    text = rng.normal(1.5, 0.5, size=256)  # how hard each window is
    a, b = text + rng.normal(0, 0.02, 256), text + 0.01 + rng.normal(0, 0.02, 256)
    lo, hi = intervals.difference_interval(b, a)
    assert 0 < lo < 0.01 < hi < 0.02  # b is surely worse, by about 0.01
    assert hi - lo < 0.1 * (np.subtract(*intervals.mean_interval(a)[::-1]))


def test_the_same_windows_give_the_same_interval_and_bad_input_says_why():
    x = np.linspace(1.0, 2.0, 50)
    assert intervals.mean_interval(x) == intervals.mean_interval(list(x))
    assert intervals.half_width(x) >= max(x.mean() - intervals.mean_interval(x)[0], 0)
    with pytest.raises(ValueError, match="at least 2 windows"):
        intervals.mean_interval([1.0])
    with pytest.raises(ValueError, match="must match"):
        intervals.difference_interval([1.0, 2.0], [1.0, 2.0, 3.0])
