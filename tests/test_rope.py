"""posviz.explore.rope against independent computations: rotation matrices, HF transformers, brute force."""
from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch

from posviz.explore import rope
from posviz.positions.rope_scaling import ROPE_SCALINGS


# -- RoPE -------------------------------------------------------------------------------------------------
def test_rotate_2d_is_a_rotation_matrix():
    v = np.array([0.7, -1.3])
    for m, theta in [(0, 0.3), (5, 0.3), (17, 1.1)]:
        a = m * theta
        expected = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]) @ v
        np.testing.assert_allclose(rope.rotate_2d(v, [m], theta)[0], expected, atol=1e-14)
    path = rope.rope_pair_path(v, 10, 0.4)
    np.testing.assert_allclose(path["norm"], np.linalg.norm(v), atol=1e-14)
    assert path["angle_deg"][10] == pytest.approx(math.degrees(4.0))


def test_dog_example_angle_depends_on_offset_only():
    q, k, theta = (1.0, 0.25), (0.55, 0.85), 0.5
    ex = rope.rope_pair_example(q, k, theta, [(1, 0), (4, 3), (4, 0)])
    assert ex["angle_deg"][0] == pytest.approx(ex["angle_deg"][1], abs=1e-9)
    assert ex["dot"][0] == pytest.approx(ex["dot"][1], abs=1e-12)
    assert abs(ex["angle_deg"][2] - ex["angle_deg"][0]) > 1
    base_angle = math.degrees(math.atan2(q[1], q[0]) - math.atan2(k[1], k[0]))
    expected = (base_angle + math.degrees(4 * theta) + 180) % 360 - 180
    assert ex["angle_deg"][2] == pytest.approx(expected, abs=1e-9)


def test_rope_scores_match_hf_and_are_shift_invariant():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d, base, T = 16, 10000.0, 24
    q, k = rope.random_qk(d, seed=3)
    scores = rope.rope_scores(q, k, T, base)
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), -1)
    qs = torch.tensor(q)[None, None].expand(1, 1, T, d)
    ks = torch.tensor(k)[None, None].expand(1, 1, T, d)
    hq, hk = apply_rotary_pos_emb(qs, ks, emb.cos()[None], emb.sin()[None])
    np.testing.assert_allclose(scores, (hq[0, 0] @ hk[0, 0].T).numpy(), atol=1e-12)
    for offset in range(-T + 1, T):
        diagonal = np.diagonal(scores, -offset)
        assert np.ptp(diagonal) < 1e-12
    assert np.ptp(np.diagonal(scores, 0)) < 1e-12 and abs(scores[0, 0] - scores[0, 1]) > 1e-3


def test_shift_invariance_numbers():
    q, k = rope.random_qk(64, seed=1)
    rng = np.random.default_rng(0)
    for _ in range(10):
        m, n, s = (int(x) for x in rng.integers(0, 5000, 3))
        check = rope.rope_shift_invariance(q, k, m, n, s, 10000.0)
        assert check.difference < 1e-11
        assert check.score == pytest.approx(check.shifted_score, abs=1e-11)
    moved_one_side = rope.rope_shift_invariance(q, k, 10, 3, 0, 10000.0).score
    assert abs(moved_one_side - rope.rope_shift_invariance(q, k, 11, 3, 0, 10000.0).score) > 1e-3


@pytest.mark.parametrize("d,base", [(8, 10000.0), (32, 500.0)])
def test_decay_bound_by_brute_force(d, base):
    out = rope.rope_decay_bound(d, base, 300)
    theta = [base ** (-2 * i / d) for i in range(d // 2)]
    for r in (0, 1, 7, 150, 300):
        total = 0.0
        for j in range(1, d // 2 + 1):  # |S_j|, S_j = sum_{k<j} e^{i r theta_k}
            total += abs(sum(cmath.exp(1j * r * theta[kk]) for kk in range(j)))
        assert out["bound"][r] == pytest.approx(total / (d // 2), rel=1e-12)
    assert out["bound"][0] == pytest.approx((d / 2 + 1) / 2)


def test_decay_bound_decays_as_in_the_paper():
    bound = rope.rope_decay_bound(128, 10000.0, 1000)["bound"]  # RoFormer Figure 2's setting
    assert bound[0] == pytest.approx(32.5)
    assert bound[250] < bound[0] / 4 and bound[1000] < bound[250]


def test_decay_bound_chunks_agree():
    whole = rope.rope_decay_bound(512, 10000.0, 5000)["bound"]  # 5001 x 256 > one chunk
    assert whole.shape == (5001,)
    again = rope.rope_decay_bound(512, 10000.0, 100)["bound"]
    np.testing.assert_allclose(whole[:101], again, rtol=1e-13)


def test_norm_preservation():
    out = rope.rope_norms(32, 10000.0, 5000, seed=2)
    assert out["relative_change"].max() < 1e-13
    assert np.all(out["norm_before"] > 0)


def test_scaling_wavelengths_cover_the_registry():
    cols = rope.scaling_wavelengths(32, 10000.0, 4.0, 256)
    assert set(cols["scaling"]) == set(ROPE_SCALINGS)
    wl = {name: cols["wavelength"][cols["scaling"] == name] for name in ROPE_SCALINGS}
    plain = 2 * math.pi * 10000.0 ** (np.arange(0, 32, 2) / 32)
    np.testing.assert_allclose(wl["none"], plain, rtol=1e-12)
    np.testing.assert_allclose(wl["linear"], 4 * plain, rtol=1e-12)
    assert wl["ntk"][0] == pytest.approx(plain[0]) and wl["ntk"][-1] == pytest.approx(4 * plain[-1], rel=1e-9)
    yarn = cols["attention_factor"][cols["scaling"] == "yarn"][0]
    assert yarn == pytest.approx(0.1 * math.log(4) + 1)
    np.testing.assert_allclose(cols["logit_scale"], cols["attention_factor"] ** 2)


def test_frequency_table():
    t = rope.rope_frequency_table(8, 100.0, 256)
    assert list(t["second_feature"]) == [4, 5, 6, 7]
    assert t["turns_in_training"][0] == pytest.approx(256 / (2 * math.pi))
    assert t["wavelength"][3] == pytest.approx(2 * math.pi * 100 ** (6 / 8))


# -- published RoPE models ----------------------------------------------------------------------------------
def llama3_by_hand(d, theta, factor, low, high, original):
    """Llama 3.1's frequency rule (Meta's reference code), written out pair by pair: the plain speeds,
    the scaled ones and which of the three bands each pair falls in."""
    plain = np.array([theta ** (-2 * i / d) for i in range(d // 2)])
    scaled, bands = [], []
    for f in plain:
        wavelength = 2 * math.pi / f
        if wavelength < original / high:
            scaled.append(f), bands.append("as θ gives")
        elif wavelength > original / low:
            scaled.append(f / factor), bands.append(f"stretched ×{factor:g}")
        else:
            smooth = (original / wavelength - low) / (high - low)
            scaled.append((1 - smooth) * f / factor + smooth * f), bands.append("in between")
    return plain, np.array(scaled), bands


def test_published_wavelengths_of_llama3_bands():
    plain, scaled, bands = llama3_by_hand(16, 1e5, 8.0, 1.0, 4.0, 32)
    assert set(bands) == {"as θ gives", "in between", "stretched ×8"}  # all three bands occur
    cols = rope.published_wavelengths(torch.tensor(scaled, dtype=torch.float32), 1e5, 16)
    np.testing.assert_allclose(cols["plain_inv_freq"], plain, rtol=1e-12)
    np.testing.assert_allclose(cols["wavelength"], 2 * math.pi / scaled, rtol=1e-6)
    np.testing.assert_allclose(cols["plain_wavelength"], 2 * math.pi / plain, rtol=1e-12)
    np.testing.assert_allclose(cols["ratio"], plain / scaled, rtol=1e-6)
    assert list(cols["band"]) == bands
    assert list(cols["second_feature"]) == list(range(8, 16))


def test_published_wavelengths_plain_linear_and_bad_input():
    plain = 1 / 10000.0 ** (np.arange(0, 4, 2) / 4)  # Pythia-style: 4 rotated features, 2 pairs
    assert list(rope.published_wavelengths(plain, 10000.0, 4)["band"]) == ["as θ gives"] * 2
    linear = rope.published_wavelengths(plain / 4, 10000.0, 4)
    assert list(linear["band"]) == ["stretched ×4"] * 2 and linear["ratio"] == pytest.approx([4, 4])
    with pytest.raises(ValueError):
        rope.published_wavelengths(plain, 10000.0, 8)  # 2 speeds for 8 rotated features
    with pytest.raises(ValueError):
        rope.published_wavelengths(-plain, 10000.0, 4)


def test_published_rope_reads_the_model(hf_family_dir):
    from posviz.models.interface import open_model

    neox = open_model(hf_family_dir["neox"])
    facts = rope.published_rope(neox)
    assert (facts.rotary_dims, facts.head_dim, facts.rotary_share) == (4, 16, 0.25)
    assert facts.theta == 10000.0 and facts.rope_type == "default" and facts.factor is None
    assert any("Only 4 of each head's 16" in note for note in facts.notes)
    np.testing.assert_allclose(facts.columns["inv_freq"], neox.position.inv_freq.numpy())
    np.testing.assert_allclose(facts.columns["plain_inv_freq"], [1.0, 0.01])

    llama = open_model(hf_family_dir["llama3"])
    facts = rope.published_rope(llama)
    assert (facts.rope_type, facts.factor, facts.original_length, facts.train_length) == ("llama3", 8.0, 32, 64)
    _, scaled, bands = llama3_by_hand(16, 1e5, 8.0, 1.0, 4.0, 32)
    np.testing.assert_allclose(facts.columns["wavelength"], 2 * math.pi / llama.position.inv_freq.numpy())
    np.testing.assert_allclose(facts.columns["inv_freq"], scaled, rtol=1e-6)
    assert list(facts.columns["band"]) == bands
    with pytest.raises(ValueError):
        rope.published_rope(open_model(hf_family_dir["gpt2"]))
