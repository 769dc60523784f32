"""The tiny published-model families of tests/hf_tiny.py: each saves as a hub repository would and loads
back offline through transformers' Auto classes; the bad inputs are what they claim; and the position
facts in hf_tiny's docstring are what transformers 5.x actually computes."""
from __future__ import annotations

import inspect
import math
import os
import posixpath

import pytest
import torch

import hf_tiny
from hf_tiny import FAMILIES, VOCAB_SIZE

os.environ["HF_HUB_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

SAMPLE = inspect.getsource(posixpath)  # Python source the tokenizer was not trained on


def sample_ids(tokenizer, n: int = 60) -> torch.Tensor:
    ids = tokenizer(SAMPLE)["input_ids"][:n]
    assert len(ids) == n
    return torch.tensor([ids])


def test_the_families_cover_the_published_position_methods():
    assert set(FAMILIES) == {"gpt2", "opt", "neox", "llama3", "llama_yarn", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3", "bloom", "falcon",
                             "mpt"}
    for name in FAMILIES:
        config = hf_tiny.family_config(name)
        assert config.num_hidden_layers == 2 and config.num_attention_heads == 4
        assert 32 <= config.hidden_size <= 64
        assert config.vocab_size == VOCAB_SIZE
    assert hf_tiny.family_config("qwen2").num_key_value_heads == 2


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_saves_and_loads_back_offline(name, hf_family_dir):
    folder = hf_family_dir[name]
    files = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert not any(f.endswith(".bin") or f.endswith(".pt") for f in files), files

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == VOCAB_SIZE == model.config.vocab_size
    assert tokenizer.eos_token_id == model.config.eos_token_id == hf_tiny.eos_id()
    assert tokenizer.model_max_length == (FAMILIES[name].context or tokenizer.model_max_length)

    # same weights as a fresh build from the same seed: the families are deterministic
    fresh = hf_tiny.build_family(name).state_dict()
    loaded = model.state_dict()
    assert fresh.keys() == loaded.keys()
    assert all(torch.equal(fresh[k], loaded[k]) for k in fresh)
    # the RoPE settings survive config.json in the 5.x format
    expected = getattr(hf_tiny.family_config(name), "rope_parameters", None)
    assert getattr(model.config, "rope_parameters", None) == expected

    ids = sample_ids(tokenizer)
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 60, VOCAB_SIZE)
    assert torch.isfinite(logits).all()
    assert logits.std() > 0.05  # default init gives ~0.1-0.16: not degenerate
    assert not torch.allclose(logits[0, 10], logits[0, 40])


def test_tokenizer_round_trips_stdlib_text(hf_family_dir):
    tokenizer = AutoTokenizer.from_pretrained(hf_family_dir["gpt2"])
    assert type(tokenizer).__name__ == "GPT2Tokenizer"
    assert tokenizer.bos_token == tokenizer.eos_token == hf_tiny.EOS
    for text in (SAMPLE, hf_tiny.training_text()[:5000], "naïve café ✓ 日本語\n\tx = {'a': 1}\n"):
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert max(ids) < VOCAB_SIZE
    # tokens cover more than one byte on average, also on source it was not trained on
    assert len(SAMPLE.encode()) / len(tokenizer(SAMPLE)["input_ids"]) > 1.3
    assert hf_tiny._trained_tokenizer_json.cache_info().misses == 1  # trained once per process


# ------------------------------------------------------------------------------------- position facts

def test_learned_tables(hf_family_dir):
    gpt2 = AutoModelForCausalLM.from_pretrained(hf_family_dir["gpt2"])
    assert gpt2.get_parameter("transformer.wpe.weight").shape == (64, 32)
    assert position_parameters(gpt2) == ["transformer.wpe.weight"]
    opt = AutoModelForCausalLM.from_pretrained(hf_family_dir["opt"])
    table = opt.model.decoder.embed_positions
    assert opt.get_parameter("model.decoder.embed_positions.weight").shape == (64 + 2, 32)
    assert table.offset == 2
    assert position_parameters(opt) == ["model.decoder.embed_positions.weight"]
    # unpadded positions 0..T-1 read rows 2..T+1
    mask = torch.ones(1, 5, dtype=torch.long)
    assert torch.equal(table(mask, 0), table.weight[2:7][None])


def position_parameters(model) -> list[str]:
    return [k for k, _ in model.named_parameters() if "position" in k or "wpe" in k]


def rope_buffers(model) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in model.named_buffers() if k.endswith("inv_freq")}


@pytest.mark.parametrize("name,where,length", [
    ("neox", "gpt_neox.rotary_emb", 2), ("llama3", "model.rotary_emb", 8),
    ("llama_yarn", "model.rotary_emb", 8), ("qwen2", "model.rotary_emb", 8),
    ("falcon", "transformer.rotary_emb", 4)])
def test_rope_buffers(name, where, length):
    model = hf_tiny.build_family(name)
    assert rope_buffers(model) == {f"{where}.inv_freq": (length,), f"{where}.original_inv_freq": (length,)}
    rotary = model.get_submodule(where)
    theta = model.config.rope_parameters["rope_theta"]
    dim = 2 * length
    plain = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
    if name == "llama3":
        # highest frequency kept, lowest divided by factor 8
        assert torch.allclose(rotary.inv_freq[0], plain[0]) and torch.allclose(rotary.inv_freq[-1], plain[-1] / 8)
    elif name == "llama_yarn":
        assert not torch.allclose(rotary.inv_freq, plain)
        assert rotary.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1.0)
    else:
        assert torch.allclose(rotary.inv_freq, plain)
        assert rotary.attention_scaling == 1.0
    # a non-persistent buffer: rebuilt from config.json at load, never in the weights file
    assert not any(k.endswith("inv_freq") for k in model.state_dict())


def test_neox_partial_rotary_config_names():
    config = hf_tiny.family_config("neox")
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    # a legacy (4.x) config.json's rotary_pct / rotary_emb_base land in rope_parameters
    legacy = transformers.GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rotary_pct=0.5, rotary_emb_base=500.0)
    assert legacy.rope_parameters == {"rope_theta": 500.0, "partial_rotary_factor": 0.5, "rope_type": "default"}
    assert not hasattr(legacy, "rotary_pct")


def test_alibi_families():
    from transformers.models.bloom import modeling_bloom
    from transformers.models.falcon import modeling_falcon
    from transformers.models.mpt import modeling_mpt

    for name in ("bloom", "falcon", "mpt"):
        model = hf_tiny.build_family(name)
        assert not position_parameters(model)
    assert callable(modeling_bloom.build_alibi_tensor) and callable(modeling_falcon.build_alibi_tensor)
    mask = torch.ones(1, 6, dtype=torch.long)
    bloom = modeling_bloom.build_alibi_tensor(mask, 4, torch.float32)  # (heads, 1, T): slope * position
    assert torch.allclose(bloom[:, 0, 1], torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]))
    assert torch.equal(modeling_falcon.build_alibi_tensor(mask, 4, torch.float32), bloom)  # exact for 4 heads
    mpt = modeling_mpt.build_mpt_alibi_tensor(4, 64)  # (heads, 1, max_seq_len): slope * (key - last)
    assert mpt.shape == (4, 1, 64) and mpt[:, 0, -1].abs().sum() == 0
    assert torch.allclose(mpt[:, 0, -2], -bloom[:, 0, 1])


def test_falcon_eager_attention_adds_the_alibi_the_probe_measured(hf_family_dir, monkeypatch):
    """Whatever the installed transformers does (5.24 added Falcon's ALiBi twice in eager attention, 5.25 once),
    posviz's probe says it: eager attention (also taken by output_attentions=True) gives the logits of the default
    (sdpa) attention with the bias builder scaled by the probe's multiple, and not those of the other count."""
    from transformers.models.falcon import modeling_falcon

    from posviz.models.hf.probes import measured

    folder = hf_family_dir["falcon"]
    ids = sample_ids(AutoTokenizer.from_pretrained(folder), 40)
    sdpa = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert sdpa.config._attn_implementation == "sdpa"
    probe = measured(sdpa.config, "alibi")
    multiple = round(probe.alibi_eager_multiple)
    assert multiple in (1, 2) and probe.alibi_eager_multiple == pytest.approx(multiple, abs=0.02)
    build = modeling_falcon.build_alibi_tensor
    with torch.no_grad():
        plain = sdpa(ids).logits
        with_maps = sdpa(ids, output_attentions=True).logits
        scaled = {}
        for m in (1, 2):
            monkeypatch.setattr(modeling_falcon, "build_alibi_tensor", lambda *a, m=m, **k: m * build(*a, **k))
            scaled[m] = sdpa(ids).logits
        monkeypatch.setattr(modeling_falcon, "build_alibi_tensor", build)
    torch.testing.assert_close(scaled[1], plain)
    assert torch.allclose(with_maps, scaled[multiple], atol=1e-5)
    assert not torch.allclose(with_maps, scaled[3 - multiple], atol=1e-3)  # the other count is told apart
    assert probe.eager_equals_default == (multiple == 1)


def test_mpt_cannot_run_past_max_seq_len():
    model = hf_tiny.build_family("mpt")
    with torch.no_grad():
        model(torch.zeros(1, 64, dtype=torch.long))
        with pytest.raises(RuntimeError):
            model(torch.zeros(1, 65, dtype=torch.long))


# ---------------------------------------------------------------------------------------- bad inputs

def test_pickle_only(tmp_path):
    folder = hf_tiny.save_pickle_only(tmp_path / "pickle")
    files = {p.name for p in folder.iterdir()}
    assert "pytorch_model.bin" in files and not any(f.endswith(".safetensors") for f in files)
    with pytest.raises(OSError):
        AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
    # transformers' default would load the pickle: a loader must ask for safetensors itself
    loaded = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert torch.equal(loaded["transformer.wpe.weight"], hf_tiny.build_family("gpt2").transformer.wpe.weight)
    assert not any(p.suffix == ".safetensors" for p in folder.iterdir())


def test_remote_code(tmp_path):
    folder = hf_tiny.save_remote_code(tmp_path / "remote")
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoConfig.from_pretrained(folder, trust_remote_code=False)
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)


def test_unsupported_loads_but_has_no_position_method(tmp_path):
    folder = hf_tiny.save_unsupported(tmp_path / "mamba")
    assert (folder / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "mamba"
    assert not rope_buffers(model)
    assert not position_parameters(model)
    assert not [k for k, _ in model.named_parameters() if "attn" in k or "attention" in k]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        assert model(sample_ids(tokenizer)).logits.shape == (1, 60, VOCAB_SIZE)


def test_oversized_config_is_known_big_without_weights(tmp_path):
    folder = hf_tiny.save_oversized_config(tmp_path / "big")
    files = {p.name for p in folder.iterdir()}
    assert "config.json" in files
    assert not [f for f in files if f.endswith((".safetensors", ".bin", ".pt", ".index.json"))]
    config = AutoConfig.from_pretrained(folder)
    count = hf_tiny.llama_parameter_count(config)
    assert count > 1e9
    assert count == pytest.approx(70.55e9, rel=1e-3)
    # the arithmetic is transformers' own count, on a model built without memory
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert model.num_parameters() == count
