"""Checkpoint files: a faithful round trip, safetensors only, and every broken file named in its error."""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import tiny_model
from posviz.models.checkpoint_files import CONFIG, METRICS, WEIGHTS, load_checkpoint, read_config, read_metrics, save_checkpoint
from posviz.errors import CheckpointError
from posviz.positions import POSITION_METHODS

ROOT = Path(__file__).resolve().parent.parent


def trained_like(method: str, seed: int = 0):
    """A tiny model whose weights are far from their init, so every stored tensor matters."""
    model = tiny_model(method, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


@pytest.fixture()
def saved(tmp_path):
    model = trained_like("t5")
    folder = save_checkpoint(model, tmp_path / "t5", {"train": {"method": "t5"}}, {"steps": 3})
    return model, folder


@pytest.mark.parametrize("method", sorted(POSITION_METHODS))
def test_round_trip_gives_the_same_logits_within_fp16(method, tmp_path):
    model = trained_like(method)
    folder = save_checkpoint(model, tmp_path / method, {"train": {"method": method}}, {"steps": 1})
    loaded = load_checkpoint(folder)
    assert not loaded.training and loaded.config == model.config
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(idx).logits
        got = loaded(idx).logits
        # exactly the model with its weights rounded to fp16 (what the file stores) ...
        for p in model.parameters():
            p.copy_(p.half().float())
        rounded = model(idx).logits
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-5)
    # ... and close to the fp32 original: fp16 keeps 11 significant bits (relative error <= 2^-11)
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()
    # the tie between input embedding and output head survives loading
    assert loaded.lm_head.weight.data_ptr() == loaded.wte.weight.data_ptr()


def test_weights_file_is_safetensors_not_pickle(saved):
    _, folder = saved
    raw = (folder / WEIGHTS).read_bytes()
    assert not raw.startswith(b"\x80") and not raw.startswith(b"PK")  # pickle protocol / torch zip
    (header_len,) = struct.unpack("<Q", raw[:8])  # 8-byte little-endian header length ...
    header = json.loads(raw[8 : 8 + header_len])  # ... then that many bytes of JSON
    assert header["__metadata__"]["posviz"] == "1"
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert "wte.weight" in tensors and "lm_head.weight" not in tensors  # tied weight stored once
    assert {v["dtype"] for v in tensors.values()} == {"F16"}
    end = max(v["data_offsets"][1] for v in tensors.values())
    assert len(raw) == 8 + header_len + end  # nothing hidden after the tensors


def test_no_pickle_loading_anywhere_in_the_package():
    sources = "\n".join(p.read_text() for p in (ROOT / "posviz").rglob("*.py"))
    assert not re.search(r"torch\.load\(|import pickle|pickle\.load|weights_only\s*=\s*False", sources)


def test_config_and_metrics_round_trip(saved):
    model, folder = saved
    config = read_config(folder)
    assert config["model"] == model.config.to_dict() and config["train"] == {"method": "t5"}
    assert read_metrics(folder) == {"steps": 3}


def test_position_overrides_change_the_loaded_method(tmp_path):
    folder = save_checkpoint(trained_like("rope"), tmp_path / "rope")
    plain = load_checkpoint(folder)
    scaled = load_checkpoint(folder, {"scaling": "yarn", "factor": 4.0})
    assert scaled.position.options.scaling == "yarn" and plain.position.options.scaling == "none"
    assert read_config(folder)["model"]["position_options"] == {}  # the file itself is untouched
    idx = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.allclose(plain(idx).logits, scaled(idx).logits, atol=1e-3)


# ------------------------------------------------------------------------------------- broken files

def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / "nowhere")) + ".*does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_missing_config(saved):
    _, folder = saved
    (folder / CONFIG).unlink()
    with pytest.raises(CheckpointError, match=re.escape(str(folder / CONFIG)) + ": file is missing"):
        load_checkpoint(folder)


def test_config_that_is_not_json(saved):
    _, folder = saved
    (folder / CONFIG).write_text('{"model": {"n_layer": 2,')
    with pytest.raises(CheckpointError, match=re.escape(str(folder / CONFIG)) + ": not valid JSON"):
        load_checkpoint(folder)


def test_missing_metrics_is_named(saved):
    _, folder = saved
    (folder / METRICS).unlink()
    with pytest.raises(CheckpointError, match=re.escape(str(folder / METRICS)) + ": file is missing"):
        read_metrics(folder)


def test_missing_weights(saved):
    _, folder = saved
    (folder / WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match=re.escape(str(folder / WEIGHTS)) + ": file is missing"):
        load_checkpoint(folder)


@pytest.mark.parametrize("keep", [0.5, 0.001])
def test_truncated_weights(saved, keep):
    _, folder = saved
    raw = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(raw[: int(len(raw) * keep)])  # an interrupted copy or download
    with pytest.raises(CheckpointError, match=re.escape(str(folder / WEIGHTS)) + ": cannot be read as safetensors"):
        load_checkpoint(folder)


def test_tensor_with_the_wrong_shape(saved):
    _, folder = saved
    state = load_file(str(folder / WEIGHTS))
    state["blocks.1.mlp.c_fc.weight"] = state["blocks.1.mlp.c_fc.weight"][:64].contiguous()
    save_file(state, str(folder / WEIGHTS))
    with pytest.raises(CheckpointError, match=re.escape(str(folder / WEIGHTS)) +
                       r": tensor blocks\.1\.mlp\.c_fc\.weight has shape \(64, 32\), but config\.json implies \(128, 32\)"):
        load_checkpoint(folder)


def test_missing_and_unexpected_tensors(saved):
    _, folder = saved
    state = load_file(str(folder / WEIGHTS))
    state["extra.weight"] = state.pop("ln_f.bias")
    save_file(state, str(folder / WEIGHTS))
    with pytest.raises(CheckpointError, match=re.escape(str(folder / WEIGHTS)) +
                       r": tensors do not match config\.json: missing \['ln_f\.bias'\], unexpected \['extra\.weight'\]"):
        load_checkpoint(folder)


def test_weights_of_another_method(saved, tmp_path):
    _, folder = saved
    other = save_checkpoint(trained_like("shaw"), tmp_path / "shaw")
    (folder / WEIGHTS).write_bytes((other / WEIGHTS).read_bytes())  # t5 config, shaw weights
    with pytest.raises(CheckpointError, match=r"missing \['position\.bucket_bias\.weight'\], unexpected \['position\.rel_keys'\]"):
        load_checkpoint(folder)


@pytest.mark.parametrize("change,message", [
    (lambda m: m.update(n_layers=2), r"unknown key\(s\) 'n_layers'"),
    (lambda m: m["position_options"].update(max_distnace=9), r"t5 options: unknown key\(s\) 'max_distnace'"),
    (lambda m: m.update(position="t6"), r"Unknown position method 't6'"),
    (lambda m: m.update(n_head=3), r"must be divisible by n_head \(3\)"),
])
def test_config_with_unknown_keys_or_impossible_values(saved, change, message):
    _, folder = saved
    config = json.loads((folder / CONFIG).read_text())
    change(config["model"])
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=re.escape(str(folder / CONFIG)) + ": .*" + message):
        load_checkpoint(folder)


@pytest.mark.parametrize("config", [{"train": {}}, {"model": [["n_layer", 2]]}, {"model": "t5"}], ids=["none", "list", "str"])
def test_config_without_a_model_section(saved, config):
    _, folder = saved
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=re.escape(str(folder / CONFIG)) + ": has no 'model' section"):
        load_checkpoint(folder)


def test_config_that_is_not_an_object(saved):
    _, folder = saved
    (folder / CONFIG).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=re.escape(str(folder / CONFIG)) + ": expected a JSON object"):
        load_checkpoint(folder)


@pytest.mark.parametrize("method", sorted(POSITION_METHODS))
def test_pinned_options_build_the_same_model(method):
    """What training stores (every option written out, ``pinned_config``) builds the very model the recipe's
    options build: the same parameters from the same seed and the same forward pass; and pinning is stable."""
    from posviz.config import ModelConfig
    from posviz.models.byte_gpt import GPT, pinned_config

    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, train_length=32, position=method)
    pinned = pinned_config(cfg)
    assert pinned_config(pinned) == pinned and json.loads(json.dumps(pinned.to_dict())) == pinned.to_dict()
    models = []
    for c in (cfg, pinned):
        torch.manual_seed(0)
        models.append(GPT(c).eval())
    a, b = (m.state_dict() for m in models)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    T = 32 if models[0].position.max_positions else 70  # a table: its rows; else past irope's first step (31)
    idx = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(models[0](idx).logits, models[1](idx).logits, rtol=0, atol=0)
