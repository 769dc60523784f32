"""posviz.explore.sinusoidal_learned against independent computations: the paper's formula written out, closed
forms, a known table."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from posviz.explore import sinusoidal_learned


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
    np.testing.assert_allclose(sinusoidal_learned.sinusoidal_pe(length, dim, base), paper_pe(length, dim, base), atol=1e-12)


def test_sinusoid_waves_pick_the_columns():
    waves = sinusoidal_learned.sinusoid_waves(20, 8, 10000.0, [0, 5])
    pe = paper_pe(20, 8, 10000.0)
    assert list(waves["dimension"]) == [0] * 20 + [5] * 20
    np.testing.assert_allclose(waves["value"], np.concatenate([pe[:, 0], pe[:, 5]]), atol=1e-12)


@pytest.mark.parametrize("dim,k,base", [(8, 1, 10000.0), (64, 7, 10000.0), (32, 300, 1000.0), (4, 0, 50.0)])
def test_shift_matrix_maps_pe_p_to_pe_p_plus_k(dim, k, base):
    check = sinusoidal_learned.shift_check(400, dim, k, base, example_position=9)
    assert check.max_error < 1e-12
    assert check.errors.shape == (400,)
    pe = paper_pe(400 + k, dim, base)
    np.testing.assert_allclose(check.example_shifted, pe[9 + k], atol=1e-12)
    np.testing.assert_allclose(check.matrix @ pe[9], pe[9 + k], atol=1e-12)


def test_shift_matrix_is_specific_to_k():
    right = sinusoidal_learned.shift_check(100, 16, 5).matrix
    wrong = sinusoidal_learned.shift_check(100, 16, 6).matrix
    pe = paper_pe(120, 16, 10000.0)
    assert np.abs(wrong @ pe[10] - pe[15]).max() > 0.1
    assert np.abs(right @ pe[10] - pe[15]).max() < 1e-12


def test_dot_product_depends_on_distance_only():
    dim, base, D = 32, 10000.0, 40
    cols = sinusoidal_learned.dot_product_vs_distance(dim, base, D, [D, 3 * D + 11])
    theta = base ** (-np.arange(0, dim, 2) / dim)
    for ref in (D, 3 * D + 11):
        sel = cols["reference"] == ref
        deltas = cols["distance"][sel]
        closed_form = np.cos(deltas[:, None] * theta[None, :]).sum(axis=1)  # sum_i cos(delta * theta_i)
        np.testing.assert_allclose(cols["dot"][sel], closed_form, atol=1e-10)
    assert cols["dot"][cols["distance"] == 0][0] == pytest.approx(dim / 2)
    with pytest.raises(ValueError):
        sinusoidal_learned.dot_product_vs_distance(dim, base, D, [D - 1])


def test_binary_counting_bits_and_signs():
    out = sinusoidal_learned.binary_counting(100, 16, 10000.0)
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
    cos = sinusoidal_learned.cosine_similarity(table)
    brute = np.array([[a @ b / np.linalg.norm(a) / np.linalg.norm(b) for b in table] for a in table])
    np.testing.assert_allclose(cos, brute, atol=1e-12)
    pca = sinusoidal_learned.pca_2d(table)
    radius = np.hypot(pca["pc1"], pca["pc2"])
    np.testing.assert_allclose(radius, 3.0, atol=1e-9)
    assert pca["explained"].sum() == pytest.approx(1.0)
    eig = np.sort(np.linalg.eigvalsh(np.cov(table.T)))[::-1]
    np.testing.assert_allclose(pca["explained"], eig[:2] / eig.sum(), atol=1e-9)


def test_learned_table_of_a_model():
    model = tiny_model("learned")
    table = sinusoidal_learned.learned_table(model)
    assert table.shape == (32, 32)
    np.testing.assert_allclose(table, model.position.table.weight.detach().double().numpy())
    with pytest.raises(ValueError):
        sinusoidal_learned.learned_table(tiny_model("rope"))


# -- published learned tables (GPT-2, OPT) ------------------------------------------------------------
def by_hand_cosine(table):
    """Cosine similarity of every two rows, one pair at a time."""
    return np.array([[a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) for b in table] for a in table])


def test_position_similarity_small_table_is_the_cosine_matrix():
    table = torch.randn(40, 12, generator=torch.Generator().manual_seed(0))
    similarity, block = sinusoidal_learned.position_similarity(table)
    assert block == 1
    np.testing.assert_allclose(similarity, by_hand_cosine(table.double().numpy()), atol=1e-12)
    assert sinusoidal_learned.neighbour_similarity(table) == pytest.approx(
        np.mean(np.diag(by_hand_cosine(table.double().numpy()), k=1)))


@pytest.mark.parametrize("rows,block", [(1024, 2), (1500, 3), (2048, 4)])
def test_position_similarity_pools_long_tables(rows, block):
    table = np.random.default_rng(rows).standard_normal((rows, 8))
    pooled, got_block = sinusoidal_learned.position_similarity(torch.as_tensor(table), max_side=512)
    assert got_block == block and pooled.shape == (-(-rows // block),) * 2 and max(pooled.shape) <= 512
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    full = unit @ unit.T
    for i, j in [(0, 0), (3, 7), (pooled.shape[0] - 1, 5), (pooled.shape[0] - 1, pooled.shape[0] - 1)]:
        cells = full[i * block:(i + 1) * block, j * block:(j + 1) * block]  # the last block may be short
        assert pooled[i, j] == pytest.approx(cells.mean(), abs=1e-12)


def test_principal_components_match_numpy_svd():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((200, 24)) @ np.diag(np.linspace(3, 0.1, 24)) + 0.7
    pcs = sinusoidal_learned.principal_components(torch.as_tensor(table, dtype=torch.float32), k=4)
    centred = table - table.mean(axis=0)
    u, s, _ = np.linalg.svd(centred)
    assert pcs.coords.shape == (200, 4)
    np.testing.assert_allclose(pcs.explained, s[:4] ** 2 / (s ** 2).sum(), rtol=1e-5)
    for j in range(4):  # the same direction up to its sign, which is fixed: largest coordinate positive
        expected = u[:, j] * s[j]
        expected = expected if expected[np.abs(expected).argmax()] > 0 else -expected
        np.testing.assert_allclose(pcs.coords[:, j], expected, atol=1e-4)
    columns = pcs.columns()
    assert list(np.unique(columns["component"])) == [1, 2, 3, 4] and len(columns["value"]) == 4 * 200
    np.testing.assert_allclose(columns["value"][columns["component"] == 3], pcs.coords[:, 2])
    assert sinusoidal_learned.principal_components(table[:3], k=4).coords.shape == (3, 3)  # at most rank-many


def test_published_learned_tables_of_gpt2_and_opt(hf_family_dir):
    from posviz.models.interface import open_model

    for name in ("gpt2", "opt"):
        table = open_model(hf_family_dir[name]).position.table
        facts = sinusoidal_learned.published_learned_table(table)
        assert facts["shape"] == (64, 32) and facts["block"] == 1
        np.testing.assert_allclose(facts["similarity"], by_hand_cosine(table.double().numpy()), atol=1e-9)
        assert facts["components"].explained.size == 4
    with pytest.raises(ValueError):
        sinusoidal_learned.published_learned_table(torch.zeros(1, 4))
