"""Unit tests of posviz.labs.context_extension's inference-time RoPE scalings, and of the shipped curves the
Extrapolation and Context extension labs draw, on tiny checkpoints."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import tiny_lab, tiny_model
from maths_support import sharp, text_ids  # noqa: F401  (text_ids: a fixture)

from posviz.models.shipped import as_lab_model
from posviz.models.interface import open_model
from posviz.labs import context_extension, extrapolation
from posviz.errors import PosvizError
from posviz.limits import max_eval_length
from posviz.positions import method_names
from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.positions.rope_scaling import ROPE_SCALINGS, base_inv_freq


# ------------------------------------------------------------------------------------------------
# RoPE context extension
# ------------------------------------------------------------------------------------------------
def test_rope_scaling_curves_cover_the_registry(tiny_models, text_ids):
    folder = tiny_models / "rope"
    lengths = context_extension.extension_lengths(32, max_eval_length(32), len(text_ids))
    assert lengths == [32, 64, 128, 256, 512]
    offered = context_extension.extensions(open_model(folder))  # every scaling, then the remaps a checkpoint takes
    assert offered == list(ROPE_SCALINGS) + list(ROPE_REMAPS)
    rows = context_extension.rope_scaling_curves(open_model(folder), 4.0, text_ids, lengths[:3], offered)
    assert {r["scaling"] for r in rows} == set(offered)
    bpb = {(r["scaling"], r["length"]): r["bpb"] for r in rows}
    dca = open_model(folder, {"remap": "dca", "factor": 4.0})  # a remap's curve: its defaults covering 4x
    assert bpb[("dca", 128)] == pytest.approx(extrapolation.score_at_length(dca, text_ids, 128).bpb, abs=1e-6)
    plain = open_model(folder)
    assert bpb[("none", 64)] == pytest.approx(extrapolation.score_at_length(plain, text_ids, 64).bpb, abs=1e-6)
    linear = open_model(folder, {"scaling": "linear", "factor": 4.0})
    assert bpb[("linear", 64)] == pytest.approx(extrapolation.score_at_length(linear, text_ids, 64).bpb, abs=1e-6)
    assert bpb[("linear", 64)] != pytest.approx(bpb[("none", 64)], abs=1e-7)
    with pytest.raises(PosvizError, match="Unknown RoPE scaling"):
        context_extension.scaling_overrides("magic", 2.0)


def assert_same_scores(fast: dict, model, text_ids, lengths):
    for n in lengths:
        slow = extrapolation.score_at_length(model, text_ids, n)
        got = fast[n]
        assert (got.n_windows, got.n_ids) == (slow.n_windows, slow.n_ids), n
        assert np.allclose(got.id_bits, slow.id_bits, atol=1e-5, equal_nan=True), (n, np.nanmax(abs(got.id_bits - slow.id_bits)))
        assert got.bpb == pytest.approx(slow.bpb, abs=1e-5) and np.allclose(got.position_bits, slow.position_bits, atol=1e-5)


@pytest.mark.parametrize("method", method_names())
def test_length_scores_equal_scoring_each_length_alone(method, text_ids):
    """Every length's windows read from the longest window at each start: the numbers of score_at_length."""
    model = as_lab_model(sharp(tiny_model(method)))
    lengths = [8, 16, 32] if model.position.max_positions is not None else [32, 64, 128, 256, 512]  # learned: 32 rows
    assert context_extension.prefixes_hold(model, lengths)
    assert_same_scores(context_extension.length_scores(model, text_ids, lengths), model, text_ids, lengths)
    short = text_ids[:300]  # shorter than the budget: fewer windows at each length, not a power of two of them
    assert_same_scores(context_extension.length_scores(model, short, lengths[:3]), model, short, lengths[:3])


@pytest.mark.parametrize("scaling", list(ROPE_SCALINGS))
def test_length_scores_under_every_rope_scaling(scaling, text_ids):
    """Dynamic NTK picks its frequencies by the window's length, so a prefix is not a shorter window:
    each length then runs on its own. The static scalings share the passes."""
    model = as_lab_model(sharp(tiny_model("rope", position_options=context_extension.scaling_overrides(scaling, 4.0))))
    lengths = [32, 64, 128, 256, 512]
    assert context_extension.prefixes_hold(model, lengths) == (scaling not in ("dynamic", "longrope"))
    assert_same_scores(context_extension.length_scores(model, text_ids, lengths), model, text_ids, lengths)


def test_reference_curve_leaves_out_lengths_the_method_cannot_represent(tiny_models, text_ids):
    rows = context_extension.reference_curve(open_model(tiny_models / "learned"), text_ids, [16, 32, 64])
    assert [r["length"] for r in rows] == [16, 32]  # a table of 32 rows
    learned = open_model(tiny_models / "learned")
    assert rows[1]["bpb"] == pytest.approx(extrapolation.score_at_length(learned, text_ids, 32).bpb, abs=1e-5)
    alibi = context_extension.reference_curve(open_model(tiny_models / "alibi"), text_ids, [32, 64])
    assert [r["length"] for r in alibi] == [32, 64]


def test_rope_wavelengths(tiny_models):
    rows = context_extension.rope_wavelengths(open_model(tiny_models / "rope"), factor=4.0)
    waves = {}
    for r in rows:
        waves.setdefault(r["scaling"], []).append(r["wavelength"])
    assert set(waves) == set(ROPE_SCALINGS)
    head_dim = 32 // 4
    expected = (2 * math.pi / base_inv_freq(head_dim, 10000.0)).numpy()
    assert np.allclose(waves["none"], expected)
    assert np.allclose(waves["linear"], 4 * expected)
    assert waves["ntk"][0] == pytest.approx(expected[0]) and waves["ntk"][-1] == pytest.approx(4 * expected[-1])
    # every scaling is 2 pi / theta of its registered function (test_reference_hf holds those to Hugging
    # Face's): training length 32, dynamic NTK at the extended length 4 x 32
    from posviz.positions.rope import RopeOptions

    for name, fn in ROPE_SCALINGS.items():
        inv_freq, _ = fn(head_dim, RopeOptions(scaling=name, factor=1.0 if name == "none" else 4.0, original_length=32), 128)
        np.testing.assert_allclose(waves[name], 2 * math.pi / inv_freq.double().numpy(), rtol=1e-6, err_msg=name)
    assert not np.allclose(waves["dynamic"], waves["ntk"])  # 4 x the length: ratio 4 * 4 - 3 = 13, not 4


def test_shipped_curves_read_metrics(tiny_models):
    curve = extrapolation.shipped_bpb_curve(open_model(tiny_models / "learned"))
    assert [n for n, _ in curve] == [32, 64, 128, 256, 512] and curve[0][1] is not None and curve[1][1] is None
    rows = context_extension.shipped_scaling_curves(open_model(tiny_models / "rope"))
    assert {r["scaling"] for r in rows} == set(ROPE_SCALINGS) | set(ROPE_REMAPS)  # the remaps too, as stored
    assert all(r["factor"] == max(1.0, r["length"] / 32) for r in rows if r["scaling"] in ROPE_REMAPS)
    assert extrapolation.shipped_bpb_curve(tiny_lab("rope")) == []  # a model that stored no evaluation
