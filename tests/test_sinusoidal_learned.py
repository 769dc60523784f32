"""posviz.sinusoidal_learned against independent computations: the paper's formula written out, closed
forms, a known table."""
from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import tiny_model
from posviz import sinusoidal_learned


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
