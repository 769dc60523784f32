"""Published models through posviz's model interface, checked against a direct transformers forward.

Every family of ``hf_tiny.FAMILIES`` is saved as a hub repository would hold it and opened through
``open_model(folder)``, the path a hub id takes after download. What a lab reads of it (logits, one
layer's attention rows, cached steps, bits per byte, the position parameters) must equal what
transformers computes when called directly, to 1e-5.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_tiny
from posviz.errors import PosvizError, PositionLimitError
from posviz.labs.extrapolation import score_at_length
from posviz.labs.kv_cache import sliding_score
from posviz.models.interface import forget_models, open_model
from posviz.models.hf.model import PublishedModel
from posviz.models.hf.families import alibi_slopes_as_added

FAMILIES = list(hf_tiny.FAMILIES)
TEXT = hf_tiny.training_text().encode()[:6000]


@pytest.fixture(autouse=True)
def _fresh_models():
    forget_models()
    yield
    forget_models()


def direct(folder, eager=False):
    kwargs = {"attn_implementation": "eager"} if eager else {}
    return AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()


def context(name) -> int:
    return hf_tiny.FAMILIES[name].context or 2048


@pytest.mark.parametrize("name", FAMILIES)
def test_a_lab_reads_what_transformers_computes(hf_family_dir, name):
    folder = hf_family_dir[name]
    model = open_model(folder)
    assert isinstance(model, PublishedModel) and model.unit == "token"
    assert model.train_length == context(name)
    ids = model.encode(TEXT)
    expected_ids = AutoTokenizer.from_pretrained(folder)(TEXT.decode(), add_special_tokens=False)["input_ids"]
    assert ids.tolist() == expected_ids
    T = 48
    x = ids[None, :T]
    with torch.no_grad():
        reference = direct(folder)(x).logits
        eager = direct(folder, eager=True)(x, output_attentions=True)
    out = model(x)
    assert out.attention is None
    torch.testing.assert_close(out.logits, reference, atol=1e-5, rtol=0)
    # one layer's attention rows, per head, from eager attention only for this pass
    mapped = model(x, attention_layer=1)
    torch.testing.assert_close(mapped.attention, eager.attentions[1].float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(mapped.logits, reference, atol=1e-5, rtol=0)  # the scores stay the default pass's
    assert torch.equal(model(x, attention_layer=0, attention_head=2).attention, model(x, attention_layer=0).attention[:, 2])
    # every layer's map from one pass: the per-layer maps
    torch.testing.assert_close(model.attention_all_layers(x[0]), torch.stack([a[0].float() for a in eager.attentions]),
                               atol=1e-5, rtol=0)
    # cached decoding, one id at a time, with transformers' own cache
    # (LongRoPE switches every pair to its long factors once a pass is longer than the original context, so
    # past it a cached step, whose keys were rotated with the short ones, is not the long pass: Phi-3 as it runs)
    n = hf_tiny.FAMILIES[name].kwargs.get("original_max_position_embeddings", T) if name == "phi3" else T
    cache = model.new_cache()
    steps = torch.cat([model(x[:, t:t + 1], cache=cache).logits for t in range(n)], 1)
    torch.testing.assert_close(steps, reference[:, :n] if n == T else direct(folder)(x[:, :n]).logits, atol=1e-5, rtol=0)
    assert len(cache) == n and cache.next_position() == n
    # bits per byte: the sum of every prediction's bits over the bytes the predicted tokens cover
    score = score_at_length(model, ids[:T + 1], T)
    bits = F.cross_entropy(reference[0], ids[1:T + 1], reduction="none") / math.log(2)
    covered = sum(len(model.decode([i])) for i in ids[1:T + 1].tolist())
    assert score.bpb == pytest.approx(float(bits.sum()) / covered, abs=1e-5)
    assert covered > T  # a tokenizer's ids cover more than a byte each: bits per token would differ


def test_text_in_tokens_counts_every_byte(hf_family_dir):
    model = open_model(hf_family_dir["neox"])
    ids = model.encode(TEXT)
    assert model.decode(ids) == TEXT and model.text.round_trips(TEXT)
    assert int(model.bytes_per_id(ids).sum()) == len(TEXT)
    # bytes that are no UTF-8 are replaced before tokenizing: the text does not round-trip, and a page says so
    broken = b"caf\xe9 \xff ok"
    assert not model.text.round_trips(broken)
    assert int(model.bytes_per_id(model.encode(broken)).sum()) == len(model.decode(model.encode(broken)))
    # a decoder that cuts a multi-byte character between ids keeps its bytes
    accents = "é—ü".encode()
    assert model.decode(model.encode(accents)) == accents


@pytest.mark.parametrize("name, table, offset", [("gpt2", "transformer.wpe.weight", 0),
                                                 ("opt", "model.decoder.embed_positions.weight", 2)])
def test_learned_table_is_the_models_own(hf_family_dir, name, table, offset):
    model = open_model(hf_family_dir[name])
    weights = dict(direct(hf_family_dir[name]).named_parameters())[table]
    position = model.position
    assert position.method == "learned"
    torch.testing.assert_close(position.table, weights[offset:].detach(), atol=0, rtol=0)
    assert position.table.shape[0] == model.max_positions == 64
    assert bool(position.notes) == bool(offset)


@pytest.mark.parametrize("name", ["gpt2", "opt", "mpt"])
def test_a_model_that_cannot_run_past_its_table_says_so(hf_family_dir, name):
    model = open_model(hf_family_dir[name])
    ids = model.encode(TEXT)
    assert model.cannot_run(64) is None
    why = model.cannot_run(65)
    assert why and "64" in why and model.name in why
    with pytest.raises(PositionLimitError, match="cannot run 65"):
        model(ids[None, :65])
    cache = model.new_cache()
    model(ids[None, :64], cache=cache)
    with pytest.raises(PositionLimitError):
        model(ids[None, 64:65], cache=cache)


@pytest.mark.parametrize("name", ["neox", "llama3", "llama_yarn", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_rope_frequencies_are_the_models_own(hf_family_dir, name):
    model = open_model(hf_family_dir[name])
    net = direct(hf_family_dir[name])
    rotary = next(m for n, m in net.named_modules() if n.endswith("rotary_emb"))
    inv_freq, attention = model.frequencies(model.train_length)
    prefix = "full_attention_" if name == "gemma3" else ""  # Gemma 3: a buffer per layer type; drawn: the full layers'
    torch.testing.assert_close(inv_freq.float(), getattr(rotary, prefix + "inv_freq").float(), atol=0, rtol=0)
    assert attention == pytest.approx(getattr(rotary, prefix + "attention_scaling"))
    if name == "gemma3":
        assert model.position_options["base"] == 1e6 and "θ = 10,000" in " ".join(model.position.notes)
        assert inv_freq[1] == pytest.approx(1e6 ** (-2 / 16))  # the global θ, not the local one
        with pytest.raises(PosvizError, match="2 RoPE bases"):
            model.with_position_options({"scaling": "linear", "factor": 2.0})
    assert model.position.rotary_dims == 2 * inv_freq.numel()
    if name == "neox":
        assert model.position.rotary_dims == model.position.head_dim // 4 and model.position.notes


def test_layer_layouts_are_read_from_the_config(hf_family_dir):
    """Which layers rotate, with which θ, through which window, with sinks: from transformers' own fields."""
    smol = open_model(hf_family_dir["smollm3"])
    net = direct(hf_family_dir["smollm3"])
    layout = smol.layer_layout()
    assert [r["position"] for r in layout] == ["rope" if layer.self_attn.use_rope else "nope" for layer in net.model.layers]
    assert [r["position"] for r in layout] == ["rope", "nope"] and layout[1]["base"] is None
    gemma = open_model(hf_family_dir["gemma3"]).layer_layout()
    assert [(r["base"], r["window"]) for r in gemma] == [(1e4, 16), (1e6, None)]
    assert [r["rotary share"] for r in open_model(hf_family_dir["neox"]).layer_layout()] == [0.25, 0.25]
    assert {r["position"] for r in open_model(hf_family_dir["bloom"]).layer_layout()} == {"alibi"}


def test_gpt_oss_is_refused_for_its_size_and_its_layout_is_drawn_from_its_config(tmp_path, monkeypatch):
    """gpt-oss-20b's shapes (24 layers, 32 experts): over the parameter cap, yet its layout is known from
    config.json alone: sliding-window (128) and full layers alternating, sinks in every layer, θ 150,000."""
    from transformers import GptOssConfig

    from posviz.models.hf.families import layer_layout

    config = GptOssConfig(num_hidden_layers=24, num_local_experts=32)
    folder = tmp_path / "gpt-oss-20b"
    folder.mkdir()
    config.save_pretrained(folder)
    hf_tiny.make_tokenizer(folder)
    with pytest.raises(PosvizError, match="over this server's cap"):
        open_model(folder)
    layout = layer_layout(config)
    assert len(layout) == 24 and all(r["sinks"] for r in layout)
    assert [r["window"] for r in layout[:4]] == [128, None, 128, None]
    assert {r["base"] for r in layout} == {150000.0}


@pytest.mark.parametrize("scaling, factor", [("linear", 4.0), ("yarn", 4.0), ("llama3", 8.0), ("ntk", 4.0),
                                             ("dynamic", 2.0)])
def test_a_scaling_is_transformers_rope_parameters_on_the_same_weights(hf_family_dir, scaling, factor):
    folder = hf_family_dir["qwen2"]
    base = open_model(folder)
    scaled = base.with_position_options({"scaling": scaling, "factor": factor})
    assert scaled._engine is base._engine  # one copy of the weights for every variant
    ids = base.encode(TEXT)[None, :100]  # past the 64-token context
    config = direct(folder).config
    config.rope_parameters = scaled.rope_parameters
    assert config.rope_parameters["rope_theta"] == pytest.approx(1e6 * (factor ** (16 / 14) if scaling == "ntk" else 1))
    reference_model = AutoModelForCausalLM.from_pretrained(folder, config=config).eval()
    with torch.no_grad():
        reference = reference_model(ids).logits
        plain = direct(folder)(ids).logits
    torch.testing.assert_close(scaled(ids).logits, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(base(ids).logits, plain, atol=1e-5, rtol=0)  # the variant left the base as it was
    assert not torch.allclose(reference, plain, atol=1e-3)
    rotary = next(m for n, m in reference_model.named_modules() if n.endswith("rotary_emb"))
    if scaling != "dynamic":
        torch.testing.assert_close(scaled.frequencies(100)[0].float(), rotary.inv_freq.float())


@pytest.mark.parametrize("name", ["bloom", "mpt", "falcon"])
def test_alibi_slopes_are_measured_as_the_model_adds_them(hf_family_dir, name):
    """With every query and key zeroed, a layer's attention row is softmax(bias): the log-ratio of
    neighbouring keys is the slope the model really adds in eager attention, the one that draws the maps. It is
    the stated slope times the multiple posviz's probe measured on the installed transformers (Falcon's: twice on
    5.24, once on 5.25), and the notes a visitor reads say that same multiple."""
    from posviz.models.hf.probes import measured

    folder = hf_family_dir[name]
    model = open_model(folder)
    net = model.net
    with torch.no_grad():
        for pname, p in net.named_parameters():
            if "query_key_value" in pname or "Wqkv" in pname:
                p.zero_()
    probs = model(model.encode(TEXT)[None, :16], attention_layer=0).attention[0]  # (H, T, T)
    measured_slopes = (probs[:, -1, 1:].log() - probs[:, -1, :-1].log()).mean(-1)  # (H,)
    slopes = model.position.slopes
    multiple = measured(model.config, "alibi").alibi_eager_multiple
    ratio = float((measured_slopes / slopes).median())
    assert ratio == pytest.approx(multiple, abs=0.02)  # what the notes say is what the model does
    said_twice = any("twice" in note for note in model.position.notes)
    assert said_twice == (abs(ratio - 2.0) < 0.05)
    assert any(f"transformers {transformers.__version__}" in note for note in model.position.notes) == said_twice
    if name == "falcon":
        torch.testing.assert_close(measured_slopes, multiple * slopes, atol=2e-3, rtol=1e-2)  # a bf16 bias
        bloom_like, _ = alibi_slopes_as_added(direct(hf_family_dir["bloom"]).config, 4)
        torch.testing.assert_close(slopes, bloom_like / math.sqrt(8), atol=1e-6, rtol=1e-3)
    else:
        assert multiple == pytest.approx(1.0, abs=1e-4) and not said_twice
        torch.testing.assert_close(measured_slopes, slopes, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(slopes, 2.0 ** (-8.0 * torch.arange(1, 5) / 4))  # the paper's, for 4 heads


@pytest.mark.parametrize("name", ["neox", "llama3"])
def test_a_sliding_cache_is_a_banded_mask(hf_family_dir, name):
    """A KV cache keeping the last W keys, each token at its true position, is one forward pass whose
    queries each see the W keys ending at themselves (a banded causal mask, given to transformers as a
    4-D mask): every cached key was computed from the same window when it was new."""
    model = open_model(hf_family_dir[name])
    ids = model.encode(TEXT)[:60]
    W = 16
    cached = sliding_score(model, ids, W, "cached_window")
    i = torch.arange(ids.numel() - 1)
    visible = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < W)
    mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        logits = direct(hf_family_dir[name])(ids[None, :-1], attention_mask=mask).logits[0]
    bits = (F.cross_entropy(logits, ids[1:], reduction="none") / math.log(2)).numpy()
    np.testing.assert_allclose(cached.id_bits, bits, atol=1e-4)
    # relabelling the window (the shifted cache) moves every new query but not the keys' baked-in angles
    shifted = sliding_score(model, ids, W, "shifted_cache")
    assert np.abs(shifted.id_bits - bits)[W:].max() > 1e-3


def test_alibi_needs_no_true_positions(hf_family_dir):
    """BLOOM adds ALiBi at attention time from the keys' places in the cache: relabelling changes nothing."""
    model = open_model(hf_family_dir["bloom"])
    ids = model.encode(TEXT)[:60]
    shifted, cached = (sliding_score(model, ids, 16, s) for s in ("shifted_cache", "cached_window"))
    np.testing.assert_allclose(shifted.id_bits, cached.id_bits, atol=1e-5)


def test_bad_published_models_are_refused_in_words(tmp_path, monkeypatch):
    pickled = hf_tiny.save_pickle_only(tmp_path / "pickle")
    with pytest.raises(PosvizError, match="safetensors only, never pickle"):
        open_model(pickled).load()
    with pytest.raises(PosvizError, match="never runs remote code"):
        open_model(hf_tiny.save_remote_code(tmp_path / "remote"))
    with pytest.raises(PosvizError, match="Supported families: bloom, deepseek_v3, deepseek_v4, falcon, falcon_h1, gemma2, gemma3_text, gpt2"):
        open_model(hf_tiny.save_unsupported(tmp_path / "mamba"))
    with pytest.raises(PosvizError, match=r"70\.\d+ B parameters, over this server's cap"):
        open_model(hf_tiny.save_oversized_config(tmp_path / "big"))  # refused from config.json: there are no weights
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PosvizError, match="Cannot reach the Hugging Face hub"):
        open_model("nobody-here/no-such-model")


def test_the_parameter_cap_and_the_memory_estimate(hf_family_dir, monkeypatch):
    monkeypatch.setenv("POSVIZ_MAX_PARAMS", "1000")
    with pytest.raises(PosvizError, match="POSVIZ_MAX_PARAMS"):
        open_model(hf_family_dir["gpt2"])
    monkeypatch.delenv("POSVIZ_MAX_PARAMS")
    forget_models()
    model = open_model(hf_family_dir["bloom"])
    monkeypatch.setenv("POSVIZ_MAX_WORK_BYTES", str(3 * 4 * 4 * 40 * 40))  # a map of 40 tokens fits, 48 does not
    ids = model.encode(TEXT)[None]
    assert model(ids[:, :40], attention_layer=0).attention.shape == (1, 4, 40, 40)
    with pytest.raises(PosvizError, match="GiB for an attention map"):
        model(ids[:, :48], attention_layer=0)


def test_the_shipped_checkpoints_need_no_transformers_import():
    import subprocess
    import sys

    code = ("import sys; from posviz.models.interface import open_model; m = open_model('rope'); "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
