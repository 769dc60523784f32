"""Unit tests of posviz.labs.kv_cache (the KV cache & sliding window lab) on tiny random models.

The models are untrained, so the tests check identities that hold for any weights: a strategy is
"correct" when it gives the same per-byte losses as an independent computation, "broken" when it
does not. Attention weights are sharpened (``sharp``) so that position effects are large enough
to see in a random model.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import described, tiny_lab, tiny_model
from maths_support import full_forward_bits, sharp, text_ids  # noqa: F401  (text_ids: a fixture)

from posviz.models.shipped import as_lab_model
from posviz.labs import kv_cache
from posviz.errors import PosvizError
from posviz.limits import MAX_KV_CACHE_POSITIONS, MAX_SLIDING_BYTES
from posviz.positions import POSITION_METHODS, method_names


# ------------------------------------------------------------------------------------------------
# Sliding window strategies
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", method_names())
def test_reencode_equals_the_full_forward_pass_inside_the_window(method, text_ids):
    """With the window as long as the text, re-encoding the prefix at each step is the full forward pass."""
    model = as_lab_model(sharp(tiny_model(method)))
    n = 32
    r = kv_cache.sliding_score(model, text_ids, window=n, strategy="reencode", n_ids=n, one_pass_prefix=False)
    assert r.error is None and r.n_scored == n - 1
    assert np.allclose(r.id_bits, full_forward_bits(model, text_ids[:n]), atol=1e-4)


# (a method whose keys read the bytes before them, PaTH's convolution, has no exact re-encoded reference)
@pytest.mark.parametrize("method", [m for m in POSITION_METHODS if described(m).is_shift_invariant()
                                    and not described(m).reads_before])
def test_cached_window_equals_reencode_for_relative_methods(method, text_ids):
    """One layer: cached keys depend only on their byte and position, so keeping them with their true
    positions is exactly re-encoding the window (relative methods see only distances)."""
    model = as_lab_model(sharp(tiny_model(method, n_layer=1)))
    window, n = 8, 40
    cached = kv_cache.sliding_score(model, text_ids, window, "cached_window", n)
    reencode = kv_cache.sliding_score(model, text_ids, window, "reencode", n)
    assert cached.error is None
    assert np.allclose(cached.id_bits, reencode.id_bits, atol=2e-4), np.abs(cached.id_bits - reencode.id_bits).max()


@pytest.mark.parametrize("method", ["alibi", "rope", "nope", "fox", "t5", "local_global", "rope_sinks"])
def test_streaming_equals_its_window_encoded_afresh_in_one_layer(method, text_ids):
    """StreamingLLM, read straight from the paper: step t >= W sees the K first bytes and the newest W - K
    (itself included), at positions t-W+1 .. t, the sinks first. One layer: a key depends only on its byte
    and position, so that is one forward pass over exactly those bytes at those positions."""
    model = as_lab_model(sharp(tiny_model(method, n_layer=1)))
    window, K, n = 9, 3, 40
    r = kv_cache.sliding_score(model, text_ids, window, "streaming", n, sinks=K)
    assert r.error is None and r.n_scored == n - 1
    expected = []
    with torch.no_grad():
        for t in range(n - 1):
            if t < window:
                held, pos = text_ids[: t + 1], torch.arange(t + 1)
            else:
                held = torch.cat((text_ids[:K], text_ids[t - window + K + 1: t + 1]))
                pos = torch.arange(t - window + 1, t + 1)
            logits = model.net(held[None], positions=pos).logits[0, -1]
            expected.append(float(torch.nn.functional.cross_entropy(logits[None], text_ids[t + 1: t + 2])) / np.log(2))
    assert np.allclose(r.id_bits, expected, atol=2e-4), np.abs(r.id_bits - np.array(expected)).max()
    # no sinks: the cached window with true positions
    none = kv_cache.sliding_score(model, text_ids, window, "streaming", n, sinks=0)
    plain = kv_cache.sliding_score(model, text_ids, window, "cached_window", n)
    assert np.allclose(none.id_bits, plain.id_bits, atol=1e-6)


TURNED = [("rope", {}), ("p_rope", {}), ("rope", {"scaling": "linear", "factor": 4.0}),
          ("rope", {"scaling": "ntk", "factor": 4.0}), ("rope", {"scaling": "yarn", "factor": 4.0}),
          ("rope", {"scaling": "llama3", "factor": 4.0}), ("local_global", {}), ("rope_sinks", {})]
RUN_AGAIN = [("rope", {"scaling": "dynamic", "factor": 4.0}), ("rope", {"scaling": "longrope", "factor": 4.0}),
             ("irope", {"layers": [{"method": "rope"}, {"method": "nope", "options": {"temperature_floor_scale": 32}}]}),
             ("alibi", {}), ("nope", {}), ("fox", {}), ("fire", {}), ("sinusoidal", {})]


@pytest.mark.parametrize("method, options", TURNED + RUN_AGAIN)
def test_streaming_turns_the_cached_sinks_where_a_rotation_is_all_a_key_knows_of_its_position(method, options, text_ids):
    """StreamingLLM moves its sinks before each step past the window. Where a key's position is only a rotation
    fixed for every length (RoPE, p-RoPE, the static scalings, layouts of rotary layers), the cached sink keys are
    turned to their new positions; every other method runs the sink ids again. Both give the same numbers: the
    turned run equals the run-again one (forced by refusing the turn) on every byte, two layers deep, the window
    sliding 60 bytes past itself (the turn is always from the keys first cached, so no rounding builds up)."""
    lab = as_lab_model(sharp(tiny_model(method, n_layer=2, position_options=options)))
    window, K, n = 9, 3, 80
    moves = []
    turn = lab.shift_cache_front
    lab.shift_cache_front = lambda cache, count, start: moves.append(turn(cache, count, start)) or moves[-1]
    turned = kv_cache.sliding_score(lab, text_ids, window, "streaming", n, sinks=K)
    lab.shift_cache_front = lambda cache, count, start: False  # what every method did before: run the sinks again
    again = kv_cache.sliding_score(lab, text_ids, window, "streaming", n, sinks=K)
    assert len(moves) == n - 1 - window and turned.error is None and again.error is None
    assert all(moves) if (method, options) in TURNED else not any(moves), moves
    assert np.allclose(turned.id_bits, again.id_bits, atol=1e-4), np.abs(turned.id_bits - again.id_bits).max()


def test_a_turned_sink_key_is_the_key_computed_at_its_new_position():
    """The rotation itself: a key rotary-encoded at p, turned by s, is the key encoded at p + s (YaRN's attention
    factor is in the cached key once, not twice)."""
    from posviz.positions import ModelShape, build_position_method

    shape = ModelShape(1, 2, 16, 32, 32)
    method = build_position_method("rope", shape, {"scaling": "yarn", "factor": 4.0})
    raw = torch.randn(1, 2, 3, 16, dtype=torch.float64)
    q = torch.zeros_like(raw)
    _, at_p = method.rotate_qk(q, raw, torch.tensor([5, 6, 7]))
    method.forget()
    _, at_p_plus = method.rotate_qk(q, raw, torch.tensor([105, 106, 107]))
    assert torch.allclose(method.shift_cached_keys(0, at_p, 100), at_p_plus, atol=1e-10)
    assert build_position_method("rope", shape, {"scaling": "dynamic", "factor": 4.0}).shift_cached_keys(0, at_p, 1) is None


@pytest.mark.parametrize("method", ["fire", "irope", "alibi"])
def test_streaming_verdict_says_what_a_method_reading_the_query_position_does(method, text_ids):
    """StreamingLLM keeps true positions (the sinks just before the newest keys): equal to the same held bytes
    encoded at 0..W-1 for a method that reads distances alone, not for FIRE (distances divided by a function of
    the query's position past its threshold) or irope (the NoPE layer's temperature grows with the position).
    The verdict must say which: "Correct" only where the numbers are. One layer, so that re-encoding the held
    bytes is the exact reference; irope's one layer is its NoPE layer with the temperature."""
    options = {"layers": [{"method": "nope", "options": {"temperature_floor_scale": 32}}]} if method == "irope" else {}
    lab = as_lab_model(sharp(tiny_model(method, n_layer=1, position_options=options)))  # training length 32
    window, K, n = 9, 3, 80
    r = kv_cache.sliding_score(lab, text_ids, window, "streaming", n, sinks=K)
    assert r.error is None
    at_zero = []  # the bytes the streaming step holds, encoded afresh at 0..W-1
    with torch.no_grad():
        for t in range(window, n - 1):
            held = torch.cat((text_ids[:K], text_ids[t - window + K + 1: t + 1]))
            logits = lab.net(held[None], positions=torch.arange(window)).logits[0, -1]
            at_zero.append(float(torch.nn.functional.cross_entropy(logits[None], text_ids[t + 1: t + 2])) / np.log(2))
    gap = np.abs(r.id_bits[window:] - np.array(at_zero)).max()
    verdict = kv_cache.strategy_verdict(lab, "streaming")
    if method == "alibi":
        assert gap < 1e-4 and verdict.startswith("Correct")
    else:
        assert gap > 1e-3, gap
        assert not verdict.startswith("Correct") and "true position" in verdict and "not the same as moving" in verdict


def test_streaming_sinks_must_be_fewer_than_the_window(text_ids):
    model = as_lab_model(tiny_model("alibi"))
    with pytest.raises(PosvizError, match="fewer than the window"):
        kv_cache.sliding_score(model, text_ids, 4, "streaming", 20, sinks=4)


@pytest.mark.parametrize("method", method_names())
def test_strategies_agree_until_the_window_is_full(method, text_ids):
    model = as_lab_model(sharp(tiny_model(method)))
    window, n = 8, 30
    results = {s: kv_cache.sliding_score(model, text_ids, window, s, n, one_pass_prefix=False) for s in kv_cache.STRATEGIES}
    for s in kv_cache.STRATEGIES:  # steps 0..W-1 never evict: same context, same positions
        assert np.allclose(results[s].id_bits[:window], results["reencode"].id_bits[:window], atol=1e-4), s
    # ... which is why the lab computes them in one forward pass that also fills the cache: same bits throughout
    for s in kv_cache.STRATEGIES:
        fast = kv_cache.sliding_score(model, text_ids, window, s, n)
        assert fast.error is None and fast.n_scored == results[s].n_scored
        assert np.allclose(fast.id_bits, results[s].id_bits, atol=1e-4), (s, np.abs(fast.id_bits - results[s].id_bits).max())


@pytest.mark.parametrize("method", method_names())
@pytest.mark.parametrize("timed", [1, 5])
def test_batched_reencode_equals_reencoding_byte_by_byte(method, timed, text_ids, monkeypatch):
    """Re-encoding's steps after the first window read only the text, so the lab runs most of them as a
    batch of windows and times a few alone: the same bits as running every step alone. Batches of 3
    windows, so the steps split over several batches and around the timed ones."""
    monkeypatch.setattr(kv_cache, "REENCODE_BATCH_TOKENS", 3 * 8)
    model = as_lab_model(sharp(tiny_model(method)))
    window, n = 8, 40
    stepped = kv_cache.sliding_score(model, text_ids, window, "reencode", n, timed_steps=None)
    batched = kv_cache.sliding_score(model, text_ids, window, "reencode", n, timed_steps=timed)
    assert stepped.error is None and batched.error is None and batched.n_scored == stepped.n_scored == n - 1
    assert np.allclose(batched.id_bits, stepped.id_bits, atol=1e-5), np.abs(batched.id_bits - stepped.id_bits).max()
    assert batched.bpb_full == pytest.approx(stepped.bpb_full, abs=1e-5)
    assert stepped.timed_steps == n - 1 - window and batched.timed_steps == timed and batched.ms_per_byte > 0


def test_batched_reencode_steps_like_the_loop_where_the_window_does_not_fit(text_ids):
    """A learned table of 32 rows cannot hold a window of 40: no batch, the steps stop where the table ends."""
    model = tiny_lab("learned")
    stepped = kv_cache.sliding_score(model, text_ids, 40, "reencode", 60, timed_steps=None)
    batched = kv_cache.sliding_score(model, text_ids, 40, "reencode", 60)
    assert batched.error == stepped.error and batched.error.startswith("Stopped at byte 32")
    assert np.allclose(batched.id_bits, stepped.id_bits, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("method", [m for m in method_names() if not described(m).reads_before])
def test_shifted_cache_is_broken_exactly_where_positions_are_baked_in(method, text_ids):
    """One layer, so re-encoding is the exact reference. A shifted cache relabels the window 0..W-1:
    harmless when positions enter only at attention time, wrong when they were baked into the keys."""
    model = as_lab_model(sharp(tiny_model(method, n_layer=1)))
    window, n = 8, 40
    shifted = kv_cache.sliding_score(model, text_ids, window, "shifted_cache", n)
    reencode = kv_cache.sliding_score(model, text_ids, window, "reencode", n)
    assert shifted.error is None
    gap = np.abs(shifted.id_bits - reencode.id_bits)[window:].max()
    if model.position.acts_on in ("nothing", "logits", "weights", "recurrence"):
        assert gap < 1e-4
        assert "Correct" in kv_cache.strategy_verdict(model, "shifted_cache")
    else:  # learned, sinusoidal (input) and rope (q/k): float noise is ~1e-6, this is 1,000x that
        assert gap > 1e-3
        assert "Broken" in kv_cache.strategy_verdict(model, "shifted_cache")


@pytest.mark.parametrize("method", [m for m, cls in POSITION_METHODS.items()
                                    if cls.acts_on in ("nothing", "logits", "weights") and described(m).is_shift_invariant()])
def test_shifted_cache_equals_cached_window_for_attention_time_methods(method, text_ids):
    """Any depth: both strategies attend over the same cached keys; relabelling keeps every distance."""
    model = as_lab_model(sharp(tiny_model(method)))
    shifted = kv_cache.sliding_score(model, text_ids, 8, "shifted_cache", 40)
    cached = kv_cache.sliding_score(model, text_ids, 8, "cached_window", 40)
    assert np.allclose(shifted.id_bits, cached.id_bits, atol=1e-5)
    assert kv_cache.strategy_verdict(model, "shifted_cache").startswith("Correct")


def test_a_cached_window_keeps_fires_true_query_positions(text_ids):
    """FIRE adds its bias at attention time, but past its threshold L it divides each distance by psi of
    the query's own position: a cached window keeps the true positions, so it differs from relabelling
    the window to 0..W-1 (the shifted cache, which is what re-encoding does)."""
    model = as_lab_model(sharp(tiny_model("fire")))  # training length 32: L = 8
    shifted = kv_cache.sliding_score(model, text_ids, 8, "shifted_cache", 40)
    cached = kv_cache.sliding_score(model, text_ids, 8, "cached_window", 40)
    assert np.allclose(shifted.id_bits[:8], cached.id_bits[:8], atol=1e-5)  # no eviction yet: same positions
    assert not np.allclose(shifted.id_bits[8:], cached.id_bits[8:], atol=1e-3)
    assert "true position" in kv_cache.strategy_verdict(model, "cached_window")


def test_cached_window_for_absolute_methods(text_ids):
    learned = tiny_lab("learned")
    r = kv_cache.sliding_score(learned, text_ids, 8, "cached_window", 60)
    assert r.bpb is None and r.bpb_full is None and r.n_scored == 32
    assert r.error.startswith("Stopped at byte 32") and "32 rows" in r.error
    assert "Cannot run past byte 32" in kv_cache.strategy_verdict(learned, "cached_window")
    sinusoidal = tiny_lab("sinusoidal")
    r = kv_cache.sliding_score(sinusoidal, text_ids, 8, "cached_window", 60)
    assert r.error is None and np.isfinite(r.bpb)
    assert "never saw" in kv_cache.strategy_verdict(sinusoidal, "cached_window")


def test_sliding_result_fields(text_ids):
    r = kv_cache.sliding_score(tiny_lab("nope"), text_ids, 8, "cached_window", 30)
    assert r.n_scored == 29 and r.ms_per_byte > 0
    assert r.bpb == pytest.approx(r.id_bits.mean()) and r.bpb_full == pytest.approx(r.id_bits[8:].mean())


def test_sliding_caps(text_ids):
    model = tiny_lab("nope")
    long_text = torch.cat([text_ids] * 2)
    with pytest.raises(PosvizError, match=f"{MAX_SLIDING_BYTES:,}"):
        kv_cache.sliding_score(model, long_text, 8, "reencode", MAX_SLIDING_BYTES + 1)
    with pytest.raises(PosvizError, match="window"):
        kv_cache.sliding_score(model, text_ids, MAX_KV_CACHE_POSITIONS + 1, "reencode", 20)
    with pytest.raises(PosvizError, match="unknown strategy"):
        kv_cache.sliding_score(model, text_ids, 8, "magic", 20)
    with pytest.raises(PosvizError, match="cache check"):
        kv_cache.cache_check(model, long_text, MAX_KV_CACHE_POSITIONS + 1)


def test_two_pass_diagram():
    W = 4
    rows = kv_cache.two_pass_diagram(W, t=10)
    by = {(r["strategy"], r["pass"]): r for r in rows}  # last row of each pass: the newest byte
    assert {(r["strategy"], r["pass"]) for r in rows} == {(s, p) for s in kv_cache.STRATEGIES for p in ("t", "t+1")}
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
        kv_cache.two_pass_diagram(4, t=2)


@pytest.mark.parametrize("method", method_names())
def test_cache_check_matches_full_forward(method, text_ids):
    model = as_lab_model(sharp(tiny_model(method)))
    check = kv_cache.cache_check(model, text_ids, 32, time_reencode=method == "t5")
    assert check["max_abs_diff"] < 1e-4 * max(1.0, check["logit_scale"])
    assert check["full_ms"] > 0 and check["cached_ms_per_byte"] > 0
    if method == "t5":
        assert check["reencode_ms_per_byte"] > 0


def test_cache_check_times_a_sample_of_prefixes(text_ids):
    model = tiny_lab("t5")
    assert kv_cache.cache_check(model, text_ids, 32)["reencode_timed"] == kv_cache.REENCODE_TIMED_STEPS
    every = kv_cache.cache_check(model, text_ids, 32, reencode_samples=None)
    assert every["reencode_timed"] == 32 and every["reencode_ms_per_byte"] > 0
    assert kv_cache.cache_check(model, text_ids, 32, time_reencode=False)["reencode_timed"] == 0


def test_evaluate_prints_cached_decoding_with_and_without_sinks(tiny_models_dir, capsys):
    """``python -m posviz.evaluate --checkpoint X --window W --sinks K``: both rows, the numbers of the lab's own run."""
    import json

    from posviz.models.interface import open_model
    from posviz.training.data import load_corpus
    from posviz.training.evaluate import main

    folder = str(tiny_models_dir / "alibi")
    main(["--checkpoint", folder, "--window", "12", "--sinks", "3", "--window-ids", "60", "--eval-bytes", "4096"])
    out = capsys.readouterr().out
    assert "with 3 sinks" in out and "without sinks" in out and "window of 12" in out
    printed = json.loads(out.strip().splitlines()[-1])
    model = open_model(folder)
    ids = model.encode(load_corpus().eval_stream(4096).tobytes())
    again = kv_cache.streaming_comparison(model, ids, 12, 3, 60)
    assert printed["with_sinks"]["bpb"] == pytest.approx(again["with_sinks"]["bpb"], abs=1e-9)
    assert printed["without"]["bpb"] == pytest.approx(again["without"]["bpb"], abs=1e-9)
    assert printed["with_sinks"]["bpb"] != printed["without"]["bpb"]
    with pytest.raises(SystemExit, match="fewer than the window"):
        main(["--checkpoint", folder, "--window", "3", "--sinks", "3", "--eval-bytes", "4096"])


@pytest.mark.parametrize("method", ["alibi", "rope_sinks"])
def test_the_sink_block_of_an_evaluation(method, corpus, monkeypatch):
    """``eval.sinks``: the share on the first byte as the lab computes it, the weight a layer leaves unspent
    (0 for a softmax, the sinks' share for learned sinks), and StreamingLLM against no sinks."""
    from posviz.training import evaluate as ev

    monkeypatch.setattr(ev, "SINK_IDS", 120)  # the shipped evaluation decodes 1,024 bytes through 128
    monkeypatch.setattr(ev, "SINK_WINDOW", 40)

    model = sharp(tiny_model(method))
    documents = [bytes(corpus.eval_documents[i][:200]) for i in range(2)]
    stream = corpus.eval_stream(1 << 12)
    block = ev.sinks_block(model, documents, stream)
    lab = as_lab_model(model)
    expected = np.mean([[r["share"] for r in kv_cache.first_id_share(lab, torch.tensor(list(d)))] for d in documents], 0)
    assert np.allclose(np.ravel(block["first_byte_share"]), expected, atol=1e-4)
    left = block["weight_left_by_layer"]
    assert (max(left) > 0.01) == (method == "rope_sinks") and min(left) >= 0
    again = kv_cache.streaming_comparison(lab, torch.as_tensor(stream[:ev.SINK_IDS]).long(), ev.SINK_WINDOW,
                                          ev.SINK_COUNT, ev.SINK_IDS)
    assert block["streaming"]["with_sinks"]["bpb"] == pytest.approx(again["with_sinks"]["bpb"], abs=1e-9)


def test_the_beginning_of_text_experiment_reads_every_text_after_its_first_byte(corpus, monkeypatch, capsys):
    """``posviz.evaluate --sinks-block --first-byte B``: the sink measures on texts that each start with B, as a
    model trained with ``first_byte=B`` saw its rows; the stream keeps its length."""
    from posviz.training import evaluate as ev

    seen = {}
    monkeypatch.setattr(ev, "sinks_block", lambda model, documents, stream: seen.update(docs=documents, stream=stream) or {})
    documents, stream = [b"abc" * 50, b"def" * 60], corpus.eval_stream(1 << 10)
    ev.sinks_of_texts(None, documents, stream, 2)
    assert [d[:4] for d in seen["docs"]] == [b"\x02abc", b"\x02def"] and len(seen["docs"][0]) == 151
    assert seen["stream"][0] == 2 and len(seen["stream"]) == len(stream)
    assert np.array_equal(seen["stream"][1:], stream[:-1])
    ev.sinks_of_texts(None, documents, stream)
    assert seen["docs"] == documents and seen["stream"] is stream
    with pytest.raises(SystemExit, match="a byte"):
        ev.sinks_of_texts(None, documents, stream, 256)
