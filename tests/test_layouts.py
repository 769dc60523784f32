"""Per-layer layouts (``positions.layers``: irope, local_global, rope_sinks) against their references.

* Llama 4's NoPE-layer temperature: transformers' ``Llama4TextAttention`` on the same weights;
* sink logits: transformers' GPT-OSS ``eager_attention_forward`` on the same queries, keys and values,
  with a full and a sliding-window mask;
* a layout of RoPE layers: the shipped ``rope`` checkpoint's forward, to 1e-6;
* properties: windows hide what is further back, the global layer sees it, sinks take their share of
  each row, specs reject unknown keys and methods that cannot act in one layer.
"""
from __future__ import annotations

import types

import pytest
import torch
from transformers import Llama4TextConfig
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager_attention
from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

from conftest import decode_in_chunks, tiny_model
from posviz.config import ModelConfig
from posviz.errors import ConfigError
from posviz.models.attention import CausalSelfAttention
from posviz.models.byte_gpt import GPT
from posviz.models.checkpoint_files import load_checkpoint
from posviz.positions import ModelShape, build_position_method
from posviz.positions.nope import query_temperature

@pytest.fixture(autouse=True)
def no_grad():
    """The references are compared without autograd (its graph is no part of what is compared)."""
    with torch.no_grad():
        yield


def one_layer(position: str, options: dict, n_embd=32, n_head=4, train_length=16):
    """A posviz attention layer and its method, biases zero (the references have none)."""
    cfg = ModelConfig(n_layer=1, n_head=n_head, n_embd=n_embd, train_length=train_length, position=position,
                      position_options=options)
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg).double()
    torch.nn.init.normal_(attn.c_attn.weight, std=0.3)
    torch.nn.init.zeros_(attn.c_attn.bias)
    torch.nn.init.zeros_(attn.c_proj.bias)
    method = build_position_method(position, ModelShape(1, n_head, n_embd // n_head, n_embd, train_length), options).double()
    return attn, method


def causal_mask(T: int, window: int | None = None) -> torch.Tensor:
    """(1, 1, T, T) additive mask: 0 where a query sees a key, -inf elsewhere (transformers' convention)."""
    d = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    seen = (d >= 0) if window is None else (d >= 0) & (d < window)
    return torch.zeros(T, T, dtype=torch.float64).masked_fill(~seen, float("-inf"))[None, None]


@pytest.mark.parametrize("floor_scale,T", [(4, 40), (16, 70)])
def test_nope_temperature_equals_llama4_text_attention(floor_scale, T):
    """Llama 4's NoPE layer (``no_rope_layers`` 0, ``attn_temperature_tuning``) on our weights: the same output."""
    attn, method = one_layer("irope", {"layers": [{"method": "nope", "options": {"temperature_floor_scale": floor_scale}}]})
    config = Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                              num_hidden_layers=1, no_rope_layers=[0], attn_temperature_tuning=True,
                              floor_scale=floor_scale, attn_scale=0.1, use_qk_norm=False, attention_bias=False,
                              attention_dropout=0.0)
    config._attn_implementation = "eager"
    theirs = Llama4TextAttention(config, layer_idx=0).double().eval()
    q_w, k_w, v_w = attn.c_attn.weight.chunk(3, dim=0)
    for lin, w in ((theirs.q_proj, q_w), (theirs.k_proj, k_w), (theirs.v_proj, v_w), (theirs.o_proj, attn.c_proj.weight)):
        lin.weight.copy_(w)
    x = torch.randn(1, T, 32, dtype=torch.float64)
    expected = theirs(x, position_embeddings=None, attention_mask=causal_mask(T))[0]
    ours, _ = attn(x, torch.arange(T), method, 0, None, False, {})
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)
    # and the scale is the formula's: 1 until floor_scale - 1, then log1p(floor((p + 1) / s)) * 0.1 + 1
    scale = query_temperature(torch.arange(T), floor_scale, 0.1)
    assert scale[floor_scale - 2] == 1 and scale[floor_scale - 1] > 1 and bool((scale.diff() >= 0).all())


@pytest.mark.parametrize("window", [None, 5])
def test_sink_logits_equal_gpt_oss_eager_attention(window):
    """GPT-OSS's eager attention with the same sinks, queries, keys and values gives the same weights and output."""
    attn, method = one_layer("rope_sinks", {"layers": [{"method": "nope", "window": window, "sinks": True}]})
    layer = method.at_layer(0)
    layer.sink_logits.copy_(torch.tensor([2.0, -1.0, 0.5, 4.0]))
    T = 23
    x = torch.randn(1, T, 32, dtype=torch.float64)
    q, k, v = attn.heads(x)
    module = types.SimpleNamespace(sinks=layer.sink_logits, num_key_value_groups=1, training=False)
    out, weights = gpt_oss_eager_attention(module, q, k, v, causal_mask(T, window), scaling=8 ** -0.5)
    ours, probs = attn(x, torch.arange(T), method, 0, None, True, {})
    torch.testing.assert_close(probs, weights, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours, attn._project(out.transpose(1, 2)), rtol=1e-10, atol=1e-10)
    # the sink took a share of every row: more where its logit is larger (head 3 at 4.0, head 1 at -1.0)
    left = 1 - probs.sum(-1)  # (1, H, T)
    assert bool((left > 0).all()) and left[0, 3].mean() > left[0, 0].mean() > left[0, 1].mean()


def test_a_layout_of_rope_layers_is_the_shipped_rope_checkpoint():
    """The layout machinery adds nothing: RoPE in every layer, with rope's weights, is rope's forward to 1e-6."""
    rope = load_checkpoint("models/rope")
    layout = GPT(ModelConfig(**{**rope.config.to_dict(), "position": "local_global",
                                "position_options": {"layers": [{"method": "rope"}]}})).eval()
    layout.load_state_dict(rope.state_dict())
    idx = torch.tensor([list(open("posviz/positions/layers.py", "rb").read()[:700])])
    torch.testing.assert_close(layout(idx).logits, rope(idx).logits, rtol=0, atol=1e-6)


def test_windows_hide_what_is_further_back_and_the_global_layer_sees_it():
    model = tiny_model("local_global", n_layer=4, train_length=32)  # local window 8, layers 0-2; layer 3 global
    assert [m.window for m in model.position.layer_methods] == [8, 8, 8, None]
    idx = torch.randint(0, 256, (1, 40))
    for layer in range(4):
        probs = model(idx, attention_layer=layer).attention[0]  # (H, T, T)
        d = torch.arange(40)[:, None] - torch.arange(40)[None, :]
        beyond = probs[:, d >= 8]
        assert (beyond.abs().max() == 0) == (layer < 3), layer
    # and a sliding cache of any size decodes as the full pass where it keeps every key
    torch.testing.assert_close(decode_in_chunks(model, idx, [5, 1, 1, 20, 13]), model(idx).logits, rtol=1e-4, atol=1e-5)


def test_irope_puts_its_nope_layer_fourth_and_is_not_shift_invariant():
    model = tiny_model("irope", n_layer=8, train_length=32)
    names = [m.name for m in model.position.layer_methods]
    assert names == ["rope", "rope", "rope", "nope"] * 2
    assert model.position.layer_methods[3].options.temperature_floor_scale == 32
    assert not model.position.is_shift_invariant()
    assert tiny_model("irope", n_layer=3).position.is_shift_invariant()  # no NoPE layer: only RoPE's distances
    idx = torch.randint(0, 256, (1, 90))  # past the temperature's first step (31) and second (63)
    torch.testing.assert_close(decode_in_chunks(model, idx, [1, 30, 1, 1, 57]), model(idx).logits, rtol=1e-4, atol=1e-5)


def test_rope_sinks_learn_a_logit_per_head_in_every_layer():
    model = tiny_model("rope_sinks", n_layer=4)
    sinks = [n for n, _ in model.named_parameters() if "sink" in n]
    assert len(sinks) == 4 and all(p.shape == (4,) for n, p in model.named_parameters() if "sink" in n)
    assert [m.window for m in model.position.layer_methods] == [8, None, 8, None]
    model.train()
    with torch.enable_grad():
        model.loss(torch.randint(0, 256, (2, 20)), torch.randint(0, 256, (2, 20))).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "sink" in n)


@pytest.mark.parametrize("layers,message", [
    ([{"method": "rope", "widnow": 8}], "widnow"),
    ([{"method": "learned"}], "whole model"),
    ([{"method": "irope"}], "layout"),
    ([{"method": "rope", "window": 0}], "window"),
    ([], "at least one layer"),
    ([{"method": "nope", "options": {"temperature_floor_scale": 0}}], "temperature_floor_scale"),
])
def test_a_layout_rejects_what_it_cannot_build(layers, message):
    with pytest.raises(ConfigError, match=message):
        tiny_model("rope_sinks", position_options={"layers": layers})


def test_any_method_takes_sinks_through_a_layout():
    """ALiBi with sinks: its bias and the sink in the same softmax, cached decoding equal to the full pass."""
    model = tiny_model("rope_sinks", position_options={"layers": [{"method": "alibi", "sinks": True, "window": 6}]})
    assert model.position.at_layer(1).name == "alibi" and model.position.at_layer(1).sink_logits is not None
    idx = torch.randint(0, 256, (1, 30))
    torch.testing.assert_close(decode_in_chunks(model, idx, [1, 7, 22]), model(idx).logits, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------- checkpoints pin their layouts
SHIPPED_LAYOUTS = ("irope", "local_global", "rope_sinks")


def _text(n: int) -> torch.Tensor:
    return torch.tensor([list(open("posviz/positions/layers.py", "rb").read()[:n])])


def _with_options(tmp_path, name: str, edit) -> str:
    """A copy of ``models/<name>`` whose config.json's model position options were changed by ``edit``."""
    import json
    import shutil

    folder = tmp_path / name
    shutil.copytree(f"models/{name}", folder)
    config = json.loads((folder / "config.json").read_text())
    config["model"]["position_options"] = edit(config["model"]["position_options"])
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("name", SHIPPED_LAYOUTS)
def test_a_shipped_layout_stores_every_layer_as_trained(name):
    """config.json holds each layer written out: method, every option (a rotary layer's base, the NoPE layer's
    temperature), window (null: full) and sinks; the recipe keeps the preset name it was asked for."""
    import json

    config = json.loads(open(f"models/{name}/config.json").read())
    layers = config["model"]["position_options"]["layers"]
    assert config["train"]["position_options"] == {} and len(layers) == config["model"]["n_layer"] == 4
    for layer in layers:
        assert set(layer) == {"method", "options", "window", "sinks"}
        if layer["method"] == "rope":
            assert isinstance(layer["options"]["base"], float)
    expected = {  # (method, base or temperature floor scale, window, sinks) of layers 0..3
        "irope": [("rope", 1e4, None, False)] * 3 + [("nope", 256, None, False)],
        "local_global": [("rope", 1e4, 64, False)] * 3 + [("rope", 1e6, None, False)],
        "rope_sinks": [("rope", 1e4, 64, True), ("rope", 1e4, None, True)] * 2,
    }[name]
    got = [(la["method"], la["options"].get("base", la["options"].get("temperature_floor_scale")), la["window"],
            la["sinks"]) for la in layers]
    assert got == expected
    nope = [la["options"] for la in layers if la["method"] == "nope"]
    assert nope in ([], [{"temperature_floor_scale": 256, "temperature_attn_scale": 0.1}])


@pytest.mark.parametrize("name", SHIPPED_LAYOUTS)
def test_an_edit_to_a_preset_never_changes_a_shipped_model(name, monkeypatch):
    """Loading reads the layers from config.json; the preset's code only expands a name when training starts."""
    from posviz.positions import POSITION_METHODS

    idx = _text(300)
    before = load_checkpoint(f"models/{name}")(idx).logits
    edited = [{"method": "rope", "options": {"base": 500.0}, "window": 7}]
    monkeypatch.setattr(POSITION_METHODS[name], "preset_layers", classmethod(lambda cls, shape: edited))
    assert tiny_model(name, n_layer=1).position.at_layer(0).options.base == 500.0  # the edit is in effect
    torch.testing.assert_close(load_checkpoint(f"models/{name}")(idx).logits, before, rtol=0, atol=0)


@pytest.mark.parametrize("name", SHIPPED_LAYOUTS)
def test_an_old_config_without_layers_still_loads_to_the_same_model(name, tmp_path):
    """Configs written before layouts were pinned store {}: the preset then expands at load, to the same model."""
    idx = _text(300)
    old = load_checkpoint(_with_options(tmp_path, name, lambda options: {}))
    torch.testing.assert_close(old(idx).logits, load_checkpoint(f"models/{name}")(idx).logits, rtol=0, atol=0)


def _set_layer(layer: int, key: str, value):
    def edit(options):
        options["layers"][layer]["options"][key] = value
        return options
    return edit


@pytest.mark.parametrize("name,layer,key,value", [
    ("local_global", 3, "base", 10_000.0),  # the global layer's θ = 1e6, read from config.json
    ("irope", 3, "temperature_floor_scale", 8192),  # the NoPE layer's floor scale: 256, not Llama 4's 8,192
])
def test_the_stored_global_theta_and_floor_scale_are_what_the_forward_pass_reads(name, layer, key, value, tmp_path):
    idx = _text(400)  # past 255, where the floor scale's first step falls
    shipped = load_checkpoint(f"models/{name}")(idx).logits
    changed = load_checkpoint(_with_options(tmp_path, name, _set_layer(layer, key, value)))(idx).logits
    assert (changed - shipped).abs().max() > 1e-3


def test_sinks_on_a_method_that_computes_its_own_weights_are_refused():
    with pytest.raises(ConfigError, match="stick_breaking.*cannot take sinks.*computes its own attention weights"):
        tiny_model("rope_sinks", position_options={"layers": [{"method": "stick_breaking", "sinks": True}]})
    assert tiny_model("rope_sinks", position_options={"layers": [{"method": "stick_breaking"}]})  # without: fine
