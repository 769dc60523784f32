"""Unit tests of posviz.labs.attention_maps (the labs' attention maps and per-head summaries) on tiny random
models. Attention weights are sharpened (``sharp``) so that position effects are large enough to see
in a random model."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny_lab, tiny_model
from maths_support import sharp, text_ids  # noqa: F401  (text_ids: a fixture)

from posviz.models.shipped import as_lab_model
from posviz.labs import attention_maps
from posviz.errors import PosvizError
from posviz.positions import method_names


# ------------------------------------------------------------------------------------------------
# Attention
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", method_names())
def test_attention_rows_are_causal_distributions(method, text_ids):
    model = as_lab_model(sharp(tiny_model(method)))
    probs = attention_maps.attention_probs(model, text_ids, 32, layer=1)
    assert probs.shape == (4, 32, 32)
    if model.net.position.weights_sum_to_one:
        assert torch.allclose(probs.sum(-1), torch.ones(4, 32), atol=1e-5)
    else:  # a sink (rope_sinks): what it takes is no key's
        assert torch.all(probs.sum(-1) <= 1 + 1e-5)
    assert float(probs.triu(1).abs().max()) == 0.0


def test_attention_stats_on_known_matrices():
    T = 6
    identity = torch.eye(T)[None]
    d, e = attention_maps.attention_stats(identity)
    assert d[0] == pytest.approx(0.0) and e[0] == pytest.approx(0.0, abs=1e-6)
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    d, e = attention_maps.attention_stats(uniform[None])
    assert d[0] == pytest.approx(np.mean([i / 2 for i in range(T)]), rel=1e-5)
    assert e[0] == pytest.approx(np.mean([math.log2(i + 1) for i in range(T)]), rel=1e-5)


def test_attention_view_pools_long_maps(text_ids):
    model = tiny_lab("alibi")
    view = attention_maps.attention_view(model, text_ids, 512, layer=0, log_scale=True, max_side=128)
    assert view.block == 4 and len(view.maps) == 4 and view.maps[0].shape == (128, 128)
    finite = np.concatenate([m[np.isfinite(m)] for m in view.maps])
    assert finite.max() <= 0 and finite.min() >= math.log10(attention_maps.LOG_FLOOR)
    # the pooled map is the block mean of the full map (then log10)
    probs = attention_maps.attention_probs(model, text_ids, 512, 0)[2].numpy().astype(float)
    assert view.maps[2][5, 1] == pytest.approx(math.log10(probs[20:24, 4:8].mean()), abs=1e-5)
    assert np.isnan(view.maps[2][0, 1])  # fully masked block
    distance, entropy = attention_maps.attention_stats(attention_maps.attention_probs(model, text_ids, 512, 0))
    assert np.allclose(view.distance, distance) and np.allclose(view.entropy, entropy)


@pytest.mark.parametrize("method", method_names())
def test_growth_read_off_one_long_pass_equals_one_pass_per_length(method, text_ids):
    """Causality: the first n queries of a long window attend as a window of n bytes would."""
    model = as_lab_model(sharp(tiny_model(method)))
    limit = model.position.max_positions
    length = 96 if limit is None else min(96, limit)
    lengths = attention_maps.growth_lengths(length, 32, limit)
    view = attention_maps.attention_view(model, text_ids, length, layer=1)
    separate = attention_maps.attention_growth(model, text_ids, lengths, layer=1)
    read_off = attention_maps.prefix_growth(view, lengths)
    assert [(r["length"], r["head"]) for r in read_off] == [(r["length"], r["head"]) for r in separate]
    for a, b in zip(read_off, separate):
        assert a["distance"] == pytest.approx(b["distance"], rel=1e-4, abs=1e-4), (a, b)
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-4, abs=1e-4), (a, b)
    with pytest.raises(PosvizError, match="outside"):
        attention_maps.prefix_growth(view, [length + 1])


@pytest.mark.parametrize("T,max_side", [(100, 16), (96, 16), (40, 64)])
def test_pooled_attention_equals_the_nan_aware_block_mean(T, max_side):
    """The one-pass pooling (visible-entry counts computed, not masked) matches pooling each head's
    NaN-masked map, including a ragged last block (100 = 14 blocks of 7 + 2) and no pooling at all."""
    torch.manual_seed(0)
    scores = torch.randn(3, T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    probs = scores.softmax(-1)
    pooled, block = attention_maps.pool_attention(probs, max_side)
    for h in range(3):
        expected, expected_block = attention_maps.pool_matrix(attention_maps.display_attention(probs[h], False), max_side)
        assert block == expected_block
        np.testing.assert_allclose(pooled[h], expected, rtol=1e-5, atol=1e-7, equal_nan=True)
    assert np.isnan(pooled[0, 0, -1])  # top-right cell: future keys only


def test_a_shared_bias_does_not_outlive_the_forward_pass(text_ids):
    """ALiBi's (1, H, T, T) bias is memoised across layers; keeping it would hold 256 MB per model at 4,096 bytes."""
    model = tiny_lab("alibi")
    with torch.no_grad():
        model(torch.as_tensor(text_ids[:64])[None])
    assert model.position._memo is None


def test_attention_growth_stops_at_the_method_limit(text_ids):
    assert attention_maps.growth_lengths(512, 32, limit=32) == [16, 32]
    assert attention_maps.growth_lengths(512, 32) == [16, 32, 64, 128, 256, 512]
    rows = attention_maps.attention_growth(tiny_lab("rope"), text_ids, [16, 64], layer=0)
    assert [(r["length"], r["head"]) for r in rows] == [(16, h) for h in range(4)] + [(64, h) for h in range(4)]


@pytest.mark.parametrize("preset, expected", [(None, "1"), ("0", "0")])
def test_importing_posviz_puts_large_tensors_on_huge_pages_unless_told_not_to(preset, expected):
    """A 256 MB map in 4 KB pages cost a fifth of its forward pass in page faults (see posviz/__init__.py):
    importing posviz turns PyTorch's huge-page allocation on, and leaves a user's own setting alone."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if preset is not None:
        env["THP_MEM_ALLOC_ENABLE"] = preset
    code = "import os, posviz; print(os.environ['THP_MEM_ALLOC_ENABLE'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stdout.strip() == expected
