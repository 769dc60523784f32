"""Unit tests of posviz.labs (the live labs' inference) on tiny random models.

The models are untrained, so the tests check identities that hold for any weights: a strategy is
"correct" when it gives the same per-byte losses as an independent computation, "broken" when it
does not. Attention weights are sharpened (``sharp``) so that position effects are large enough
to see in a random model.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from posviz import labs
from posviz.errors import PosvizError, PositionLimitError
from posviz.evaluate import bits_per_byte, copy_probe
from posviz.limits import MAX_KV_CACHE_POSITIONS, MAX_SLIDING_BYTES, MAX_TEXT_BYTES, max_eval_length
from posviz.positions import POSITION_METHODS, method_names
from posviz.positions.rope_scaling import ROPE_SCALINGS, base_inv_freq


def sharp(model, gain: float = 12.0):
    """Scale the query/key projections so a random model's attention is peaked, not uniform."""
    with torch.no_grad():
        for block in model.blocks:
            C = model.config.n_embd
            block.attn.c_attn.weight[: 2 * C] *= gain
    return model


@pytest.fixture(scope="module")
def text_ids(corpus):
    return labs.prepare_text(corpus.eval_documents[0][:4096]).ids


def full_forward_bits(model, ids):
    """Per-byte loss (bits) of one causal forward pass: entry t predicts byte t + 1."""
    with torch.no_grad():
        logits = model(ids[None, :-1]).logits[0].float()
    return (F.cross_entropy(logits, ids[1:], reduction="none") / math.log(2)).numpy()


# ------------------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------------------
def test_prepare_text_rejects_empty_and_caps_huge_text():
    for empty in ("", "   \n\t ", b""):
        with pytest.raises(PosvizError, match="empty"):
            labs.prepare_text(empty)
    huge = labs.prepare_text("x" * (MAX_TEXT_BYTES + 10))
    assert len(huge) == MAX_TEXT_BYTES
    assert any(f"{MAX_TEXT_BYTES:,}" in n for n in huge.notices)
    plain = labs.prepare_text("def f():\n\treturn 1\n")
    assert plain.notices == () and plain.as_bytes() == b"def f():\n\treturn 1\n"
    odd = labs.prepare_text(b"ab\x00\x01c\xff")
    assert any("2 non-text" in n for n in odd.notices) and any("UTF-8" in n for n in odd.notices)


def test_characters_with_bits_groups_utf8_and_sums_bytes():
    data = "aé€".encode()  # 1 + 2 + 3 bytes
    bits = np.array([np.nan, 1.0, 2.0, 3.0, 4.0, 5.0])
    chars = labs.characters_with_bits(list(data), bits)
    assert [c for c, _ in chars] == ["a", "é", "€"]
    assert math.isnan(chars[0][1]) and chars[1][1] == 3.0 and chars[2][1] == 12.0
    broken = labs.characters_with_bits([0xFF, 0x41], np.array([1.0, 2.0]))
    assert broken == [("\ufffd", 1.0), ("A", 2.0)]


def test_moving_average_skips_nan():
    out = labs.moving_average(np.array([np.nan, 1.0, 3.0, np.nan, 5.0]), 3)
    assert out[0] == 1.0 and out[1] == 2.0 and out[2] == 2.0 and out[3] == 4.0 and out[4] == 5.0
    assert np.array_equal(labs.moving_average(np.array([1.0, 2.0]), 1), [1.0, 2.0])


def test_length_options_span_a_few_bytes_to_the_cap():
    opts = labs.length_options(256, 4096)
    assert opts[0] == 4 and opts[-1] == 4096 and 256 in opts and opts == sorted(set(opts))
    assert labs.length_options(256, 100)[-1] == 100


# ------------------------------------------------------------------------------------------------
# Model cache
# ------------------------------------------------------------------------------------------------
def test_model_cache_is_keyed_and_bounded(tiny_models, monkeypatch):
    labs.clear_model_cache()
    folder = tiny_models / "rope"
    a = labs.get_model(folder)
    assert labs.get_model(folder) is a
    scaled = labs.get_model(folder, {"scaling": "linear", "factor": 2.0})
    assert scaled is not a and scaled.position.options.scaling == "linear"
    assert labs.get_model(folder, {"factor": 2.0, "scaling": "linear"}) is scaled  # key ignores dict order
    monkeypatch.setattr(labs, "CACHE_ENTRIES", 2)
    labs.get_model(tiny_models / "alibi")
    assert len(labs.cached_model_keys()) == 2
    assert labs.get_model(folder) is not a  # the oldest entry was evicted
    # a rewritten weights file gives a new stamp, so the model is reloaded
    before = labs.get_model(tiny_models / "alibi")
    weights = tiny_models / "alibi" / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert labs.get_model(tiny_models / "alibi") is not before
    labs.clear_model_cache()


# ------------------------------------------------------------------------------------------------
# Scoring at a length
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", method_names())
def test_score_at_length_matches_evaluate(method, text_ids):
    model = tiny_model(method)
    length = 32  # the tiny models' training length: every method can run it
    score = labs.score_at_length(model, text_ids, length)
    budget = max_eval_length(32)
    assert score.n_windows == budget // length and score.n_bytes == score.n_windows * length + 1
    assert score.bpb == pytest.approx(bits_per_byte(model, text_ids[: score.n_bytes], length), abs=1e-5)
    assert score.position_bits.shape == (length,) and np.isfinite(score.position_bits).all()
    assert np.isnan(score.byte_bits[0]) and np.isfinite(score.byte_bits[1:]).all()
    assert score.bpb == pytest.approx(np.nanmean(score.byte_bits), abs=1e-6)
    # one window's byte losses are the full forward pass's
    first = full_forward_bits(model, text_ids[:length])
    assert np.allclose(score.byte_bits[1:length], first, atol=1e-5)


def test_score_at_length_limits(text_ids):
    learned = tiny_model("learned")
    with pytest.raises(PositionLimitError, match="32 rows"):
        labs.score_at_length(learned, text_ids, 64)
    rope = tiny_model("rope")
    cap = labs.length_cap(rope)
    assert cap == max_eval_length(32)
    with pytest.raises(PosvizError, match="cap"):
        labs.score_at_length(rope, text_ids, cap * 2)
    with pytest.raises(PosvizError, match="needs 65 bytes of text"):
        labs.score_at_length(rope, text_ids[:40], 64)
    with pytest.raises(PosvizError, match="at least 2"):
        labs.score_at_length(rope, text_ids, 1)


# ------------------------------------------------------------------------------------------------
# Attention
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", method_names())
def test_attention_rows_are_causal_distributions(method, text_ids):
    model = sharp(tiny_model(method))
    probs = labs.attention_probs(model, text_ids, 32, layer=1)
    assert probs.shape == (4, 32, 32)
    assert torch.allclose(probs.sum(-1), torch.ones(4, 32), atol=1e-5)
    assert float(probs.triu(1).abs().max()) == 0.0


def test_attention_stats_on_known_matrices():
    T = 6
    identity = torch.eye(T)[None]
    d, e = labs.attention_stats(identity)
    assert d[0] == pytest.approx(0.0) and e[0] == pytest.approx(0.0, abs=1e-6)
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    d, e = labs.attention_stats(uniform[None])
    assert d[0] == pytest.approx(np.mean([i / 2 for i in range(T)]), rel=1e-5)
    assert e[0] == pytest.approx(np.mean([math.log2(i + 1) for i in range(T)]), rel=1e-5)


def test_attention_view_pools_long_maps(text_ids):
    model = tiny_model("alibi")
    view = labs.attention_view(model, text_ids, 512, layer=0, log_scale=True, max_side=128)
    assert view.block == 4 and len(view.maps) == 4 and view.maps[0].shape == (128, 128)
    finite = np.concatenate([m[np.isfinite(m)] for m in view.maps])
    assert finite.max() <= 0 and finite.min() >= math.log10(labs.LOG_FLOOR)
    # the pooled map is the block mean of the full map (then log10)
    probs = labs.attention_probs(model, text_ids, 512, 0)[2].numpy().astype(float)
    assert view.maps[2][5, 1] == pytest.approx(math.log10(probs[20:24, 4:8].mean()), abs=1e-5)
    assert np.isnan(view.maps[2][0, 1])  # fully masked block
    distance, entropy = labs.attention_stats(labs.attention_probs(model, text_ids, 512, 0))
    assert np.allclose(view.distance, distance) and np.allclose(view.entropy, entropy)


@pytest.mark.parametrize("method", method_names())
def test_growth_read_off_one_long_pass_equals_one_pass_per_length(method, text_ids):
    """Causality: the first n queries of a long window attend as a window of n bytes would."""
    model = sharp(tiny_model(method))
    limit = model.position.max_positions
    length = 96 if limit is None else min(96, limit)
    lengths = labs.growth_lengths(length, 32, limit)
    view = labs.attention_view(model, text_ids, length, layer=1)
    separate = labs.attention_growth(model, text_ids, lengths, layer=1)
    read_off = labs.prefix_growth(view, lengths)
    assert [(r["length"], r["head"]) for r in read_off] == [(r["length"], r["head"]) for r in separate]
    for a, b in zip(read_off, separate):
        assert a["distance"] == pytest.approx(b["distance"], rel=1e-4, abs=1e-4), (a, b)
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-4, abs=1e-4), (a, b)
    with pytest.raises(PosvizError, match="outside"):
        labs.prefix_growth(view, [length + 1])


@pytest.mark.parametrize("T,max_side", [(100, 16), (96, 16), (40, 64)])
def test_pooled_attention_equals_the_nan_aware_block_mean(T, max_side):
    """The one-pass pooling (visible-entry counts computed, not masked) matches pooling each head's
    NaN-masked map, including a ragged last block (100 = 14 blocks of 7 + 2) and no pooling at all."""
    torch.manual_seed(0)
    scores = torch.randn(3, T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    probs = scores.softmax(-1)
    pooled, block = labs.pool_attention(probs, max_side)
    for h in range(3):
        expected, expected_block = labs.pool_matrix(labs.display_attention(probs[h], False), max_side)
        assert block == expected_block
        np.testing.assert_allclose(pooled[h], expected, rtol=1e-5, atol=1e-7, equal_nan=True)
    assert np.isnan(pooled[0, 0, -1])  # top-right cell: future keys only


def test_a_shared_bias_does_not_outlive_the_forward_pass(text_ids):
    """ALiBi's (1, H, T, T) bias is memoised across layers; keeping it would hold 256 MB per model at 4,096 bytes."""
    model = tiny_model("alibi")
    with torch.no_grad():
        model(torch.as_tensor(text_ids[:64])[None])
    assert model.position._memo is None


@pytest.mark.parametrize("method", [m for m, cls in POSITION_METHODS.items() if m != "learned"])
def test_one_pass_inspection_equals_score_and_map_run_apart(method, text_ids):
    """At the cap (one window) the map's forward pass gives the score too; below it the two run apart."""
    model = sharp(tiny_model(method))
    for length in (labs.length_cap(model), 64):
        score, view = labs.inspect_at_length(model, text_ids, length, layer=1)
        apart_score = labs.score_at_length(model, text_ids, length)
        apart_view = labs.attention_view(model, text_ids, length, layer=1)
        assert (score.n_windows, score.n_bytes) == (apart_score.n_windows, apart_score.n_bytes)
        assert score.n_windows == (1 if length == labs.length_cap(model) else labs.length_cap(model) // 64)
        assert score.bpb == pytest.approx(apart_score.bpb, rel=1e-5)
        np.testing.assert_allclose(score.byte_bits, apart_score.byte_bits, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(view.entropy, apart_view.entropy, rtol=1e-5)
        np.testing.assert_allclose(np.stack(view.maps), np.stack(apart_view.maps), rtol=1e-4, atol=1e-6)


def test_attention_growth_stops_at_the_method_limit(text_ids):
    assert labs.growth_lengths(512, 32, limit=32) == [16, 32]
    assert labs.growth_lengths(512, 32) == [16, 32, 64, 128, 256, 512]
    rows = labs.attention_growth(tiny_model("rope"), text_ids, [16, 64], layer=0)
    assert [(r["length"], r["head"]) for r in rows] == [(16, h) for h in range(4)] + [(64, h) for h in range(4)]


# ------------------------------------------------------------------------------------------------
# Sliding window strategies
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", method_names())
def test_reencode_equals_the_full_forward_pass_inside_the_window(method, text_ids):
    """With the window as long as the text, re-encoding the prefix at each step is the full forward pass."""
    model = sharp(tiny_model(method))
    n = 32
    r = labs.sliding_score(model, text_ids, window=n, strategy="reencode", n_bytes=n, one_pass_prefix=False)
    assert r.error is None and r.n_scored == n - 1
    assert np.allclose(r.byte_bits, full_forward_bits(model, text_ids[:n]), atol=1e-4)


@pytest.mark.parametrize("method", [m for m, cls in POSITION_METHODS.items() if cls.kind != "absolute"])
def test_cached_window_equals_reencode_for_relative_methods(method, text_ids):
    """One layer: cached keys depend only on their byte and position, so keeping them with their true
    positions is exactly re-encoding the window (relative methods see only distances)."""
    model = sharp(tiny_model(method, n_layer=1))
    window, n = 8, 40
    cached = labs.sliding_score(model, text_ids, window, "cached_window", n)
    reencode = labs.sliding_score(model, text_ids, window, "reencode", n)
    assert cached.error is None
    assert np.allclose(cached.byte_bits, reencode.byte_bits, atol=2e-4), np.abs(cached.byte_bits - reencode.byte_bits).max()


@pytest.mark.parametrize("method", method_names())
def test_strategies_agree_until_the_window_is_full(method, text_ids):
    model = sharp(tiny_model(method))
    window, n = 8, 30
    results = {s: labs.sliding_score(model, text_ids, window, s, n, one_pass_prefix=False) for s in labs.STRATEGIES}
    for s in labs.STRATEGIES:  # steps 0..W-1 never evict: same context, same positions
        assert np.allclose(results[s].byte_bits[:window], results["reencode"].byte_bits[:window], atol=1e-4), s
    # ... which is why the lab computes them in one forward pass that also fills the cache: same bits throughout
    for s in labs.STRATEGIES:
        fast = labs.sliding_score(model, text_ids, window, s, n)
        assert fast.error is None and fast.n_scored == results[s].n_scored
        assert np.allclose(fast.byte_bits, results[s].byte_bits, atol=1e-4), (s, np.abs(fast.byte_bits - results[s].byte_bits).max())


@pytest.mark.parametrize("method", method_names())
def test_shifted_cache_is_broken_exactly_where_positions_are_baked_in(method, text_ids):
    """One layer, so re-encoding is the exact reference. A shifted cache relabels the window 0..W-1:
    harmless when positions enter only at attention time, wrong when they were baked into the keys."""
    model = sharp(tiny_model(method, n_layer=1))
    window, n = 8, 40
    shifted = labs.sliding_score(model, text_ids, window, "shifted_cache", n)
    reencode = labs.sliding_score(model, text_ids, window, "reencode", n)
    assert shifted.error is None
    gap = np.abs(shifted.byte_bits - reencode.byte_bits)[window:].max()
    if model.position.acts_on in ("nothing", "logits"):
        assert gap < 1e-4
        assert "Correct" in labs.strategy_verdict(model, "shifted_cache")
    else:  # learned, sinusoidal (input) and rope (q/k): float noise is ~1e-6, this is 1,000x that
        assert gap > 1e-3
        assert "Broken" in labs.strategy_verdict(model, "shifted_cache")


@pytest.mark.parametrize("method", [m for m, cls in POSITION_METHODS.items() if cls.acts_on in ("nothing", "logits")])
def test_shifted_cache_equals_cached_window_for_attention_time_methods(method, text_ids):
    """Any depth: both strategies attend over the same cached keys; relabelling keeps every distance."""
    model = sharp(tiny_model(method))
    shifted = labs.sliding_score(model, text_ids, 8, "shifted_cache", 40)
    cached = labs.sliding_score(model, text_ids, 8, "cached_window", 40)
    assert np.allclose(shifted.byte_bits, cached.byte_bits, atol=1e-5)


def test_cached_window_for_absolute_methods(text_ids):
    learned = tiny_model("learned")
    r = labs.sliding_score(learned, text_ids, 8, "cached_window", 60)
    assert r.bpb is None and r.bpb_full is None and r.n_scored == 32
    assert r.error.startswith("Stopped at byte 32") and "32 rows" in r.error
    assert "Cannot run past byte 32" in labs.strategy_verdict(learned, "cached_window")
    sinusoidal = tiny_model("sinusoidal")
    r = labs.sliding_score(sinusoidal, text_ids, 8, "cached_window", 60)
    assert r.error is None and np.isfinite(r.bpb)
    assert "never saw" in labs.strategy_verdict(sinusoidal, "cached_window")


def test_sliding_result_fields(text_ids):
    r = labs.sliding_score(tiny_model("nope"), text_ids, 8, "cached_window", 30)
    assert r.n_scored == 29 and r.ms_per_byte > 0
    assert r.bpb == pytest.approx(r.byte_bits.mean()) and r.bpb_full == pytest.approx(r.byte_bits[8:].mean())


def test_sliding_caps(text_ids):
    model = tiny_model("nope")
    long_text = torch.cat([text_ids] * 2)
    with pytest.raises(PosvizError, match=f"{MAX_SLIDING_BYTES:,}"):
        labs.sliding_score(model, long_text, 8, "reencode", MAX_SLIDING_BYTES + 1)
    with pytest.raises(PosvizError, match="window"):
        labs.sliding_score(model, text_ids, MAX_KV_CACHE_POSITIONS + 1, "reencode", 20)
    with pytest.raises(PosvizError, match="unknown strategy"):
        labs.sliding_score(model, text_ids, 8, "magic", 20)
    with pytest.raises(PosvizError, match="cache check"):
        labs.cache_check(model, long_text, MAX_KV_CACHE_POSITIONS + 1)


def test_two_pass_diagram():
    W = 4
    rows = labs.two_pass_diagram(W, t=10)
    by = {(r["strategy"], r["pass"]): r for r in rows}  # last row of each pass: the newest byte
    assert {(r["strategy"], r["pass"]) for r in rows} == {(s, p) for s in labs.STRATEGIES for p in ("t", "t+1")}
    re_t = [r for r in rows if r["strategy"] == "reencode" and r["pass"] == "t"]
    assert [r["byte"] for r in re_t] == [7, 8, 9, 10] and [r["position"] for r in re_t] == [0, 1, 2, 3]
    assert all(r["recomputed"] and r["consistent"] for r in re_t)
    sh = [r for r in rows if r["strategy"] == "shifted_cache" and r["pass"] == "t+1"]
    assert [r["position"] for r in sh] == [0, 1, 2, 3] and [r["baked"] for r in sh] == [3, 3, 3, 3]
    assert [r["consistent"] for r in sh] == [False, False, False, True]
    ca = [r for r in rows if r["strategy"] == "cached_window" and r["pass"] == "t+1"]
    assert [r["position"] for r in ca] == [8, 9, 10, 11] and all(r["consistent"] for r in ca)
    assert by[("cached_window", "t+1")]["recomputed"]
    with pytest.raises(PosvizError):
        labs.two_pass_diagram(4, t=2)


@pytest.mark.parametrize("method", method_names())
def test_cache_check_matches_full_forward(method, text_ids):
    model = sharp(tiny_model(method))
    check = labs.cache_check(model, text_ids, 32, time_reencode=method == "t5")
    assert check["max_abs_diff"] < 1e-4 * max(1.0, check["logit_scale"])
    assert check["full_ms"] > 0 and check["cached_ms_per_byte"] > 0
    if method == "t5":
        assert check["reencode_ms_per_byte"] > 0


# ------------------------------------------------------------------------------------------------
# RoPE context extension
# ------------------------------------------------------------------------------------------------
def test_rope_scaling_curves_cover_the_registry(tiny_models, text_ids):
    folder = tiny_models / "rope"
    lengths = labs.extension_lengths(32, max_eval_length(32), len(text_ids))
    assert lengths == [32, 64, 128, 256, 512]
    rows = labs.rope_scaling_curves(folder, 4.0, text_ids, lengths[:3])
    assert {r["scaling"] for r in rows} == set(ROPE_SCALINGS)
    bpb = {(r["scaling"], r["length"]): r["bpb"] for r in rows}
    plain = labs.get_model(folder)
    assert bpb[("none", 64)] == pytest.approx(labs.score_at_length(plain, text_ids, 64).bpb, abs=1e-6)
    linear = labs.get_model(folder, {"scaling": "linear", "factor": 4.0})
    assert bpb[("linear", 64)] == pytest.approx(labs.score_at_length(linear, text_ids, 64).bpb, abs=1e-6)
    assert bpb[("linear", 64)] != pytest.approx(bpb[("none", 64)], abs=1e-7)
    with pytest.raises(PosvizError, match="Unknown RoPE scaling"):
        labs.scaling_overrides("magic", 2.0)


def test_rope_wavelengths(tiny_models):
    rows = labs.rope_wavelengths(tiny_models / "rope", factor=4.0)
    waves = {}
    for r in rows:
        waves.setdefault(r["scaling"], []).append(r["wavelength"])
    assert set(waves) == set(ROPE_SCALINGS)
    head_dim = 32 // 4
    expected = (2 * math.pi / base_inv_freq(head_dim, 10000.0)).numpy()
    assert np.allclose(waves["none"], expected)
    assert np.allclose(waves["linear"], 4 * expected)
    assert waves["ntk"][0] == pytest.approx(expected[0]) and waves["ntk"][-1] == pytest.approx(4 * expected[-1])


def test_shipped_curves_read_metrics(tiny_models):
    curve = labs.shipped_bpb_curve(tiny_models / "learned")
    assert [n for n, _ in curve] == [32, 64, 128, 256, 512] and curve[0][1] is not None and curve[1][1] is None
    rows = labs.shipped_scaling_curves(tiny_models / "rope")
    assert {r["scaling"] for r in rows} == set(ROPE_SCALINGS)
    assert labs.shipped_bpb_curve(tiny_models / "missing") == []


# ------------------------------------------------------------------------------------------------
# Copy probe and ALiBi's reach
# ------------------------------------------------------------------------------------------------
def test_copy_probe_live_matches_evaluate(corpus):
    model = tiny_model("alibi")
    filler = corpus.eval_stream(4096)
    live = labs.copy_probe_live(model, filler, [0, 16], string_length=8, trials=2)
    for gap in (0, 16):
        assert live[gap] == copy_probe(model, filler, [gap], string_length=8, trials=2, seed=gap)[str(gap)]
    learned = labs.copy_probe_live(tiny_model("learned"), filler, [0, 64], string_length=8, trials=2)
    assert learned[0] is not None and learned[64] is None  # 8 + 64 + 8 > 32 positions
    assert labs.probe_gaps(max_eval_length(32), 32) == [0, 16, 32, 64, 128, 256]
    with pytest.raises(PosvizError, match="cap"):
        labs.copy_probe_live(model, filler, [4096], string_length=8)


def test_alibi_attenuation():
    rows = labs.alibi_attenuation(4, [0, 100])
    assert [r["slope"] for r in rows if r["distance"] == 0] == pytest.approx([0.25, 0.0625, 0.015625, 0.00390625])
    gentle = [r for r in rows if r["head"] == 3 and r["distance"] == 100][0]
    assert gentle["penalty"] == pytest.approx(100 / 256) and gentle["factor"] == pytest.approx(math.exp(-100 / 256))


# ------------------------------------------------------------------------------------------------
# Comparisons
# ------------------------------------------------------------------------------------------------
UNBOUNDED = [m for m in method_names() if tiny_model(m).position.max_positions is None]


@pytest.mark.parametrize("method", UNBOUNDED)
def test_compare_lengths_first_half_is_identical(method, text_ids):
    """By causality a byte in the first half of a 2L window has the same context as in a window of L."""
    out = labs.compare_lengths(tiny_model(method), text_ids, 32)
    assert out["position"].shape == (64,)
    assert np.allclose(out["diff"][:32], 0.0, atol=1e-5)
    assert np.isfinite(out["diff"]).all() and not np.allclose(out["diff"][32:], 0.0, atol=1e-5)


def test_compare_methods_and_attention_difference(text_ids):
    a, b = tiny_model("nope"), tiny_model("alibi")
    out = labs.compare_methods(a, b, text_ids, 32)
    assert np.allclose(out["diff"][1:], out["b"][1:] - out["a"][1:])
    assert out["bpb_a"] == pytest.approx(labs.score_at_length(a, text_ids, 32).bpb)
    maps = labs.attention_difference(sharp(a), sharp(b), text_ids, 32, 0, 1)
    assert maps["block"] == 1 and np.allclose(maps["diff"], maps["b"] - maps["a"], equal_nan=True)
    assert np.isnan(maps["diff"][0, 1]) and maps["max_abs_diff"] > 0.01


def test_length_attention_difference_renormalises_for_relative_methods(text_ids):
    """Layer 0 of a relative method: attention on the second half of a 2L window, renormalised over
    those keys, is the attention of the same bytes alone (only distances and contents matter)."""
    model = sharp(tiny_model("alibi"))
    out = labs.length_attention_difference(model, text_ids, 32, layer=0, head=3)
    assert out["far_mass"].shape == (32,) and ((out["far_mass"] >= 0) & (out["far_mass"] <= 1)).all()
    renormalised = out["long"] / (1 - out["far_mass"])[:, None]
    assert np.allclose(renormalised, out["short"], atol=1e-4, equal_nan=True)
    absolute = labs.length_attention_difference(sharp(tiny_model("sinusoidal")), text_ids, 32, layer=0, head=3)
    renormalised = absolute["long"] / (1 - absolute["far_mass"])[:, None]
    assert np.nanmax(np.abs(renormalised - absolute["short"])) > 0.01  # positions moved by L: a different map
