"""posviz.labs.generation: decoding with a KV cache past the training length, checked against full forward
passes and the sliding-window scorer of posviz.labs.kv_cache (tiny random checkpoints, train_length 32)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_lab

from posviz.labs import generation as g
from posviz.labs import kv_cache
from posviz.errors import PosvizError
from posviz.positions import method_names

W = 32
PROMPT = list(b"def add(a, b):\n    return a + b\n"[:20])


def full_forward_bits(model, ids: list[int]) -> np.ndarray:
    """Bits of bytes 1.. of ``ids`` from one forward pass over all of them."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0, :-1].float()
    return (F.cross_entropy(logits, x[0, 1:], reduction="none") / np.log(2)).numpy()


def test_same_seed_same_text_and_another_seed_another():
    model = tiny_lab("rope")
    settings = g.DecodeSettings(60, temperature=1.0, top_k=40, seed=7)
    first = g.generate(model, PROMPT, settings)
    again = g.generate(model, PROMPT, settings)
    assert first.ids == again.ids and len(first.ids) == 60
    assert np.array_equal(first.surprisal, again.surprisal)
    other = g.generate(model, PROMPT, g.DecodeSettings(60, temperature=1.0, top_k=40, seed=8))
    assert other.ids != first.ids


@pytest.mark.parametrize("method", ["rope", "alibi", "t5", "sinusoidal", "nope"])
def test_greedy_picks_the_full_forward_argmax_and_cached_losses_match_it(method):
    model = tiny_lab(method)
    greedy = g.generate(model, PROMPT, g.DecodeSettings(40))
    assert greedy.ids == g.generate(model, PROMPT, g.DecodeSettings(40)).ids
    text = PROMPT + greedy.ids
    with torch.no_grad():
        logits = model(torch.tensor([text])).logits[0]
    p = len(PROMPT)
    assert greedy.ids == [int(logits[t].argmax()) for t in range(p - 1, len(text) - 1)]
    # the decoder's own surprisal of each byte is the loss a full forward pass gives it
    assert np.allclose(greedy.surprisal, full_forward_bits(model, text)[p - 1:], atol=1e-4)
    # the entropy of a distribution over 256 byte values is between 0 and 8 bits
    assert ((greedy.entropy >= 0) & (greedy.entropy <= 8 + 1e-6)).all()


def test_teacher_forcing_through_the_cache_equals_the_full_forward_pass():
    model = tiny_lab("t5")
    real = list(b"    if a > b:\n        return a\n    return b\n")
    scored = g.teacher_forced(model, PROMPT, real, "stop")
    assert scored.ids == real
    assert np.allclose(scored.surprisal, full_forward_bits(model, PROMPT + real)[len(PROMPT) - 1:], atol=1e-4)


@pytest.mark.parametrize("method,strategy,kv_cache_strategy", [("sinusoidal", "reencode", "reencode"),
                                                               ("sinusoidal", "shift", "shifted_cache"),
                                                               ("sinusoidal", "streaming", "streaming"),
                                                               ("nope", "streaming", "streaming")])
def test_window_strategies_past_the_training_length_match_the_sliding_window_scorer(method, strategy, kv_cache_strategy):
    """Past W: re-encode and shift (an absolute method) and StreamingLLM (any method) give exactly the losses of
    kv_cache.sliding_score, the same window of W = the training length."""
    model = tiny_lab(method)
    rng = np.random.default_rng(0)
    text = [int(b) for b in rng.integers(32, 127, size=len(PROMPT) + 3 * W)]
    prompt, real = text[:len(PROMPT)], text[len(PROMPT):]
    scored = g.teacher_forced(model, prompt, real, strategy)
    assert scored.strategy == strategy and scored.error is None
    sliding = kv_cache.sliding_score(model, text, W, kv_cache_strategy).id_bits  # [t]: byte t + 1
    assert np.allclose(scored.surprisal, sliding[len(PROMPT) - 1:], atol=1e-4)
    stop = g.teacher_forced(model, prompt, real, "stop")
    past = scored.first_past_train_length
    assert np.allclose(stop.surprisal[:past], scored.surprisal[:past], atol=1e-4)  # the same until the window is full
    assert not np.allclose(stop.surprisal[past:], scored.surprisal[past:], atol=1e-3)  # then they differ


def test_stop_raises_the_learned_tables_own_error_past_its_length_and_the_others_keep_writing():
    learned = g.Decoder(tiny_lab("learned"), PROMPT, g.DecodeSettings(4 * W))
    while learned.step() is not None:
        pass
    assert learned.error and "learned absolute table has 32 rows" in learned.error
    # it wrote every byte it had a position for: up to the byte predicted from W bytes of context
    assert len(learned.generated) == W + 1 - len(PROMPT) == learned.first_past_train_length
    reencoded = g.generate(tiny_lab("learned"), PROMPT, g.DecodeSettings(4 * W, strategy="reencode"))
    assert reencoded.error is None and len(reencoded.ids) == 4 * W
    alibi = g.generate(tiny_lab("alibi"), PROMPT, g.DecodeSettings(4 * W))
    assert alibi.error is None and len(alibi.ids) == 4 * W
    # relative methods always keep true positions: the choice of strategy is for absolute ones
    shifted = g.generate(tiny_lab("alibi"), PROMPT, g.DecodeSettings(4 * W, strategy="shift"))
    assert shifted.strategy == "stop" and shifted.ids == alibi.ids


def test_sampling_respects_top_k_and_top_1_is_greedy():
    logits = torch.tensor([0.0, 5.0, 1.0, 4.0, -2.0, 3.0])
    probs = g.next_byte_distribution(logits, 1.0, 3)
    assert set(torch.nonzero(probs).flatten().tolist()) == {1, 3, 5}
    assert float(probs.sum()) == pytest.approx(1.0)
    cold = g.next_byte_distribution(logits, 0.1, 0)
    assert float(cold[1]) > 0.99  # a low temperature sharpens towards the top byte
    model = tiny_lab("rope")
    top1 = g.generate(model, PROMPT, g.DecodeSettings(30, temperature=1.5, top_k=1, seed=3))
    assert top1.ids == g.generate(model, PROMPT, g.DecodeSettings(30)).ids
    # with top-k = 5 every drawn byte was among the 5 most likely at its step
    top5 = g.generate(model, PROMPT, g.DecodeSettings(30, temperature=2.0, top_k=5, seed=1))
    text = PROMPT + top5.ids
    with torch.no_grad():
        logits = model(torch.tensor([text])).logits[0]
    for i, byte in enumerate(top5.ids):
        assert byte in torch.topk(logits[len(PROMPT) - 1 + i], 5).indices.tolist()


def test_bad_settings_and_prompts_are_refused_in_words():
    model = tiny_lab("rope")
    for bad in (dict(new_ids=0), dict(new_ids=10, temperature=-1.0), dict(new_ids=10, temperature=float("nan")),
                dict(new_ids=10, top_k=999), dict(new_ids=10, strategy="warp"), dict(new_ids=10, seed=-1)):
        with pytest.raises(PosvizError):
            g.DecodeSettings(**bad)
    cap = g.max_new_bytes(W, model.device)
    assert cap >= 4 * W
    with pytest.raises(PosvizError, match="new bytes per model"):
        g.Decoder(model, PROMPT, g.DecodeSettings(cap + 1))
    with pytest.raises(PosvizError, match="prompt is empty"):
        g.Decoder(model, [], g.DecodeSettings(5))
    with pytest.raises(PosvizError, match="no real continuation"):
        g.teacher_forced(model, PROMPT, [], "stop")


def test_window_means_and_csv_rows():
    rows = g.window_means(np.array([1.0, 3.0, 5.0, 7.0, 9.0]), start_position=6, width=4)
    assert rows == [{"window start": 4, "window end": 7, "mean": 2.0, "bytes": 2},
                    {"window start": 8, "window end": 11, "mean": 7.0, "bytes": 3}]
    result = g.generate(tiny_lab("nope"), PROMPT, g.DecodeSettings(20))
    csv = g.per_byte_rows("nope", result)
    assert [r["position"] for r in csv] == list(range(len(PROMPT), len(PROMPT) + 20))
    assert [r["byte"] for r in csv] == result.ids
    assert [r["bytes"] for r in csv] == [1] * 20
    assert "".join(r["text"] for r in csv) == "".join(chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in result.ids)
    assert [r["context_past_train_length"] for r in csv].index(True) == W + 1 - len(PROMPT)


@pytest.mark.parametrize("method", method_names())
def test_one_pass_teacher_forcing_equals_the_byte_by_byte_cached_loop(method):
    model = tiny_lab(method, seed=5)
    real = list(b"    for item in items:\n        total += item\n")[: W - len(PROMPT) + 8]
    one_pass = g.teacher_forced(model, PROMPT, real, "stop")
    loop = g.generate(model, PROMPT, g.DecodeSettings(len(real), strategy="stop"), forced=real)
    n = len(loop.ids)  # learned stops at its table's end; the one-pass path then takes the loop too
    assert one_pass.ids[:n] == loop.ids and one_pass.error == loop.error
    assert np.allclose(one_pass.surprisal[:n], loop.surprisal, atol=1e-4)
    assert np.allclose(one_pass.entropy[:n], loop.entropy, atol=1e-4)


def test_a_step_runs_on_one_thread_and_gives_the_threads_back(monkeypatch):
    """Decoding steps run single-threaded (a wake of the second thread cost more than a step's work on
    a busy 2-core host); the thread count is restored after every step, a stop included."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    model = tiny_lab("learned")
    decoder = g.Decoder(model, [1, 2, 3], g.DecodeSettings(40))
    real = decoder._advance

    def advance(byte):
        seen.append(torch.get_num_threads())
        return real(byte)

    monkeypatch.setattr(decoder, "_advance", advance)
    try:
        while decoder.step() is not None:
            assert torch.get_num_threads() == 2
        assert seen and set(seen) == {1}
        assert decoder.error is not None and "Stopped after" in decoder.error  # learned stops past its table
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
