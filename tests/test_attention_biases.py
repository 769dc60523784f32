"""posviz.explore.attention_biases against independent computations: the ALiBi authors' rule, HF transformers'
T5 buckets, brute force and sampled logits."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from posviz.explore import attention_biases


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


# -- published ALiBi models ------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", [4, 6, 16])
def test_published_alibi_slopes_against_the_paper(heads):
    scaled = torch.tensor(reference_alibi_slopes(heads)) / math.sqrt(8)  # Falcon-style
    cols = attention_biases.published_alibi_slopes(scaled)
    np.testing.assert_allclose(cols["paper_slope"], reference_alibi_slopes(heads), rtol=1e-6)
    np.testing.assert_allclose(cols["ratio"], 1 / math.sqrt(8), rtol=1e-6)
    np.testing.assert_allclose(cols["half_weight_distance"], math.log(2) / scaled.double().numpy(), rtol=1e-12)
    np.testing.assert_allclose(cols["paper_half_weight_distance"] * cols["paper_slope"], math.log(2))
    assert list(cols["head"]) == list(range(heads))
    with pytest.raises(ValueError):
        attention_biases.published_alibi_slopes(torch.zeros(3))


def test_published_alibi_reads_bloom_and_falcon(hf_family_dir):
    from posviz.models.interface import open_model

    bloom = attention_biases.published_alibi(open_model(hf_family_dir["bloom"]))
    np.testing.assert_allclose(bloom["columns"]["slope"], reference_alibi_slopes(4), rtol=1e-6)
    assert bloom["ratio_range"] == pytest.approx((1.0, 1.0)) and not bloom["notes"]
    falcon_model = open_model(hf_family_dir["falcon"])
    falcon = attention_biases.published_alibi(falcon_model)
    np.testing.assert_allclose(falcon["columns"]["slope"], falcon_model.position.slopes.numpy())
    # 4 heads: slopes 2^-2 .. 2^-8, exact in bfloat16, so exactly the paper's / sqrt(head_dim 8)
    assert falcon["ratio_range"] == pytest.approx((1 / math.sqrt(8),) * 2, rel=1e-6)
    # "twice" exactly where the installed transformers' eager attention adds it twice (5.24: yes; 5.25: no)
    from posviz.models.hf.probes import measured

    twice = abs(measured(falcon_model.config, "alibi").alibi_eager_multiple - 2.0) < 0.05
    assert any("twice" in note for note in falcon["notes"]) == twice and any("bfloat16" in note for note in falcon["notes"])
    with pytest.raises(ValueError):
        attention_biases.published_alibi(open_model(hf_family_dir["gpt2"]))
