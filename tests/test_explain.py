"""posviz.explain against independent computations: closed forms, brute force, HF transformers, sampling."""
from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from posviz import attention_biases, explain
from posviz.positions import POSITION_METHODS, method_names
from posviz.positions.rope_scaling import ROPE_SCALINGS


# -- sinusoidal -----------------------------------------------------------------------------------
def paper_pe(length, dim, base):
    """Vaswani et al. §3.5 written out element by element."""
    pe = np.zeros((length, dim))
    for p in range(length):
        for i in range(dim // 2):
            pe[p, 2 * i] = math.sin(p / base ** (2 * i / dim))
            pe[p, 2 * i + 1] = math.cos(p / base ** (2 * i / dim))
    return pe


@pytest.mark.parametrize("length,dim,base", [(50, 8, 10000.0), (33, 16, 100.0)])
def test_sinusoidal_pe_matches_the_paper(length, dim, base):
    np.testing.assert_allclose(explain.sinusoidal_pe(length, dim, base), paper_pe(length, dim, base), atol=1e-12)


def test_sinusoid_waves_pick_the_columns():
    waves = explain.sinusoid_waves(20, 8, 10000.0, [0, 5])
    pe = paper_pe(20, 8, 10000.0)
    assert list(waves["dimension"]) == [0] * 20 + [5] * 20
    np.testing.assert_allclose(waves["value"], np.concatenate([pe[:, 0], pe[:, 5]]), atol=1e-12)


@pytest.mark.parametrize("dim,k,base", [(8, 1, 10000.0), (64, 7, 10000.0), (32, 300, 1000.0), (4, 0, 50.0)])
def test_shift_matrix_maps_pe_p_to_pe_p_plus_k(dim, k, base):
    check = explain.shift_check(400, dim, k, base, example_position=9)
    assert check.max_error < 1e-12
    assert check.errors.shape == (400,)
    pe = paper_pe(400 + k, dim, base)
    np.testing.assert_allclose(check.example_shifted, pe[9 + k], atol=1e-12)
    np.testing.assert_allclose(check.matrix @ pe[9], pe[9 + k], atol=1e-12)


def test_shift_matrix_is_specific_to_k():
    right = explain.shift_check(100, 16, 5).matrix
    wrong = explain.shift_check(100, 16, 6).matrix
    pe = paper_pe(120, 16, 10000.0)
    assert np.abs(wrong @ pe[10] - pe[15]).max() > 0.1
    assert np.abs(right @ pe[10] - pe[15]).max() < 1e-12


def test_dot_product_depends_on_distance_only():
    dim, base, D = 32, 10000.0, 40
    cols = explain.dot_product_vs_distance(dim, base, D, [D, 3 * D + 11])
    theta = base ** (-np.arange(0, dim, 2) / dim)
    for ref in (D, 3 * D + 11):
        sel = cols["reference"] == ref
        deltas = cols["distance"][sel]
        closed_form = np.cos(deltas[:, None] * theta[None, :]).sum(axis=1)  # sum_i cos(delta * theta_i)
        np.testing.assert_allclose(cols["dot"][sel], closed_form, atol=1e-10)
    assert cols["dot"][cols["distance"] == 0][0] == pytest.approx(dim / 2)
    with pytest.raises(ValueError):
        explain.dot_product_vs_distance(dim, base, D, [D - 1])


def test_binary_counting_bits_and_signs():
    out = explain.binary_counting(100, 16, 10000.0)
    bits = out["bits"]
    assert bits.shape == (100, 7)
    assert np.array_equal(bits @ (2 ** np.arange(7)), np.arange(100))  # the bits spell p
    pe = paper_pe(100, 16, 10000.0)
    assert np.array_equal(out["sign_bits"], (pe[:, 0::2] < 0).astype(int))
    assert list(out["bit_periods"][:3]) == [2, 4, 8]
    assert out["pair_wavelengths"][0] == pytest.approx(2 * math.pi)


# -- learned table ----------------------------------------------------------------------------------
def test_cosine_similarity_and_pca_on_a_known_table():
    angles = np.linspace(0, 2 * np.pi, 50, endpoint=False)
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.standard_normal((16, 2)))  # a circle of radius 3 embedded in 16-D
    table = 3 * np.stack([np.cos(angles), np.sin(angles)], 1) @ basis.T + 5.0
    cos = explain.cosine_similarity(table)
    brute = np.array([[a @ b / np.linalg.norm(a) / np.linalg.norm(b) for b in table] for a in table])
    np.testing.assert_allclose(cos, brute, atol=1e-12)
    pca = explain.pca_2d(table)
    radius = np.hypot(pca["pc1"], pca["pc2"])
    np.testing.assert_allclose(radius, 3.0, atol=1e-9)
    assert pca["explained"].sum() == pytest.approx(1.0)
    eig = np.sort(np.linalg.eigvalsh(np.cov(table.T)))[::-1]
    np.testing.assert_allclose(pca["explained"], eig[:2] / eig.sum(), atol=1e-9)


def test_learned_table_of_a_model():
    model = tiny_model("learned")
    table = explain.learned_table(model)
    assert table.shape == (32, 32)
    np.testing.assert_allclose(table, model.position.table.weight.detach().double().numpy())
    with pytest.raises(ValueError):
        explain.learned_table(tiny_model("rope"))


# -- RoPE -------------------------------------------------------------------------------------------------
def test_rotate_2d_is_a_rotation_matrix():
    v = np.array([0.7, -1.3])
    for m, theta in [(0, 0.3), (5, 0.3), (17, 1.1)]:
        a = m * theta
        expected = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]) @ v
        np.testing.assert_allclose(explain.rotate_2d(v, [m], theta)[0], expected, atol=1e-14)
    path = explain.rope_pair_path(v, 10, 0.4)
    np.testing.assert_allclose(path["norm"], np.linalg.norm(v), atol=1e-14)
    assert path["angle_deg"][10] == pytest.approx(math.degrees(4.0))


def test_dog_example_angle_depends_on_offset_only():
    q, k, theta = (1.0, 0.25), (0.55, 0.85), 0.5
    ex = explain.rope_pair_example(q, k, theta, [(1, 0), (4, 3), (4, 0)])
    assert ex["angle_deg"][0] == pytest.approx(ex["angle_deg"][1], abs=1e-9)
    assert ex["dot"][0] == pytest.approx(ex["dot"][1], abs=1e-12)
    assert abs(ex["angle_deg"][2] - ex["angle_deg"][0]) > 1
    base_angle = math.degrees(math.atan2(q[1], q[0]) - math.atan2(k[1], k[0]))
    expected = (base_angle + math.degrees(4 * theta) + 180) % 360 - 180
    assert ex["angle_deg"][2] == pytest.approx(expected, abs=1e-9)


def test_rope_scores_match_hf_and_are_shift_invariant():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d, base, T = 16, 10000.0, 24
    q, k = explain.random_qk(d, seed=3)
    scores = explain.rope_scores(q, k, T, base)
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
    q, k = explain.random_qk(64, seed=1)
    rng = np.random.default_rng(0)
    for _ in range(10):
        m, n, s = (int(x) for x in rng.integers(0, 5000, 3))
        check = explain.rope_shift_invariance(q, k, m, n, s, 10000.0)
        assert check.difference < 1e-11
        assert check.score == pytest.approx(check.shifted_score, abs=1e-11)
    moved_one_side = explain.rope_shift_invariance(q, k, 10, 3, 0, 10000.0).score
    assert abs(moved_one_side - explain.rope_shift_invariance(q, k, 11, 3, 0, 10000.0).score) > 1e-3


@pytest.mark.parametrize("d,base", [(8, 10000.0), (32, 500.0)])
def test_decay_bound_by_brute_force(d, base):
    out = explain.rope_decay_bound(d, base, 300)
    theta = [base ** (-2 * i / d) for i in range(d // 2)]
    for r in (0, 1, 7, 150, 300):
        total = 0.0
        for j in range(1, d // 2 + 1):  # |S_j|, S_j = sum_{k<j} e^{i r theta_k}
            total += abs(sum(cmath.exp(1j * r * theta[kk]) for kk in range(j)))
        assert out["bound"][r] == pytest.approx(total / (d // 2), rel=1e-12)
    assert out["bound"][0] == pytest.approx((d / 2 + 1) / 2)


def test_decay_bound_decays_as_in_the_paper():
    bound = explain.rope_decay_bound(128, 10000.0, 1000)["bound"]  # RoFormer Figure 2's setting
    assert bound[0] == pytest.approx(32.5)
    assert bound[250] < bound[0] / 4 and bound[1000] < bound[250]


def test_decay_bound_chunks_agree():
    whole = explain.rope_decay_bound(512, 10000.0, 5000)["bound"]  # 5001 x 256 > one chunk
    assert whole.shape == (5001,)
    again = explain.rope_decay_bound(512, 10000.0, 100)["bound"]
    np.testing.assert_allclose(whole[:101], again, rtol=1e-13)


def test_norm_preservation():
    out = explain.rope_norms(32, 10000.0, 5000, seed=2)
    assert out["relative_change"].max() < 1e-13
    assert np.all(out["norm_before"] > 0)


def test_scaling_wavelengths_cover_the_registry():
    cols = explain.scaling_wavelengths(32, 10000.0, 4.0, 256)
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
    t = explain.rope_frequency_table(8, 100.0, 256)
    assert list(t["second_feature"]) == [4, 5, 6, 7]
    assert t["turns_in_training"][0] == pytest.approx(256 / (2 * math.pi))
    assert t["wavelength"][3] == pytest.approx(2 * math.pi * 100 ** (6 / 8))


# -- ALiBi / T5 / Shaw ---------------------------------------------------------------------------------
def reference_alibi_slopes(n):
    """The ALiBi authors' rule, written independently."""
    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + reference_alibi_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [1, 2, 5, 6, 8, 12, 16])
def test_alibi_slopes_and_matrices(heads):
    table = attention_biases.alibi_slope_table(heads)
    np.testing.assert_allclose(table["slope"], reference_alibi_slopes(heads), rtol=1e-6)
    np.testing.assert_allclose(table["half_weight_distance"] * table["slope"], math.log(2))
    bias = attention_biases.alibi_bias_matrices(heads, 10)
    i, j = 7, 3
    np.testing.assert_allclose(bias[:, i, j], -table["slope"] * (i - j), rtol=1e-6)
    assert np.isnan(bias[:, 3, 7]).all() and (bias[:, 4, 4] == 0).all()
    by_distance = attention_biases.alibi_bias_by_distance(heads, 10)
    np.testing.assert_allclose(by_distance[:, 4], -4 * table["slope"], rtol=1e-6)


def softmax_weight(logits, d):
    z = logits - logits.max()
    return np.exp(z[d]) / np.exp(z).sum()


def test_max_attention_weight_formula_by_brute_force():
    rng = np.random.default_rng(0)
    b = rng.normal(size=12) * 3
    margin = 1.7
    bound = attention_biases.max_attention_weight(b, margin)
    for d in range(12):
        brute = 1 / (1 + math.exp(-margin) * sum(math.exp(b[j] - b[d]) for j in range(12) if j != d))
        assert bound[d] == pytest.approx(brute, rel=1e-12)
    assert attention_biases.max_attention_weight(np.array([0.3]), 2.0)[0] == 1.0  # a lone key gets everything


@pytest.mark.parametrize("heads,n,margin", [(8, 300, 4.0), (5, 64, 0.0), (12, 1000, 12.0)])
def test_alibi_max_weight_bounds_sampled_logits_and_is_attained(heads, n, margin):
    bias = attention_biases.alibi_bias_by_distance(heads, n)
    bound = attention_biases.max_attention_weight(bias, margin)
    rng = np.random.default_rng(heads)
    for _ in range(200):
        h, d = int(rng.integers(heads)), int(rng.integers(n))
        s_d = rng.normal() * 5
        s = s_d - margin + rng.exponential(rng.uniform(0.01, 5), size=n)  # every other key within the margin
        s[d] = s_d
        assert softmax_weight(s + bias[h], d) <= bound[h, d] * (1 + 1e-9)
    h, d = heads - 1, n // 2
    s = np.full(n, -margin)
    s[d] = 0.0  # all other logits equal, exactly the margin below: the bound is reached
    assert softmax_weight(s + bias[h], d) == pytest.approx(bound[h, d], rel=1e-9)


def test_log_bound_does_not_underflow():
    bias = attention_biases.alibi_bias_by_distance(8, 8192)
    lw = attention_biases.log_max_attention_weight(bias, 5.0)
    assert np.isfinite(lw).all()
    assert lw[0, -1] < -1000  # steepest head: e^(-0.5 * 8191) is far below float range
    np.testing.assert_allclose(np.exp(lw[-1]), attention_biases.max_attention_weight(bias[-1], 5.0))
    far = attention_biases.alibi_bias_by_distance(1, 8192)[0]
    slope = 2 ** -8
    expected = -math.log1p(math.exp(-5.0) * sum(math.exp(-slope * (j - 8191)) for j in range(8191)))
    assert lw.shape == (8, 8192) and attention_biases.log_max_attention_weight(far, 5.0)[-1] == pytest.approx(expected, rel=1e-9)


def test_no_bias_bound_is_pure_dilution():
    lw = attention_biases.no_bias_log_max_weight(101, 2.0)
    np.testing.assert_allclose(np.exp(lw), 1 / (1 + math.exp(-2.0) * 100))
    stacked = np.stack([lw, lw - 1])
    np.testing.assert_allclose(attention_biases.strongest_head(stacked), lw)


def test_t5_buckets_match_hf():
    from transformers.models.t5.modeling_t5 import T5Attention

    for nb, md in [(32, 128), (16, 64), (8, 20)]:
        table = attention_biases.t5_bucket_table(500, nb, md)
        d = torch.arange(501)
        hf_causal = T5Attention._relative_position_bucket(-d, bidirectional=False, num_buckets=nb, max_distance=md)
        hf_before = T5Attention._relative_position_bucket(-d, bidirectional=True, num_buckets=nb, max_distance=md)
        hf_after = T5Attention._relative_position_bucket(d, bidirectional=True, num_buckets=nb, max_distance=md)
        assert np.array_equal(table["causal"], hf_causal.numpy())
        assert np.array_equal(table["bidirectional_before"], hf_before.numpy())
        assert np.array_equal(table["bidirectional_after"], hf_after.numpy())
    m = attention_biases.t5_bucket_matrix(20, False, 32, 128)
    assert np.isnan(m[2, 5]) and m[19, 0] == table_bucket(19)
    mb = attention_biases.t5_bucket_matrix(20, True, 32, 128)
    assert not np.isnan(mb).any() and mb[2, 5] != mb[5, 2]


def table_bucket(distance):
    return attention_biases.t5_bucket_table(distance, 32, 128)["causal"][distance]


def test_t5_learned_bias_and_bound():
    model = tiny_model("t5")
    with torch.no_grad():
        model.position.bucket_bias.weight.normal_()
    t5 = attention_biases.t5_learned(model)
    weights = t5["weights"]
    n = 400
    bias = attention_biases.t5_bias_by_distance(weights, n, t5["max_distance"])
    for d in (0, 3, 17, 200, 399):
        assert np.allclose(bias[:, d], weights[table_bucket_nb(d, t5), :])
    matrix = attention_biases.t5_bias_matrix(weights, 2, 30, t5["max_distance"])
    assert matrix[29, 29 - 17] == pytest.approx(bias[2, 17]) and np.isnan(matrix[0, 1])
    # The same sampled check as for ALiBi: the bound holds for every head.
    bound = attention_biases.max_attention_weight(bias, 3.0)
    rng = np.random.default_rng(1)
    for _ in range(200):
        h, d = int(rng.integers(bias.shape[0])), int(rng.integers(n))
        s = -3.0 + rng.exponential(1.0, size=n)
        s[d] = 0.0
        assert softmax_weight(s + bias[h], d) <= bound[h, d] * (1 + 1e-9)
    # Past max_distance every key shares the last bucket: the bound is flat there.
    assert np.ptp(bound[:, t5["max_distance"] + 1:], axis=1).max() < 1e-12


def table_bucket_nb(distance, t5):
    return attention_biases.t5_bucket_table(distance, t5["num_buckets"], t5["max_distance"])["causal"][distance]


def test_shaw_clip_matrix():
    m = attention_biases.shaw_clip(12, 4, causal=True)
    for i in range(12):
        for j in range(12):
            if j > i:
                assert np.isnan(m[i, j])
            else:
                assert m[i, j] == min(i - j, 4)
    bi = attention_biases.shaw_clip(12, 4, causal=False)
    assert bi[0, 11] == 8 and bi[11, 0] == 0 and bi[5, 5] == 4


@pytest.mark.parametrize("query_norm", [0.0, 2.0, 15.0, None])
def test_shaw_bound_holds_for_sampled_queries(query_norm):
    rng = np.random.default_rng(7)
    k, hs, n, margin = 6, 8, 40, 1.5
    rel = rng.normal(size=(k + 1, hs)) * 0.8
    bound = np.exp(attention_biases.shaw_log_max_attention_weight(rel, n, margin, query_norm))
    clip = np.minimum(np.arange(n), k)
    for trial in range(400):
        d = int(rng.integers(n))
        if query_norm is None:
            q = rng.normal(size=hs) * rng.uniform(0, 40)
        else:
            q = rng.normal(size=hs)
            if trial % 2:  # adversarial direction: favour the relevant key's embedding
                q = rel[clip[d]] - rel.mean(axis=0)
            q = q / np.linalg.norm(q) * query_norm * rng.uniform(0.5, 1.0)
        position = rel[clip] @ q / math.sqrt(hs)  # Shaw's bias for every key
        s = -margin + rng.exponential(0.5, size=n)
        s[d] = 0.0
        assert softmax_weight(s + position, d) <= bound[d] * (1 + 1e-9)
    if query_norm is None:
        assert (bound[:k] == 1).all()
        np.testing.assert_allclose(bound[k:], 1 / (1 + math.exp(-margin) * (n - k - 1)))
    if query_norm == 0.0:  # no query, no position term: plain dilution
        np.testing.assert_allclose(bound, 1 / (1 + math.exp(-margin) * (n - 1)))


def test_shaw_bound_is_attained_with_two_embeddings():
    # k = 1: the key at distance 0 uses a_0, every other key a_1. The query along a_0 - a_1 with the
    # largest allowed norm, and every other content score exactly the margin lower, reach the bound.
    rng = np.random.default_rng(3)
    hs, n, margin, R = 8, 50, 2.0, 6.0
    rel = rng.normal(size=(2, hs))
    bound = np.exp(attention_biases.shaw_log_max_attention_weight(rel, n, margin, R))
    q = R * (rel[0] - rel[1]) / np.linalg.norm(rel[0] - rel[1])
    position = rel[np.minimum(np.arange(n), 1)] @ q / math.sqrt(hs)
    s = np.full(n, -margin)
    s[0] = 0.0
    assert softmax_weight(s + position, 0) == pytest.approx(bound[0], rel=1e-9)


def test_shaw_learned_reads_the_model():
    model = tiny_model("shaw")
    shaw = attention_biases.shaw_learned(model)
    assert shaw["rel_keys"].shape == (2, 65, 8) and shaw["max_distance"] == 64


def test_distance_grid_and_columns():
    g = attention_biases.distance_grid(8192)
    assert g[0] == 0 and g[-1] == 8191 and np.all(np.diff(g) > 0) and len(g) < 500
    assert list(attention_biases.distance_grid(10)) == list(range(10))
    cols = attention_biases.max_weight_columns({"a": np.log(np.full(8192, 0.5))}, g)
    assert set(cols["series"]) == {"a"} and np.allclose(cols["log10_max_weight"], math.log10(0.5))


# -- checkpoint tables -------------------------------------------------------------------------------------
def fake_metrics(b1, b16, train=256):
    table = {str(train * m): (b1 if m == 1 else None if b16 is None else b1 + (b16 - b1) * math.log2(m) / 4)
             for m in (1, 2, 4, 8, 16)}
    return {"eval": {"nonoverlapping_bpb": table, "lengths_x_train": {str(train * m): float(m) for m in (1, 2, 4, 8, 16)}},
            "train_curve": [{"step": 0, "tokens": 10, "train_bpb": 8.0}, {"step": 1, "tokens": 20, "train_bpb": 4.0}],
            "parameters": 123, "tokens": 20, "steps": 2, "val_bpb_at_train_length": b1}


def test_method_rows_from_registry_and_metrics():
    metrics = {"alibi": fake_metrics(2.0, 1.98), "rope": fake_metrics(2.0, 4.5), "learned": fake_metrics(2.1, None),
               "t5": fake_metrics(2.0, 2.3)}
    rows = {r["method"]: r for r in explain.method_rows(metrics)}
    assert list(rows) == method_names()
    for name, row in rows.items():
        cls = POSITION_METHODS[name]
        assert row["fixed / learned"] == ("learned" if cls.learned else "fixed")
        assert row["paper"] == cls.paper
        assert row["KV-cacheable"].startswith("yes")
    assert rows["alibi"]["extrapolates"] == "yes" and rows["alibi"]["bits/byte @ 16×"] == pytest.approx(1.98)
    assert rows["rope"]["extrapolates"] == "no" and rows["t5"]["extrapolates"] == "partly"
    assert explain.extrapolation(metrics["rope"])["reason"] == "+2.50 bits/byte at 16x"
    short = fake_metrics(2.0, 2.04)  # evaluated up to 8x only: bpb 2.03 there
    del short["eval"]["nonoverlapping_bpb"]["4096"]
    row = {r["method"]: r for r in explain.method_rows({"alibi": short})}["alibi"]
    assert row["extrapolates"] == "yes (+0.03 bits/byte at 8x)"
    assert rows["learned"]["extrapolates"] == "no (cannot run)"
    assert explain.extrapolation(metrics["learned"])["reason"] == "cannot run past 256 positions"
    assert rows["learned"]["KV-cacheable"] == "yes (≤ 256)" and rows["rope"]["KV-cacheable"] == "yes"
    assert rows["nope"]["extrapolates"].startswith("unknown")


def test_bpb_rows_curves_and_checkpoint_rows():
    metrics = {"alibi": fake_metrics(2.0, 1.98), "learned": fake_metrics(2.1, None)}
    cols = explain.bpb_vs_length_rows(metrics)
    assert list(cols["checkpoint"]).count("learned") == 1 and list(cols["checkpoint"]).count("alibi") == 5
    assert set(cols["multiple"]) == {1, 2, 4, 8, 16}
    curves = explain.train_curve_rows(metrics)
    assert list(curves["train_bpb"]) == [8.0, 4.0, 8.0, 4.0]
    configs = {"alibi": {"model": {"train_length": 256}, "trained_on": {"seconds": 600, "device": "cpu", "processor": "x86"}}}
    row = explain.checkpoint_rows(configs, metrics)[0]
    assert row["training time (min)"] == 10.0 and row["device"] == "cpu · x86" and row["parameters"] == 123
    recipe = {r["setting"]: r["value"] for r in explain.recipe_rows()}
    assert "lr" in recipe and "method" not in recipe and int(recipe["steps"]) > 0
