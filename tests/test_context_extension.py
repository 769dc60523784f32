"""Unit tests of posviz.context_extension's inference-time RoPE scalings, and of the shipped curves the
Extrapolation and Context extension labs draw, on tiny checkpoints."""
from __future__ import annotations

import math

import numpy as np
import pytest
from maths_support import text_ids  # noqa: F401  (text_ids: a fixture)

from posviz import context_extension, extrapolation, lab_inputs
from posviz.errors import PosvizError
from posviz.limits import max_eval_length
from posviz.positions.rope_scaling import ROPE_SCALINGS, base_inv_freq


# ------------------------------------------------------------------------------------------------
# RoPE context extension
# ------------------------------------------------------------------------------------------------
def test_rope_scaling_curves_cover_the_registry(tiny_models, text_ids):
    folder = tiny_models / "rope"
    lengths = context_extension.extension_lengths(32, max_eval_length(32), len(text_ids))
    assert lengths == [32, 64, 128, 256, 512]
    rows = context_extension.rope_scaling_curves(folder, 4.0, text_ids, lengths[:3])
    assert {r["scaling"] for r in rows} == set(ROPE_SCALINGS)
    bpb = {(r["scaling"], r["length"]): r["bpb"] for r in rows}
    plain = lab_inputs.get_model(folder)
    assert bpb[("none", 64)] == pytest.approx(extrapolation.score_at_length(plain, text_ids, 64).bpb, abs=1e-6)
    linear = lab_inputs.get_model(folder, {"scaling": "linear", "factor": 4.0})
    assert bpb[("linear", 64)] == pytest.approx(extrapolation.score_at_length(linear, text_ids, 64).bpb, abs=1e-6)
    assert bpb[("linear", 64)] != pytest.approx(bpb[("none", 64)], abs=1e-7)
    with pytest.raises(PosvizError, match="Unknown RoPE scaling"):
        context_extension.scaling_overrides("magic", 2.0)


def test_rope_wavelengths(tiny_models):
    rows = context_extension.rope_wavelengths(tiny_models / "rope", factor=4.0)
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
    curve = extrapolation.shipped_bpb_curve(tiny_models / "learned")
    assert [n for n, _ in curve] == [32, 64, 128, 256, 512] and curve[0][1] is not None and curve[1][1] is None
    rows = context_extension.shipped_scaling_curves(tiny_models / "rope")
    assert {r["scaling"] for r in rows} == set(ROPE_SCALINGS)
    assert extrapolation.shipped_bpb_curve(tiny_models / "missing") == []
