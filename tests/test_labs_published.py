"""The Far-context retrieval and Generation labs on published models (tokenizer ids, not bytes), checked
against transformers itself: the tiny saved families of ``tests/hf_tiny.py`` (context 64 tokens, a
byte-level BPE of about 400 ids), loaded through ``posviz.models.interface.open_model``.

* every probe and every window strategy runs; GPT-2's learned table stops at 64 positions in words;
* a key-value answer's loss (bits per byte of the value's tokens) equals a direct
  ``AutoModelForCausalLM`` forward's cross-entropy on the same token span;
* greedy decoding writes ``generate(do_sample=False)``'s tokens, and seeded sampling draws what the same
  generator draws from transformers' own logits, step by step;
* both pages run a published model and say "tokens".
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from streamlit.testing.v1 import AppTest

from transformers import AutoModelForCausalLM

from posviz.labs import attention_maps, compare, extrapolation, kv_cache
from posviz.labs import generation as g
from posviz.labs import key_value, probes
from posviz.models.interface import open_model

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("gpt2", "neox", "bloom")
CONTEXT = 64  # the tiny families' trained context, in tokens
PROMPT = b"def add(a, b):\n    return a + b  # caf\xc3\xa9\n"  # "é" is two tokens of the tiny tokenizer


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models: a second intra-op thread costs more than it saves (on a busy 2-core host, a forward pass
    took 40 times longer with two), as for the decoder's steps (``generation.one_thread``)."""
    with g.one_thread():
        yield


@pytest.fixture(scope="module")
def text(corpus):
    return corpus.validation[: 1 << 14]


@pytest.fixture(scope="module")
def hf_models():
    """The same folders read by transformers alone (no posviz in between), one load per family."""
    from transformers import AutoModelForCausalLM

    loaded = {}

    def load(folder):
        if folder not in loaded:
            loaded[folder] = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        return loaded[folder]
    return load


# ------------------------------------------------------------------------------------------------
# Retrieval
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_every_probe_runs_in_tokens_and_the_learned_table_stops_at_its_rows(family, hf_family_dir, text):
    model = open_model(hf_family_dir[family])
    assert model.unit == "token"
    gaps = [0, 16, 64]  # with 8-token chunks: 16, 32 and 80 tokens, the last past GPT-2's 64 rows
    repeat = probes.repeat_probe(model, text, gaps, chunk=8, chunks=2)
    recall = key_value.key_value_probe(model, text, gaps, trials=2)
    heads = probes.induction_scores(model, text, gaps, chunk=8, chunks=2)
    copies = probes.copy_probe(model, text, [0, 16], string_length=8, trials=2)
    learned = family == "gpt2"
    for results in (repeat, recall):
        assert all(r is not None and r.gap == gap for r, gap in zip(results[:2], gaps))
        assert (results[2] is None) == learned
        for r in results:
            if r is not None:
                assert 0 < r.first_bits < 30 and 0 < r.second_bits < 30 and math.isfinite(r.ratio)
    assert all(0.0 <= r.first_correct <= 1.0 and 0.0 <= r.second_correct <= 1.0 for r in recall if r is not None)
    assert heads[0].shape == (model.n_layer, model.n_head) and (heads[64] is None) == learned
    assert all(v is not None and v > 0 for v in copies.values())
    rows = probes.as_rows(recall, gaps)  # a gap that cannot run still has every column
    assert set(rows[2]) == set(rows[0]) and "second_correct" in rows[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_key_value_answers_loss_is_transformers_cross_entropy_on_the_same_tokens(family, hf_family_dir, text,
                                                                                  hf_models):
    folder = hf_family_dir[family]
    model, hf = open_model(folder), hf_models(folder)
    recalls = key_value.key_value_recalls(model, text, gap=16, trials=3, seed=5)
    for recall in recalls:
        ids = recall.row.ids
        with torch.no_grad():
            logits = hf(ids[None]).logits[0].float()  # one row, no padding: transformers as a user runs it
        for which in ("first", "second"):
            start, end = getattr(recall.row, which)
            value = model.decode(ids[start:end])
            assert value.strip().isdigit() and len(value.strip()) == 5  # the value's tokens write its 5 digits
            assert recall.value_bytes == len(value)
            nats = F.cross_entropy(logits[start - 1:end - 1], ids[start:end], reduction="sum")
            assert getattr(recall, f"{which}_bits") == pytest.approx(float(nats) / math.log(2) / len(value), abs=1e-5)
            guessed = bool((logits[start - 1:end - 1].argmax(-1) == ids[start:end]).all())
            assert getattr(recall, f"{which}_correct") == guessed
        assert recall.row.second[1] - recall.row.second[0] == recall.row.first[1] - recall.row.first[0]
    # the probe's summary: the answers' bits summed over their bytes, and the share written out whole
    summary = key_value.key_value_probe(model, text, [16], trials=3, seed=5 - 16)[0]
    total_bytes = sum(r.value_bytes for r in recalls)
    assert summary.second_bits == pytest.approx(sum(r.second_bits * r.value_bytes for r in recalls) / total_bytes, abs=1e-4)
    assert summary.second_correct == pytest.approx(np.mean([r.second_correct for r in recalls]))


def test_the_repeat_probes_bits_are_per_byte_of_the_chunks_tokens(hf_family_dir, text, hf_models):
    folder = hf_family_dir["neox"]
    model, hf = open_model(folder), hf_models(folder)
    gap, chunk, chunks, seed = 16, 8, 3, 2
    result = probes.repeat_probe(model, text, [gap], chunk=chunk, chunks=chunks, seed=seed)[0]
    batch = probes.repeat_batch(model.encode(bytes(text)), gap, chunk, chunks, seed + gap)
    with torch.no_grad():
        logits = hf(batch[:, :-1]).logits.float()
    losses = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
    n_bytes = sum(int(model.bytes_per_id(row[1:chunk]).sum()) for row in batch)  # first copy's ids 1..n-1
    assert n_bytes > chunks * (chunk - 1)  # tokens of several bytes: a per-token mean would differ
    assert result.first_bits == pytest.approx(float(losses[:, :chunk - 1].sum()) / math.log(2) / n_bytes, abs=1e-4)


# ------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_writes_transformers_generate_tokens(family, hf_family_dir, hf_models):
    folder = hf_family_dir[family]
    model, hf = open_model(folder), hf_models(folder)
    prompt = model.encode(PROMPT).tolist()
    ours = g.generate(model, prompt, g.DecodeSettings(24, strategy="stop"))
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, pad_token_id=0)[0, len(prompt):]
    assert ours.error is None and ours.unit == "token"
    assert ours.ids[:len(theirs)] == theirs.tolist()  # (transformers stops early only at its end-of-text id)
    # the text is the decoding of the whole sequence, less the prompt's bytes; bits per byte through bytes_per_id
    assert ours.text_bytes == model.decode(prompt + ours.ids)[len(model.decode(prompt)):]
    assert ours.n_bytes == len(ours.text_bytes)
    assert ours.bits_per_byte == pytest.approx(ours.surprisal.sum() / ours.n_bytes)


def test_seeded_sampling_draws_what_the_same_generator_draws_from_transformers_logits(hf_family_dir, hf_models):
    folder = hf_family_dir["neox"]
    model, hf = open_model(folder), hf_models(folder)
    prompt = model.encode(PROMPT).tolist()
    settings = g.DecodeSettings(20, temperature=0.9, top_k=20, seed=3)
    ours = g.generate(model, prompt, settings)
    generator, seq, surprisal = torch.Generator().manual_seed(3), list(prompt), []
    for _ in range(20):  # transformers' own forward over the whole sequence at every step, no cache
        with torch.no_grad():
            logits = hf(torch.tensor([seq])).logits[0, -1].float()
        drawn = int(torch.multinomial(g.next_id_distribution(logits, 0.9, 20), 1, generator=generator))
        surprisal.append(-float(logits.log_softmax(-1)[drawn]) / math.log(2))
        seq.append(drawn)
    assert ours.ids == seq[len(prompt):]
    np.testing.assert_allclose(ours.surprisal, surprisal, atol=1e-4)


def test_gpt2_stops_in_words_past_its_64_rows_and_the_window_strategies_write_on(hf_family_dir):
    model = open_model(hf_family_dir["gpt2"])
    prompt = model.encode(PROMPT).tolist()
    stopped = g.generate(model, prompt, g.DecodeSettings(100))
    assert stopped.error and "cannot run 65 positions" in stopped.error and "tokens" in stopped.error
    # it wrote every id it had a position for: up to the one predicted from 64 tokens of context
    assert len(prompt) + len(stopped.ids) == CONTEXT + 1 and len(stopped.ids) == stopped.first_past_train_length
    for strategy in ("reencode", "shift"):
        written = g.generate(model, prompt, g.DecodeSettings(100, strategy=strategy))
        assert written.error is None and len(written.ids) == 100 and written.strategy == strategy
    with pytest.raises(Exception, match="new tokens per model"):
        g.Decoder(model, prompt, g.DecodeSettings(g.max_new_bytes(CONTEXT, model.device) + 1))


def test_teacher_forcing_reports_bits_per_byte_of_the_real_tokens(hf_family_dir, hf_models):
    folder = hf_family_dir["bloom"]
    model, hf = open_model(folder), hf_models(folder)
    prompt = model.encode(PROMPT).tolist()
    real = model.encode(b"    if a > b:\n        return a\n    return b\n").tolist()
    forced = g.teacher_forced(model, prompt, real, "stop")
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + real])).logits[0, len(prompt) - 1:-1].float()
    nats = F.cross_entropy(logits, torch.tensor(real), reduction="sum")
    n_bytes = len(model.decode(real))
    assert forced.n_bytes == n_bytes and forced.text_bytes == model.decode(real)
    assert forced.bits_per_byte == pytest.approx(float(nats) / math.log(2) / n_bytes, abs=1e-5)
    looped = g.generate(model, prompt, g.DecodeSettings(len(real)), forced=real)  # the cached loop agrees
    assert looped.bits_per_byte == pytest.approx(forced.bits_per_byte, abs=1e-4)


def test_coloured_text_is_whole_characters_with_each_tokens_bits_shared_by_its_bytes(hf_family_dir):
    model = open_model(hf_family_dir["neox"])
    prompt = model.encode(b"x = 1\n").tolist()
    continuation = model.encode("# café, naïve\n".encode()).tolist()
    forced = g.teacher_forced(model, prompt, continuation, "stop")
    chars, mark = g.coloured_characters(forced, forced.surprisal)
    assert "".join(c for c, _ in chars) == "# café, naïve\n"  # "é" split over two tokens comes out whole
    assert sum(v for _, v in chars) == pytest.approx(float(forced.surprisal.sum()), abs=1e-4)
    assert mark is None  # 11 tokens: nowhere near the 64-token context
    assert g.character_start("aé".encode(), 2) == 1 and g.character_start("aé".encode(), 3) == 3


# ------------------------------------------------------------------------------------------------
# The pages, with published models in the picker
# ------------------------------------------------------------------------------------------------
@pytest.fixture()
def published_pages(hf_family_dir, tiny_models, monkeypatch):
    """The pages' model picker lists the tiny neox and gpt2 (as $POSVIZ_MODELS will list published models)."""
    folders = {name: hf_family_dir[name] for name in ("neox", "gpt2")}
    monkeypatch.setenv("POSVIZ_MODELS", ",".join(str(f) for f in folders.values()))
    return folders


def run_page(name: str, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "views" / f"{name}.py"), default_timeout=120)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_retrieval_page_runs_published_models_in_tokens(published_pages):
    at = run_page("retrieval", models="neox,gpt2", gap="32", chunks="2", kv="true")
    captions = "\n".join(str(c.value) for c in at.caption)
    assert "device cap of 1,024 tokens" in captions and "gaps in tokens" in captions
    tables = [t.value for t in at.dataframe]
    ratios = next(t for t in tables if "neox" in t.index and 32 in t.columns)
    assert ratios.loc["neox"].notna().all() and ratios.loc["gpt2"].isna().all()  # 2 x 64 + gap > 64 rows


def test_the_generation_page_writes_tokens_and_gpt2_stops_at_its_table(published_pages):
    at = run_page("generation", models="neox,gpt2", n="48", p="40", decode="greedy")
    captions = "\n".join(str(c.value) for c in at.caption)
    assert "48 tokens" in captions and "bits/byte on its own text" in captions
    warnings = "\n".join(str(w.value) for w in at.warning)
    assert "gpt2" in warnings and "cannot run 65 positions" in warnings
    continuation = next(t.value for t in at.dataframe if "bytes scored" in t.value.columns)
    assert continuation.loc["neox", "bytes scored"] > 48  # 48 tokens of code cover more bytes than that


# ------------------------------------------------------------------------------------------------
# Round trip: the shipped checkpoints exported to transformers (models/hf/, one token per byte)
# ------------------------------------------------------------------------------------------------
EXPORTS = {"learned": "learned-gpt2", "rope": "rope-neox", "alibi": "alibi-bloom"}


@pytest.mark.parametrize("method", list(EXPORTS))
def test_an_export_run_in_tokens_gives_its_checkpoints_probes_and_writing(method, text):
    """The token path (bits summed over bytes, answers found by their bytes, the model's own cache) on a
    tokenizer whose every token is one byte gives what the byte path gives on the same weights."""
    shipped, export = open_model(ROOT / "models" / method), open_model(ROOT / "models" / "hf" / EXPORTS[method])
    assert export.unit == "token" and shipped.unit == "byte"
    gaps = [0, 200]  # 2 x 64 + 200 > 256: past the learned table
    for probe in (lambda m: probes.repeat_probe(m, text, gaps, chunks=2),
                  lambda m: key_value.key_value_probe(m, text, gaps, trials=2)):
        for a, b in zip(probe(shipped), probe(export)):
            assert (a is None) == (b is None)
            if a is not None:
                for field in ("first_bits", "second_bits", "ratio", "gain", "first_correct", "second_correct"):
                    if getattr(a, field, None) is not None:
                        assert getattr(b, field) == pytest.approx(getattr(a, field), abs=2e-3), field
    heads_a, heads_b = (probes.induction_scores(m, text, [0], chunk=16, chunks=2)[0] for m in (shipped, export))
    np.testing.assert_allclose(heads_b, heads_a, atol=1e-4)
    prompt, real = bytes(text[:100]), bytes(text[100:160])
    for strategy in ("stop", "reencode", "shift"):
        a = g.teacher_forced(shipped, list(prompt), list(real), strategy)
        b = g.teacher_forced(export, export.encode(prompt), export.encode(real), strategy)
        assert b.bits_per_byte == pytest.approx(a.bits_per_byte, abs=1e-4) and b.text_bytes == real, strategy
    a, b = g.generate(shipped, list(prompt), g.DecodeSettings(40)), g.generate(export, export.encode(prompt), g.DecodeSettings(40))
    assert b.text_bytes == a.text_bytes and b.ids == a.ids


# ------------------------------------------------------------------------------------------------
# Today's layouts (Gemma 3's local and global layers, SmolLM3's NoPE layers, Qwen3, Phi-3's LongRoPE)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gemma3", "smollm3", "qwen3", "phi3"])
def test_every_lab_runs_on_the_layout_families(family, hf_family_dir, text, hf_models):
    """Each lab's own functions on a tiny model of each family, past its trained context where the lab goes
    there: numbers that are finite, a cache that decodes what transformers computes, the layout as configured."""
    folder = hf_family_dir[family]
    model, hf = open_model(folder), hf_models(folder)
    ids = model.encode(bytes(text[:4000]))
    L = model.train_length
    for length in (L // 2, L, 2 * L):  # extrapolation
        assert math.isfinite(extrapolation.score_at_length(model, ids, length).bpb)
    view = attention_maps.attention_view(model, ids, 48, layer=model.n_layer - 1)  # attention maps
    assert view is not None
    lengths = compare.compare_lengths(model, ids, L)  # compare: L and 2L windows over the same tokens
    assert math.isfinite(lengths["bpb_long"]) and math.isfinite(lengths["bpb_short"])
    for strategy in kv_cache.STRATEGIES:  # KV cache lab, StreamingLLM included
        r = kv_cache.sliding_score(model, ids, 16, strategy, 40)
        assert r.error is None and math.isfinite(r.bpb), strategy
    shares = kv_cache.first_id_share(model, ids, n_ids=80, from_query=32)
    assert len(shares) == model.n_layer * model.n_head and all(0 <= r["share"] <= 1 for r in shares)
    with torch.no_grad():  # the head-wise share is transformers' own attention on the first token
        eager = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
        first = eager(ids[None, :80], output_attentions=True).attentions[0][0, :, 32:, 0].mean(-1)
    assert np.allclose([r["share"] for r in shares if r["layer"] == 0], first.numpy(), atol=1e-5)
    probes.repeat_probe(model, text, [0, 16], chunk=8, chunks=2)  # retrieval
    key_value.key_value_probe(model, text, [16], trials=2)
    for strategy in ("stop", "streaming"):  # generation, StreamingLLM's window past the context too
        written = g.generate(model, model.encode(PROMPT).tolist(), g.DecodeSettings(L + 8, strategy=strategy))
        assert written.error is None and len(written.ids) == L + 8, strategy
    layout = model.layer_layout()
    assert len(layout) == model.n_layer == hf.config.num_hidden_layers
