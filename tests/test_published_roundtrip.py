"""Round trip on trained weights: the shipped checkpoints exported to transformers (models/hf/) and opened
as published models give every lab the shipped path's numbers, to 1e-4 bits per byte.

The exports are the offline example of the published-model path (``POSVIZ_MODELS=models/hf/rope-neox``):
the same weights, run by transformers' GPT-2, GPT-NeoX and BLOOM instead of posviz's own forward.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from posviz.labs import attention_maps, compare, context_extension, extrapolation, kv_cache
from posviz.training.data import load_corpus
from posviz.models.interface import open_model
from posviz.models.hf.model import PublishedModel

ROOT = Path(__file__).resolve().parent.parent
EXPORTS = {"learned": "learned-gpt2", "rope": "rope-neox", "alibi": "alibi-bloom"}
TEXT = load_corpus().eval_stream(1 << 13).tobytes()
BPB = 1e-4


def pair(method):
    return open_model(ROOT / "models" / method), open_model(ROOT / "models" / "hf" / EXPORTS[method])


@pytest.mark.parametrize("method", list(EXPORTS))
def test_the_export_describes_itself_as_its_checkpoint(method):
    shipped, export = pair(method)
    assert isinstance(export, PublishedModel) and export.unit == "token"
    assert (export.method, export.train_length, export.n_layer, export.n_head) == \
        (shipped.method, shipped.train_length, shipped.n_layer, shipped.n_head)
    assert (export.max_positions, export.acts_on, export.is_absolute, export.is_shift_invariant()) == \
        (shipped.max_positions, shipped.acts_on, shipped.is_absolute, shipped.is_shift_invariant())
    assert torch.equal(export.encode(TEXT), shipped.encode(TEXT)) and export.decode(export.encode(TEXT)) == TEXT


@pytest.mark.parametrize("method", list(EXPORTS))
def test_extrapolation_and_attention_give_the_shipped_numbers(method):
    shipped, export = pair(method)
    for length in (256, 1024, 4096):
        if shipped.cannot_run(length):
            assert export.cannot_run(length)
            with pytest.raises(Exception, match="cannot run"):
                extrapolation.score_at_length(export, export.encode(TEXT), length)
            continue
        a = extrapolation.score_at_length(shipped, shipped.encode(TEXT), length)
        b = extrapolation.score_at_length(export, export.encode(TEXT), length)
        assert b.bpb == pytest.approx(a.bpb, abs=BPB), length
        np.testing.assert_allclose(b.position_bits, a.position_bits, atol=1e-3)
    score_a, view_a = extrapolation.inspect_at_length(shipped, shipped.encode(TEXT[:600]), 512 if method != "learned" else 256, 3)
    score_b, view_b = extrapolation.inspect_at_length(export, export.encode(TEXT[:600]), 512 if method != "learned" else 256, 3)
    assert score_b.bpb == pytest.approx(score_a.bpb, abs=BPB)
    np.testing.assert_allclose(view_b.distance, view_a.distance, atol=1e-3)
    np.testing.assert_allclose(view_b.entropy, view_a.entropy, atol=1e-3)
    probs_a = attention_maps.attention_probs(shipped, shipped.encode(TEXT), 300 if method != "learned" else 200, 2)
    probs_b = attention_maps.attention_probs(export, export.encode(TEXT), 300 if method != "learned" else 200, 2)
    torch.testing.assert_close(probs_b, probs_a, atol=1e-4, rtol=0)


@pytest.mark.parametrize("method", list(EXPORTS))
def test_the_kv_cache_lab_gives_the_shipped_numbers(method):
    shipped, export = pair(method)
    ids = shipped.encode(TEXT[:300])
    for strategy in kv_cache.STRATEGIES:
        a = kv_cache.sliding_score(shipped, ids, 96, strategy)
        b = kv_cache.sliding_score(export, export.encode(TEXT[:300]), 96, strategy)
        assert (a.bpb is None) == (b.bpb is None), strategy
        if a.bpb is not None:
            assert b.bpb == pytest.approx(a.bpb, abs=BPB), strategy
            np.testing.assert_allclose(b.id_bits, a.id_bits, atol=2e-3)
    check = kv_cache.cache_check(export, export.encode(TEXT), 100, time_reencode=False)
    assert check["max_abs_diff"] < 1e-3


def test_context_extension_scalings_give_the_shipped_numbers():
    """Linear, NTK, dynamic NTK, YaRN and Llama 3 through transformers' rope_parameters on the NeoX export
    against posviz's own scalings on the rope checkpoint, at 4x the trained context."""
    shipped, export = pair("rope")
    text = TEXT[:2049]  # two windows of 1,024
    rows_a = context_extension.rope_scaling_curves(shipped, 4.0, shipped.encode(text), [1024])
    rows_b = context_extension.rope_scaling_curves(export, 4.0, export.encode(text), [1024])
    got = {r["scaling"]: r["bpb"] for r in rows_b}
    for row in rows_a:
        assert got[row["scaling"]] == pytest.approx(row["bpb"], abs=BPB), row["scaling"]
    for scaling in ("linear", "yarn", "llama3", "ntk"):
        overrides = context_extension.scaling_overrides(scaling, 4.0)
        fa, aa = shipped.with_position_options(overrides).frequencies(1024)
        fb, ab = export.with_position_options(overrides).frequencies(1024)
        torch.testing.assert_close(fb, fa.to(fb.dtype), atol=1e-6, rtol=1e-5)
        assert ab == pytest.approx(aa, rel=1e-6)


def test_compare_a_published_model_with_a_shipped_checkpoint():
    shipped, export = pair("rope")
    text = TEXT[:2049]
    same = compare.compare_methods(shipped, export, shipped.encode(text), 512)
    assert same["bpb_b"] == pytest.approx(same["bpb_a"], abs=BPB)
    np.testing.assert_allclose(same["diff"], 0, atol=1e-3)
    alibi = open_model(ROOT / "models" / "hf" / EXPORTS["alibi"])
    other = compare.compare_methods(alibi, export, shipped.encode(text), 512)
    assert abs(other["bpb_a"] - other["bpb_b"]) > 1e-3
    a, b = compare.compare_lengths(shipped, shipped.encode(text), 512), compare.compare_lengths(export, shipped.encode(text), 512)
    assert b["bpb_long"] == pytest.approx(a["bpb_long"], abs=BPB) and b["bpb_short"] == pytest.approx(a["bpb_short"], abs=BPB)
