"""Unit tests of posviz.labs.compare (the Compare lab: method A vs B, length L vs 2L) on tiny random models.
Attention weights are sharpened (``sharp``) so that position effects are large enough to see in a
random model."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_lab, tiny_model
from maths_support import sharp, text_ids  # noqa: F401  (text_ids: a fixture)

from posviz.models.shipped import as_lab_model
from posviz.labs import compare, extrapolation
from posviz.positions import method_names


# ------------------------------------------------------------------------------------------------
# Comparisons
# ------------------------------------------------------------------------------------------------
UNBOUNDED = [m for m in method_names() if tiny_lab(m).position.max_positions is None]


@pytest.mark.parametrize("method", UNBOUNDED)
def test_compare_lengths_first_half_is_identical(method, text_ids):
    """By causality a byte in the first half of a 2L window has the same context as in a window of L."""
    out = compare.compare_lengths(tiny_lab(method), text_ids, 32)
    assert out["position"].shape == (64,)
    assert np.allclose(out["diff"][:32], 0.0, atol=1e-5)
    assert np.isfinite(out["diff"]).all() and not np.allclose(out["diff"][32:], 0.0, atol=1e-5)


def test_compare_methods_and_attention_difference(text_ids):
    a, b = tiny_lab("nope"), tiny_lab("alibi")
    out = compare.compare_methods(a, b, text_ids, 32)
    assert np.allclose(out["diff"][1:], out["b"][1:] - out["a"][1:])
    assert out["bpb_a"] == pytest.approx(extrapolation.score_at_length(a, text_ids, 32).bpb)
    maps = compare.attention_difference(sharp(a), sharp(b), text_ids, 32, 0, 1)
    assert maps["block"] == 1 and np.allclose(maps["diff"], maps["b"] - maps["a"], equal_nan=True)
    assert np.isnan(maps["diff"][0, 1]) and maps["max_abs_diff"] > 0.01


def test_length_attention_difference_renormalises_for_relative_methods(text_ids):
    """Layer 0 of a relative method: attention on the second half of a 2L window, renormalised over
    those keys, is the attention of the same bytes alone (only distances and contents matter)."""
    model = as_lab_model(sharp(tiny_model("alibi")))
    out = compare.length_attention_difference(model, text_ids, 32, layer=0, head=3)
    assert out["far_mass"].shape == (32,) and ((out["far_mass"] >= 0) & (out["far_mass"] <= 1)).all()
    renormalised = out["long"] / (1 - out["far_mass"])[:, None]
    assert np.allclose(renormalised, out["short"], atol=1e-4, equal_nan=True)
    absolute = compare.length_attention_difference(as_lab_model(sharp(tiny_model("sinusoidal"))), text_ids, 32, layer=0, head=3)
    renormalised = absolute["long"] / (1 - absolute["far_mass"])[:, None]
    assert np.nanmax(np.abs(renormalised - absolute["short"])) > 0.01  # positions moved by L: a different map


def test_attention_maps_on_a_log_scale_keep_the_probability_difference(text_ids):
    """The Compare lab draws A and B as log10 probability by default; B - A stays a difference of probabilities."""
    from posviz.labs.attention_maps import LOG_FLOOR

    a, b = as_lab_model(sharp(tiny_model("nope"))), as_lab_model(sharp(tiny_model("alibi")))
    linear = compare.attention_difference(a, b, text_ids, 32, 0, 1)
    logged = compare.attention_difference(a, b, text_ids, 32, 0, 1, log_scale=True)
    assert linear["block"] == logged["block"] == 1  # nothing pooled at 32 bytes: entry by entry
    for side in ("a", "b"):
        assert np.allclose(logged[side], np.log10(np.maximum(linear[side], LOG_FLOOR)), equal_nan=True)
        assert np.nanmin(logged[side]) < 0 <= np.nanmin(linear[side])
    assert np.allclose(logged["diff"], linear["diff"], equal_nan=True)
    plain = compare.length_attention_difference(a, text_ids, 16, layer=0, head=1)
    lengths = compare.length_attention_difference(a, text_ids, 16, layer=0, head=1, log_scale=True)
    for part in ("short", "long"):
        assert np.allclose(lengths[part], np.log10(np.maximum(plain[part], LOG_FLOOR)), equal_nan=True)
    assert np.allclose(lengths["diff"], plain["diff"], equal_nan=True)
