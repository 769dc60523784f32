"""The far-context probes on a model that copies perfectly, on one that cannot copy at all, and the
induction-head scores against the full attention map they are read from; the retired copy probe's live
version against ``evaluate.copy_probe``, and ALiBi's attenuation by distance."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import tiny_lab, tiny_model
from posviz.models.shipped import as_lab_model
from posviz.labs import key_value, probes, retrieval
from posviz.errors import PosvizError
from posviz.training.evaluate import copy_probe
from posviz.limits import max_eval_length
from posviz.models.byte_gpt import GPT
from posviz.models.interface import ModelOutput


class SuffixCopier(GPT):
    """A "model" that copies: it predicts the byte that followed the last earlier occurrence of the
    current 6-byte context (almost surely right on a repeated chunk), else a uniform guess."""

    CONTEXT = 6

    def forward(self, idx, positions=None, cache=None, attention_layer=None, attention_head=None):
        B, T = idx.shape
        logits = torch.zeros(B, T, 256)
        for b in range(B):
            seen: dict[tuple, int] = {}
            row = idx[b].tolist()
            for t in range(T):
                key = tuple(row[max(0, t - self.CONTEXT + 1):t + 1])
                if len(key) == self.CONTEXT and key in seen and seen[key] + 1 < T:
                    logits[b, t, row[seen[key] + 1]] = 20.0  # ~all the probability on the copied byte
                if len(key) == self.CONTEXT:
                    seen[key] = t
        return ModelOutput(logits)


@pytest.fixture(scope="module")
def text(corpus):
    return corpus.validation[: 1 << 18]


def copier():
    model = tiny_model("nope")
    model.__class__ = SuffixCopier
    return as_lab_model(model)


def test_a_model_that_copies_scores_near_zero_on_the_second_copy_at_every_gap(text):
    results = probes.repeat_probe(copier(), text, [0, 100, 1000], chunk=64, chunks=8)
    for r in results:
        assert r.first_bits > 6.0  # the first copy cannot be predicted by copying: uniform, 8 bits/byte
        assert r.ratio < 0.4 and r.gain < 0.4 and r.second_bits < 3.0  # its first 6 bytes cannot be copied
        assert r.ratio_low <= r.ratio <= r.ratio_high and r.chunks == 8


def test_a_model_that_cannot_copy_gains_nothing_from_the_first_copy(text):
    model = tiny_lab("alibi", seed=3)  # untrained: its predictions do not depend on a far copy
    results = probes.repeat_probe(model, text, [64, 512], chunk=32, chunks=8)
    for r in results:
        assert r.gain == pytest.approx(1.0, abs=0.05)  # second copy costs what the same bytes cost without it


def test_key_value_probe_recalls_the_number_only_for_a_copier(text):
    recalled = key_value.key_value_probe(copier(), text, [0, 300], trials=8)
    assert all(r.first_bits > 6.0 and r.second_bits < 1.0 for r in recalled)
    blind = key_value.key_value_probe(tiny_lab("rope", seed=2), text, [300], trials=8)[0]
    assert blind.ratio == pytest.approx(1.0, abs=0.1)
    rows, a, b = key_value.key_value_batch(torch.tensor(list(b"x = 1\n" * 300)), 40, 3, seed=0)
    for row in rows:  # the digits at both offsets are the same 5-digit number
        assert bytes(row[a:a + 5].tolist()) == bytes(row[b:b + 5].tolist()) and bytes(row[a:a + 5].tolist()).isdigit()


def test_probes_say_none_where_the_method_cannot_run(text):
    model = tiny_lab("learned")  # 32 positions
    results = probes.repeat_probe(model, text, [0, 100], chunk=8, chunks=2)
    assert results[0] is not None and results[1] is None
    rows = probes.as_rows(results, [0, 100])
    assert rows[1]["ratio"] is None and rows[1]["gap"] == 100
    assert probes.induction_scores(model, text, [100], chunk=8, chunks=2)[100] is None


def test_induction_scores_are_read_off_the_full_attention_map(text):
    model = tiny_lab("shaw", seed=1)
    with torch.no_grad():
        for p in model.position.parameters():
            p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(4))
    chunk, gap = 16, 40
    scores = probes.induction_scores(model, text, [gap], chunk=chunk, chunks=3, seed=7)[gap]  # (L, H)
    batch = probes.repeat_batch(probes.held_out(text), gap, chunk, 3, seed=7 + gap)
    for layer in range(model.n_layer):
        with torch.no_grad():
            full = model(batch, attention_layer=layer).attention  # (B, H, T, T)
        t = torch.arange(chunk - 1)
        expected = full[:, :, chunk + gap + t, t + 1].mean(dim=(0, 2)).numpy()
        np.testing.assert_allclose(scores[layer], expected, atol=1e-5)


def test_default_gaps_and_bad_settings(text):
    assert probes.default_gaps(256) == [0, 64, 128, 256, 512, 1024, 2048, 4096]
    assert [r["reach"] for r in retrieval.alibi_reach([0.5, 0.25], 5.0)] == [10.0, 20.0]
    with pytest.raises(PosvizError, match="chunk must have 8 to 1,024 bytes"):
        probes.repeat_probe(tiny_lab("nope"), text, [0], chunk=4)
    with pytest.raises(PosvizError, match="too short for a gap"):
        probes.repeat_probe(tiny_lab("nope"), text[:2000], [5000], chunk=16)


# ------------------------------------------------------------------------------------------------
# Copy probe and ALiBi's reach
# ------------------------------------------------------------------------------------------------
def test_copy_probe_live_matches_evaluate(corpus):
    model = tiny_lab("alibi")
    filler = corpus.eval_stream(4096)
    live = retrieval.copy_probe_live(model, filler, [0, 16], string_length=8, trials=2)
    for gap in (0, 16):
        assert live[gap] == copy_probe(model, filler, [gap], string_length=8, trials=2, seed=gap)[str(gap)]
    learned = retrieval.copy_probe_live(tiny_lab("learned"), filler, [0, 64], string_length=8, trials=2)
    assert learned[0] is not None and learned[64] is None  # 8 + 64 + 8 > 32 positions
    assert retrieval.probe_gaps(max_eval_length(32), 32) == [0, 16, 32, 64, 128, 256]
    with pytest.raises(PosvizError, match="cap"):
        retrieval.copy_probe_live(model, filler, [4096], string_length=8)


def test_alibi_attenuation():
    rows = retrieval.alibi_attenuation(4, [0, 100])
    assert [r["slope"] for r in rows if r["distance"] == 0] == pytest.approx([0.25, 0.0625, 0.015625, 0.00390625])
    gentle = [r for r in rows if r["head"] == 3 and r["distance"] == 100][0]
    assert gentle["penalty"] == pytest.approx(100 / 256) and gentle["factor"] == pytest.approx(math.exp(-100 / 256))


def test_copy_curve_rows_read_each_checkpoints_training_check():
    metrics = {"rope": {"copy_curve": [{"step": 200, "tokens": 819200, "ratio": 0.97, "gain": 0.8},
                                       {"step": 400, "tokens": 1638400, "ratio": 0.45, "gain": 0.3}]},
               "alibi": {"train_curve": []}, "gone": None}  # trained before the check existed; no metrics
    rows = retrieval.copy_curve_rows(metrics)
    assert [(r["model"], r["bytes"], r["ratio"]) for r in rows] == [("rope", 819200, 0.97), ("rope", 1638400, 0.45)]


# ------------------------------------------------------------------------------------------------
# Effective context length (labs/key_value.py)
# ------------------------------------------------------------------------------------------------
def test_a_planted_pair_and_its_control_differ_by_the_pair_alone(corpus):
    text = torch.tensor(list(corpus.eval_stream(4096)))
    pairs = key_value.planted_pairs(text, 256, depths=(0.1, 0.9), trials=2, seed=1)
    assert len(pairs) == 4 and {p.depth for p in pairs} == {0.1, 0.9}
    for p in pairs:
        assert p.primed.numel() == p.control.numel() == 256 and p.value == (251, 256)
        question = bytes(p.primed[-17:].tolist())  # "\n" + 8 letters + " = " + 5 digits
        assert question == bytes(p.control[-17:].tolist()) and question.startswith(b"\n") and question[9:12] == b" = "
        name, value = question[1:9], bytes(p.primed[-5:].tolist())
        binding = b"\n" + name + b" = " + value + b"\n"
        at = bytes(p.primed.tolist()).find(binding)
        filler = 256 - 17
        assert at == round(p.depth * (filler - len(binding)))  # planted at its depth of the text before the question
        assert binding not in bytes(p.control.tolist())
        # the control is the same run of text, going on where the pair was
        assert torch.equal(p.primed[:at], p.control[:at])
        assert torch.equal(p.primed[at + len(binding):filler], p.control[at:filler - len(binding)])


def test_effective_length_keeps_85_percent_of_the_gain_at_1x_at_every_shorter_length():
    row = lambda gain: {"gain": gain}  # noqa: E731
    rows = {"1": row(2.0), "2": row(1.8), "4": row(1.6), "8": row(1.9), "16": row(1.9)}
    out = key_value.effective_length(rows)
    assert out["multiple"] == 2.0 and "at 4x" in out["reason"] and "under 85%" in out["reason"]
    assert key_value.effective_length({"1": row(2.0), "2": row(1.7), "4": None})["multiple"] == 2.0
    assert key_value.effective_length({"1": row(2.0), "2": row(1.9), "4": row(1.75)})["multiple"] == 4.0
    flat = key_value.effective_length({"1": row(0.3), "2": row(0.3)})
    assert flat["multiple"] is None and flat["reason"].startswith("not measurable") and "0.30" in flat["reason"]
    assert key_value.effective_length({"1": None, "2": row(3.0)})["multiple"] is None


def test_the_effective_length_block_scores_the_value_with_and_without_the_pair(corpus):
    model = tiny_lab("alibi")
    text = corpus.eval_stream(8192)
    block = key_value.effective_length_block(model, text, multiples=(2, 4), trials=2)
    row = block["rows"]["2"]
    assert row["pairs"] == 6 and row["gain"] == pytest.approx(row["control"] - row["primed"], abs=2e-4)
    assert set(row["by_depth"]) == {"0.1", "0.5", "0.9"}
    # by hand: every pair's value bits, primed and control, averaged
    pairs = key_value.planted_pairs(probes.held_out(text, model), 64, trials=2, seed=0, model=model)
    losses, _ = probes.answer_scores(model, torch.stack([p.primed for p in pairs] + [p.control for p in pairs]))
    bits = losses[:, 58:63].double().sum(1) / math.log(2) / 5  # columns 58..62 predict the value's ids 59..63
    assert row["primed"] == pytest.approx(float(bits[:6].mean()), abs=1e-4)
    assert row["control"] == pytest.approx(float(bits[6:].mean()), abs=1e-4)
    assert block["multiple"] is None and "not measurable" in block["reason"]  # no 1x probed here
