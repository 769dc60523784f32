"""The hybrids of 2025-26 (LFM2, Qwen3-Next, Qwen3.5) through posviz's model interface, checked against transformers'
own forward, and each recurrent or convolution layer's implied matrix against the layer's own output.

The tiny models of ``hf_tiny.HYBRIDS`` are saved as a hub repository holds them and opened with ``open_model``.
What a lab reads must equal transformers: the logits, the attention layers' maps (``output_attentions`` returns
those layers only), cached decoding with the cache transformers builds from the config's layer_types (a recurrent
layer's fixed-size state beside attention keys), and bits per byte past the context. A non-attention layer's map is
the matrix its output implies (``posviz.models.hf.mixers``): that matrix times the layer's values is the layer's
core output, captured from the running model, and with the layer's own norm, gate and projection its output.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

import hf_tiny
from posviz.labs.extrapolation import score_at_length
from posviz.models.hf import mixers
from posviz.models.interface import open_model
from test_transformers_model import _fresh_models, direct  # noqa: F401  (the autouse fixture: each test opens models anew)

HYBRIDS = list(hf_tiny.HYBRIDS)
TEXT = hf_tiny.training_text().encode()[:8000]
KINDS = {"lfm2": ["short convolution", "attention", "short convolution", "attention"],
         "qwen3_next": ["Gated DeltaNet (recurrent)"] * 3 + ["attention"],
         "qwen3_5": ["Gated DeltaNet (recurrent)"] * 3 + ["attention"],
         "granite4": ["Mamba-2 (recurrent)"] * 3 + ["attention"],
         "nemotron_h": ["Mamba-2 (recurrent)", "MLP (no token mixing)", "Mamba-2 (recurrent)", "attention"],
         "olmo_hybrid": ["Gated DeltaNet (recurrent)"] * 3 + ["attention"],
         "kimi_linear": ["Kimi Delta Attention (recurrent)"] * 3 + ["attention"],
         "deepseek_v3": ["attention"] * 4, "deepseek_v4": ["attention"] * 4, "llama4": ["attention"] * 4,
         "falcon_h1": ["attention"] * 4}
# what each layer does with positions, and the share of each head's q.k dimensions that turns
ROPE, NOPE = ("rope", 1.0), ("nope", 0.0)
LAYOUT = {"lfm2": [("short convolution", 0.0), ROPE] * 2,
          "qwen3_next": [("Gated DeltaNet (recurrent)", 0.0)] * 3 + [("rope", 0.25)],
          "qwen3_5": [("Gated DeltaNet (recurrent)", 0.0)] * 3 + [("rope", 0.25)],
          "granite4": [("Mamba-2 (recurrent)", 0.0)] * 3 + [NOPE],
          "nemotron_h": [("Mamba-2 (recurrent)", 0.0), ("MLP (no token mixing)", 0.0), ("Mamba-2 (recurrent)", 0.0), NOPE],
          "olmo_hybrid": [("Gated DeltaNet (recurrent)", 0.0)] * 3 + [NOPE],  # released: rope_theta None
          "kimi_linear": [("Kimi Delta Attention (recurrent)", 0.0)] * 3 + [NOPE],  # its MLA never rotates
          "deepseek_v3": [("rope", 8 / 24)] * 4,  # MLA: 8 rotated of 16 + 8 q.k dimensions
          "deepseek_v4": [("rope", 4 / 32)] * 4,  # keys equal to values: 4 of each head's 32 dimensions rotate
          "llama4": [ROPE] * 3 + [NOPE],  # every fourth layer NoPE
          "falcon_h1": [ROPE] * 4}  # a Mamba-2 mixer beside the attention of every layer
# the picker's line: where its positions come from
DESCRIPTION = {"lfm2": " — RoPE on 2 of 4 layers, 2 short convolution, 64 tokens",
               "qwen3_next": " — RoPE on 1 of 4 layers, 3 Gated DeltaNet (recurrent), 64 tokens",
               "qwen3_5": " — RoPE on 1 of 4 layers, 3 Gated DeltaNet (recurrent), 64 tokens",
               "granite4": " — NoPE on 1 of 4 layers, 3 Mamba-2 (recurrent), 64 tokens",
               "nemotron_h": " — NoPE on 1 of 4 layers, 2 Mamba-2 (recurrent), 1 MLP (no token mixing), 64 tokens",
               "olmo_hybrid": " — NoPE on 1 of 4 layers, 3 Gated DeltaNet (recurrent), 64 tokens",
               "kimi_linear": " — NoPE on 1 of 4 layers, 3 Kimi Delta Attention (recurrent), 64 tokens",
               "deepseek_v3": " — RoPE (MLA: 8 of 24 q·k dims rotate), 64 tokens",
               "deepseek_v4": " — RoPE (window of 8 + compressed entries: CSA 1 per 4 on 2, HCA 1 per 16 on 1), 64 tokens",
               "llama4": " — RoPE (NoPE on 1 of 4 layers, chunks of 8 on the others), 64 tokens",
               "falcon_h1": " — RoPE (with Mamba-2 beside it in every layer), 64 tokens"}


def transformers_steps(folder, x: torch.Tensor) -> torch.Tensor:
    """transformers' own cached decoding of x, one id at a time, with the cache its config builds."""
    from transformers import DynamicCache

    net = direct(folder)
    cache = DynamicCache(config=net.config)
    with torch.no_grad():
        return torch.cat([net(x[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(x.shape[1])], 1)


# Families whose own cached decoding is not their full pass in transformers 5.25: posviz's decoding is compared with
# transformers' own (DeepSeek-V4's CSA indexer picks other entries when decoding: docs/published_models.md)
DECODES_APART = {"deepseek_v4": transformers_steps}
# Families with no layer that keeps every token's keys (DeepSeek-V4: its own window and compressed entries), whose
# cache posviz cannot evict to a window: the labs' cached-window strategies stop there in words
KEEPS_ITS_OWN_CACHE = {"deepseek_v4"}


def assert_opens_as_the_folder(model, folder) -> None:
    """A GGUF file's model against the folder it was written from: the same ids (the vocabulary and merges came
    through whole), the folder's logits in a full pass, and the full pass decoded one id at a time."""
    ids = model.encode(TEXT)
    assert torch.equal(ids, open_model(folder).encode(TEXT))
    T = 40
    x = ids[None, :T]
    with torch.no_grad():
        reference = direct(folder)(x).logits
    logits = model(x).logits
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)
    cache = model.new_cache()
    steps = torch.cat([model(x[:, t:t + 1], cache=cache).logits for t in range(T)], 1)
    torch.testing.assert_close(steps, logits, atol=1e-5, rtol=0)
    assert len(cache) == T and cache.next_position() == T


def eager_maps(folder, x) -> list[torch.Tensor]:
    """transformers' eager attention probabilities of each attention layer: ``output_attentions``, or where that returns
    none (Falcon-H1, whose attention runs beside a Mamba-2 mixer) each attention module's own second output."""
    net, kept = direct(folder, eager=True), {}
    with torch.no_grad():
        maps = net(x, output_attentions=True).attentions
        if maps:
            return list(maps)
        hooks = [layer.self_attn.register_forward_hook(lambda m, a, out, i=i: kept.update({i: out[1]}))
                 for i, layer in enumerate(net.model.layers)]
        net(x)
    for hook in hooks:
        hook.remove()
    return [kept[i] for i in sorted(kept)]


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_hybrid_lab_reads_what_transformers_computes(hf_family_dir, name):
    folder = hf_family_dir[name]
    model = open_model(folder)
    assert [model.layer_kind(i) for i in range(model.n_layer)] == KINDS[name]
    layout = model.layer_layout()
    assert [(row["position"], row["rotary share"]) for row in layout] == LAYOUT[name]
    assert model.description == DESCRIPTION[name]
    ids = model.encode(TEXT)
    T = 40
    x = ids[None, :T]
    with torch.no_grad():
        reference = direct(folder)(x).logits
    eager = eager_maps(folder, x)
    torch.testing.assert_close(model(x).logits, reference, atol=1e-5, rtol=0)
    attention_layers = [i for i, kind in enumerate(KINDS[name]) if kind == "attention"]
    assert len(eager) == len(attention_layers)  # transformers returns the attention layers' maps only
    every = model.attention_all_layers(x[0])
    assert every.shape == (model.n_layer, model.n_head, T, T)
    for layer in range(model.n_layer):
        mapped = model(x, attention_layer=layer)
        torch.testing.assert_close(mapped.logits, reference, atol=1e-5, rtol=0)
        reference_map = eager[attention_layers.index(layer)].float() if layer in attention_layers else None
        if reference_map is not None and reference_map.shape[-1] > T:
            # DeepSeek-V4: its compressed entries' columns follow the tokens'; each entry's weight lands on the tokens
            # it pools (test_deepseek_v4s_entries_are_drawn_on_the_tokens_they_pool), so each row keeps its sum
            spread = mapped.attention - reference_map[..., :T]
            assert spread.min() >= -1e-6 and reference_map[..., T:].sum() > 0.1
            torch.testing.assert_close(spread.sum(-1), reference_map[..., T:].sum(-1), atol=1e-5, rtol=0)
            assert not mapped.attention[0].triu(1).any()
        elif reference_map is not None:
            torch.testing.assert_close(mapped.attention, reference_map, atol=1e-5, rtol=0)
        else:  # causal: nothing above the diagonal
            assert not mapped.attention[0].triu(1).any()
        torch.testing.assert_close(every[layer], mapped.attention[0], atol=1e-6, rtol=0)
    # cached decoding, one id at a time: the recurrent state and the convolution's inputs carried by transformers' cache
    cache = model.new_cache()
    steps = torch.cat([model(x[:, t:t + 1], cache=cache).logits for t in range(T)], 1)
    torch.testing.assert_close(steps, DECODES_APART.get(name, lambda f, x: reference)(folder, x), atol=1e-5, rtol=0)
    assert len(cache) == T and cache.next_position() == T
    # a cache for maps: a recurrent layer's rows of 8 queries at a time reach back to the first token
    if KINDS[name][0] != "attention":  # a cache for maps: a recurrent layer's rows of 8 queries reach back to the first
        cache = model.new_cache(for_maps=True)
        rows = [model(x[:, t:t + 8], cache=cache, attention_layer=0).attention for t in range(0, T, 8)]
        assert [r.shape[-1] for r in rows] == [8, 16, 24, 32, 40]
        for i, r in enumerate(rows):
            torch.testing.assert_close(r[0], every[0][:, 8 * i:8 * (i + 1), :8 * (i + 1)], atol=1e-6, rtol=0)
    # bits per byte at twice its 64-token context: transformers' cross-entropy over the bytes its tokens cover
    L = 2 * hf_tiny.CONTEXT
    with torch.no_grad():
        logits = direct(folder)(ids[None, :L]).logits[0]
    bits = F.cross_entropy(logits, ids[1:L + 1], reduction="none") / math.log(2)
    covered = sum(len(model.decode([i])) for i in ids[1:L + 1].tolist())
    assert score_at_length(model, ids[:L + 1], L).bpb == pytest.approx(float(bits.sum()) / covered, abs=1e-5)


def _captured(net, module, inner):
    """Run net once, keeping ``module``'s input and output and what ``inner`` (a submodule of it) is called with."""
    seen = {}
    hooks = [module.register_forward_pre_hook(lambda m, a, k: seen.update(x=a[0] if a else k["hidden_states"]),
                                              with_kwargs=True),
             module.register_forward_hook(lambda m, a, out: seen.update(out=out)),
             inner.register_forward_pre_hook(lambda m, a: seen.update(inner=a))]
    try:
        with torch.no_grad():
            net(torch.tensor(list(hf_tiny.training_text().encode()[:48]))[None])  # bytes as ids: all in the vocabulary
    finally:
        for hook in hooks:
            hook.remove()
    return seen


@pytest.mark.parametrize("name, parts, norm, out", [
    ("qwen3_next", mixers.gated_deltanet_parts_qwen3_next, "norm", "out_proj"),
    ("qwen3_5", mixers.gated_deltanet_parts_qwen3_5, "norm", "out_proj"),
    ("olmo_hybrid", mixers.gated_deltanet_parts_olmo_hybrid, "o_norm", "o_proj")])
def test_a_gated_deltanet_layers_implied_matrix_times_its_values_is_its_output(hf_family_dir, name, parts, norm, out):
    net = direct(hf_family_dir[name])
    for layer in range(3):
        module = net.model.layers[layer].linear_attn
        norm_module, out_proj = getattr(module, norm), getattr(module, out)
        seen = _captured(net, module, norm_module)
        with torch.no_grad():
            q, k, v, g, beta = parts(module, seen["x"])
            w = mixers.delta_rule_matrix(q, k, g, beta)  # (B, Hv, T, T) float64
            ours = (w @ v.transpose(1, 2).double()).transpose(1, 2)  # (B, T, Hv, dv)
            core, z = seen["inner"]  # what the layer's norm receives: (B T Hv, dv) rows, and its gate
            torch.testing.assert_close(ours.reshape(core.shape).float(), core, atol=2e-6, rtol=1e-4)
            # with the layer's own norm, gate and projection: the layer's output
            output = out_proj(norm_module(ours.reshape(core.shape).float(), z).reshape(*v.shape[:2], -1))
            torch.testing.assert_close(output, seen["out"], atol=2e-6, rtol=1e-4)
            # a copy that pairs value heads with key heads as repeat() would, not repeat_interleave(), is not the layer
            # (Qwen3-Next's 4 value heads share 2 key heads, Qwen3.5's 8: heads 0, 1 the first key head's, not 0, 2)
            r = v.shape[2] // q.shape[2]
            assert r > 1
            wrong = mixers.delta_rule_matrix(q.repeat(1, 1, r, 1), k.repeat(1, 1, r, 1), g, beta)
            off = (wrong @ v.transpose(1, 2).double()).transpose(1, 2).reshape(core.shape).float() - core
            assert off.norm() > 0.1 * core.norm()


def test_a_kimi_delta_attention_layers_implied_matrix_times_its_values_is_its_output(hf_family_dir):
    net = direct(hf_family_dir["kimi_linear"])
    for layer in range(3):
        module = net.model.layers[layer].self_attn
        seen = _captured(net, module, module.o_norm)
        with torch.no_grad():
            q, k, v, g, beta = mixers.kda_parts_kimi(module, seen["x"])
            assert g.shape == k.shape  # a decay per key channel, not per head
            ours = (mixers.kda_matrix(q, k, g, beta) @ v.transpose(1, 2).double()).transpose(1, 2)
            core, gate = seen["inner"]
            torch.testing.assert_close(ours.reshape(core.shape).float(), core, atol=2e-6, rtol=1e-4)
            # a copy that decays each head by its channels' mean, as Gated DeltaNet's one scalar, is not the layer
            flat = g.mean(-1, keepdim=True).expand_as(g)
            off = (mixers.kda_matrix(q, k, flat, beta) @ v.transpose(1, 2).double()).transpose(1, 2).reshape(core.shape) - core
            assert off.norm() > 0.1 * core.norm()


@pytest.mark.parametrize("name", ["granite4", "nemotron_h"])
def test_a_mamba2_layers_implied_matrix_times_its_values_is_its_output(hf_family_dir, name):
    net = direct(hf_family_dir[name])
    for layer in (0, 2):
        layers = net.model.layers[layer]
        module = layers.mamba if name == "granite4" else layers.mixer
        seen = _captured(net, module, module.norm)
        with torch.no_grad():
            values, Bm, Cm, dt, A, D = mixers.mamba2_parts(module, seen["x"])
            w = mixers.ssd_matrix(Bm, Cm, dt, A, D)  # (b, H, T, T) float64
            ours = (w @ values.transpose(1, 2).double()).transpose(1, 2).reshape(*values.shape[:2], -1).float()
            scan, gate = seen["inner"]  # what the layer's gated norm receives: the scan's output (its D skip in)
            torch.testing.assert_close(ours, scan, atol=2e-6, rtol=1e-4)
            torch.testing.assert_close(module.out_proj(module.norm(ours, gate)), seen["out"], atol=2e-6, rtol=1e-4)
            # a copy that leaves out dt_s (the discretisation of B) is not the layer
            wrong = mixers.ssd_matrix(Bm, Cm, dt, A, D) / dt.double().permute(0, 2, 1)[:, :, None, :]
            off = (wrong @ values.transpose(1, 2).double()).transpose(1, 2).reshape(*values.shape[:2], -1).float() - scan
            assert off.norm() > 0.1 * scan.norm()


def test_a_short_convolutions_implied_matrix_times_its_values_is_its_output(hf_family_dir):
    net = direct(hf_family_dir["lfm2"])
    for layer in (0, 2):
        module = net.model.layers[layer].conv
        seen = _captured(net, module, module.out_proj)
        with torch.no_grad():
            w, values = mixers.short_conv_channels_lfm2(module, seen["x"])  # (B, C, T, T), (B, C, T)
            ours = (w @ values[..., None])[..., 0].transpose(1, 2)  # (B, T, C)
            torch.testing.assert_close(ours, seen["inner"][0], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(module.out_proj(ours), seen["out"], atol=1e-6, rtol=1e-5)
            K = module.conv.kernel_size[0]
            assert not w[0].tril(-K).any() and w[0].diagonal(-(K - 1), -2, -1).any()  # a band: K tokens, itself included
            # the kernel read the other way round (tap 0 on the current token) is not the layer
            flipped = w.clone()
            flipped.zero_()
            kernel = module.conv.weight[:, 0, :]
            b, c, _ = module.in_proj(seen["x"]).transpose(-1, -2).chunk(3, dim=-2)
            T = values.shape[-1]
            for d in range(K):
                idx = torch.arange(d, T)
                flipped[..., idx, idx - d] = c[..., idx] * kernel[:, d, None] * b[..., idx - d]
            off = (flipped @ values[..., None])[..., 0].transpose(1, 2) - seen["inner"][0]
            assert off.norm() > 0.1 * seen["inner"][0].norm()


@pytest.mark.parametrize("name", HYBRIDS)
def test_every_lab_runs_on_each_hybrid(hf_family_dir, name):
    """Each lab's own functions, past the 64-token context where the lab goes there: finite numbers, every cache
    strategy (a window evicts attention keys; the recurrent state follows the text), the first-token share of its
    attention layers only, a recurrent layer's map drawn as its implied matrix."""
    from posviz.labs import attention_maps, compare, extrapolation, key_value, kv_cache, probes
    from posviz.labs import generation as g

    model = open_model(hf_family_dir[name])
    text = TEXT[:6000]
    ids = model.encode(text)
    L = model.train_length
    with g.one_thread():
        for length in (L // 2, L, 2 * L):
            assert math.isfinite(extrapolation.score_at_length(model, ids, length).bpb)
        for layer in range(model.n_layer):
            view = attention_maps.attention_view(model, ids, 48, layer=layer)
            assert view.kind == KINDS[name][layer]
        lengths = compare.compare_lengths(model, ids, L)
        assert math.isfinite(lengths["bpb_long"]) and math.isfinite(lengths["bpb_short"])
        for strategy in kv_cache.STRATEGIES:
            # DeepSeek-V4: a window past its own (8 keys) and one within it are refused alike
            for window in (16, 6) if name in KEEPS_ITS_OWN_CACHE else (16,):
                r = kv_cache.sliding_score(model, ids, window, strategy, 40)
                if name in KEEPS_ITS_OWN_CACHE and strategy != "reencode":  # a window to evict: refused in words
                    assert r.bpb is None and "posviz cannot evict its cache to a window of" in r.error, strategy
                    assert math.isnan(r.ms_per_byte)  # no step of its own ran: no speed to show
                    continue
                assert r.error is None and math.isfinite(r.bpb), strategy
        shares = kv_cache.first_id_share(model, ids, n_ids=80, from_query=32)
        attending = [i for i, kind in enumerate(KINDS[name]) if kind == "attention"]
        assert sorted({r["layer"] for r in shares}) == attending and all(0 <= r["share"] <= 1 for r in shares)
        probes.repeat_probe(model, text, [0, 16], chunk=8, chunks=2)
        key_value.key_value_probe(model, text, [16], trials=2)
        for strategy in ("stop", "streaming"):
            written = g.generate(model, model.encode(b"def add(a, b):\n").tolist(), g.DecodeSettings(L + 8, strategy=strategy))
            if name in KEEPS_ITS_OWN_CACHE and strategy == "streaming":
                assert "posviz cannot evict its cache" in written.error and len(written.ids) < L + 8
                continue
            assert written.error is None and len(written.ids) == L + 8, strategy


def test_the_extrapolation_lab_shows_a_hybrids_recurrent_layer_as_implied(tiny_models, hf_family_dir, monkeypatch):
    """A visitor picks Qwen3-Next beside a checkpoint: the picker says where its positions are, its score is the
    lab's own, and its Gated DeltaNet layer's map is captioned as an implied matrix, its attention layer's not."""
    from test_pages_labs import metrics, page, run, texts

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("POSVIZ_ALLOW_ANY_MODEL", raising=False)
    folder = hf_family_dir["qwen3_next"]
    monkeypatch.setenv("POSVIZ_MODELS", str(folder))
    at = run(page("extrapolation", models="rope,qwen3_next", M="1"))
    assert "qwen3_next — RoPE on 1 of 4 layers, 3 Gated DeltaNet (recurrent), 64 tokens" in at.multiselect(key="w_models").options
    model = open_model(folder)
    from posviz.labs import inputs as lab_inputs
    from posviz.training.data import load_corpus

    doc = lab_inputs.prepare_text(load_corpus().eval_documents[0]).as_bytes()
    assert metrics(at)["qwen3_next"] == f"{score_at_length(model, model.encode(doc), 64).bpb:.3f}"
    at.selectbox(key="w_inspect").set_value("qwen3_next")
    at.selectbox(key="w_layer").set_value(0)
    run(at)
    assert "Layer 0 of qwen3\\_next is a Gated DeltaNet (recurrent) layer" in texts(at.caption)  # quoted for Markdown
    assert "**Implied matrix (Gated DeltaNet (recurrent)) of qwen3\\_next, layer 0" in texts(at.markdown)
    at.selectbox(key="w_layer").set_value(3)
    run(at)
    assert "Gated DeltaNet (recurrent) layer" not in texts(at.caption)


def test_the_kv_cache_lab_says_what_each_layers_cache_keeps(tiny_models, hf_family_dir, monkeypatch):
    """Nemotron-H beside the shipped rope: per run of layers, what the cache keeps and whether it grows."""
    from test_pages_labs import page, run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = hf_family_dir["nemotron_h"]
    monkeypatch.setenv("POSVIZ_MODELS", str(folder))
    rows = open_model(folder).cache_rows()
    assert [(r["layers"], r["grows"]) for r in rows] == [([0], False), ([1], False), ([2], False), ([3], True)]
    assert "fixed-size state per head" in rows[0]["holds"] and rows[1]["holds"] == "nothing"
    at = run(page("kv_cache", models="rope,nemotron_h", W="16", n="40"))
    table = next(d.value for d in at.main.dataframe if "its cache keeps" in d.value.columns)
    mine = table[table["model"] == "nemotron_h"]
    assert list(mine["layers"]) == ["0", "1", "2", "3"] and list(mine["grows with the text"]) == ["no", "no", "no", "yes"]
    assert list(mine["layer kind"]) == KINDS["nemotron_h"]
    assert list(table[table["model"] != "nemotron_h"]["grows with the text"]) == ["yes"]  # rope: 2 attention layers, one run


@pytest.mark.parametrize("name, remaps", [("lfm2", "all"), ("qwen3_next", "all"), ("deepseek_v3", ("self_extend",)),
                                           ("llama4", ("self_extend", "dca")), ("falcon_h1", ("self_extend",))])
def test_each_remap_moves_a_hybrids_rotary_layers_only_and_decodes_alike(hf_family_dir, tmp_path, name, remaps):
    """As every rotary family (tests/test_published_remaps.py): under each remap, pairs within its near window keep
    their logits, farther ones move, and cached decoding (the recurrent state beside the remapped keys) equals the full
    pass; the non-attention layers are untouched: their implied matrices are the plain model's. Llama 4's rotary
    layers attend within chunks (8 tokens in the tiny model, closer than any remap's window, so nothing would move):
    its copy here has chunks of 256, the text's length."""
    from posviz.positions.rope_remaps import ROPE_REMAPS
    from test_published_remaps import NO_SCALE, near_window

    from posviz.labs.context_extension import layers_touched

    folder = hf_family_dir[name]
    if name == "llama4":
        folder = Path(shutil.copytree(folder, tmp_path / name))
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "attention_chunk_size": 256}))
    plain = open_model(folder, None, "cpu")
    assert plain.remaps == tuple(ROPE_REMAPS) and plain.remap_refusal is None
    assert layers_touched(plain) == {  # what the Context extension lab says beside the remaps
        "lfm2": "Only its rotary layers move (2 of 4: 1, 3); layers 0, 2 (short convolution) keep what they compute.",
        "qwen3_next": "Only its rotary layers move (1 of 4: 3); layers 0–2 (Gated DeltaNet (recurrent)) keep what they "
                      "compute.",
        "deepseek_v3": None,  # every layer rotates (8 of each head's 24 q.k dimensions)
        "llama4": "Only its rotary layers move (3 of 4: 0–2); layer 3 (NoPE) keeps what it computes.",
        "falcon_h1": None}[name]  # every layer's attention rotates (its Mamba-2 beside it keeps what it computes)
    L = plain.train_length
    ids = plain.encode(TEXT)[: 4 * L][None]
    base = plain(ids).logits
    first = plain(ids, attention_layer=0).attention
    # DeepSeek's MLA: Self-Extend (its rotated part only); Llama 4's adjacent pairs: two remaps; Falcon-H1: one
    for remap in ROPE_REMAPS if remaps == "all" else remaps:
        model = plain.with_position_options({"remap": remap, "factor": 4.0, "remap_options": NO_SCALE.get(remap, {})})
        near = near_window(remap, model.position_options["remap_options"])
        logits = model(ids).logits
        torch.testing.assert_close(logits[:, :near], base[:, :near], rtol=1e-4, atol=1e-4)
        assert (logits[:, near:] - base[:, near:]).abs().max() > 1e-4, remap
        if plain.layer_kind(0) != "attention":  # a recurrent layer keeps what it computes
            torch.testing.assert_close(model(ids, attention_layer=0).attention, first, rtol=0, atol=1e-6)
        cache = model.new_cache()
        T = 4 * L  # a prefill, a chunk of 5, then the last 16 one at a time
        steps = [model(ids[:, :T - 21], cache=cache).logits, model(ids[:, T - 21:T - 16], cache=cache).logits]
        steps += [model(ids[:, t:t + 1], cache=cache).logits for t in range(T - 16, T)]
        torch.testing.assert_close(torch.cat(steps, 1), logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen3_next", "deepseek_v3"])
def test_the_context_extension_lab_runs_self_extend_and_says_which_layers_it_moves(tiny_models, hf_family_dir,
                                                                                  monkeypatch, name):
    from test_pages_labs import page, run, texts

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = hf_family_dir[name]
    monkeypatch.setenv("POSVIZ_MODELS", str(folder))
    at = run(page("context_extension", base=name, scalings="self_extend", refs=""))
    assert not at.error, [e.value for e in at.error]
    remaps = next(d.value for d in at.main.dataframe if "parameters" in d.value.columns)
    assert list(remaps.iloc[:, 0]) == ["Self-Extend"]
    touched = ("qwen3\\_next: Only its rotary layers move (1 of 4: 3); layers 0–2 (Gated DeltaNet (recurrent)) keep what "
               "they compute.")
    assert (touched in texts(at.caption)) == (name == "qwen3_next")  # every DeepSeek layer rotates (a part of each head)


def test_a_vision_language_checkpoint_opens_as_its_text_model(tmp_path):
    """Qwen3.5 is published as a vision-language model (config model_type "qwen3_5", its text model in text_config):
    posviz opens its text model, whose logits are the whole model's on text alone."""
    import transformers
    from transformers import AutoModelForImageTextToText

    spec = hf_tiny.HYBRIDS["qwen3_5"]
    text_config = hf_tiny.family_config(spec).to_dict()
    config = transformers.Qwen3_5Config(text_config=text_config, vision_config=dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        whole = AutoModelForImageTextToText.from_config(config).eval()
    whole.save_pretrained(tmp_path)
    hf_tiny.make_tokenizer(tmp_path, model_max_length=spec.context)
    model = open_model(tmp_path)
    assert model.family_name == "qwen3_5_text" and model.layer_kind(0) == "Gated DeltaNet (recurrent)"
    ids = model.encode(TEXT)[None, :32]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, whole(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_an_lfm2_gguf_file_opens_and_gives_transformers_numbers(hf_family_dir, tmp_path):
    """LFM2 as llama.cpp keeps it: the tiny model written as an F32 GGUF file (``gguf_tiny``) opens through
    transformers' GGUF loader with its convolution and attention layers where they were, the same tokenizer, and
    the saved folder's logits, in a full pass and decoded one id at a time."""
    from gguf_tiny import save_lfm2_gguf

    folder = hf_family_dir["lfm2"]
    file = save_lfm2_gguf(folder, tmp_path / "tiny-lfm2.F32.gguf")
    model = open_model(str(file))
    assert [model.layer_kind(i) for i in range(model.n_layer)] == KINDS["lfm2"]
    assert model.weights_note.startswith("GGUF"), model.weights_note
    assert_opens_as_the_folder(model, folder)


def test_a_short_convolutions_drawn_map_is_its_channels_mean_per_group(hf_family_dir):
    """The map drawn per group of channels, built band by band, is the mean of the channels' exact matrices."""
    net = direct(hf_family_dir["lfm2"])
    module = net.model.layers[0].conv
    seen = _captured(net, module, module.out_proj)
    with torch.no_grad():
        w, _ = mixers.short_conv_channels_lfm2(module, seen["x"])
        drawn = mixers.short_conv_lfm2(module, seen["x"], 4)
    torch.testing.assert_close(drawn, w.reshape(1, 4, -1, *w.shape[-2:]).mean(2), atol=1e-7, rtol=1e-5)


def test_a_recurrent_layers_map_is_refused_past_the_memory_cap(hf_family_dir, monkeypatch):
    """Its implied matrix is (heads, T, T) of float64 over every token since the first: held to the same cap as an
    attention map (POSVIZ_MAX_WORK_BYTES), refused in words before any work."""
    from posviz.errors import PosvizError

    model = open_model(hf_family_dir["qwen3_5"])  # 8 value heads: more than its 4 attention heads
    ids = model.encode(TEXT)[None, :64]
    assert model.work_bytes(64, implied=True) == 24 * 8 * 64 * 64
    monkeypatch.setenv("POSVIZ_MAX_WORK_BYTES", str(24 * 8 * 64 * 64 - 1))
    model(ids, attention_layer=3)  # the attention layer's map is within it
    with pytest.raises(PosvizError, match="POSVIZ_MAX_WORK_BYTES"):
        model(ids, attention_layer=0)


def test_a_qwen35_gguf_file_opens_and_gives_transformers_numbers(hf_family_dir, tmp_path):
    """Qwen3.5 as llama.cpp keeps it (architecture "qwen35", which transformers reads through its newer GGUF loader,
    ``transformers.integrations.gguf``): the tiny text model written as an F32 GGUF file (``gguf_tiny``) opens with
    its Gated DeltaNet and attention layers where they were, the same tokenizer, and the saved folder's logits, in a
    full pass and decoded one id at a time."""
    from gguf_tiny import save_qwen35_gguf

    folder = hf_family_dir["qwen3_5"]
    file = save_qwen35_gguf(folder, tmp_path / "tiny-qwen35.F32.gguf")
    model = open_model(str(file))
    assert model.family_name == "qwen3_5_text"
    assert [model.layer_kind(i) for i in range(model.n_layer)] == KINDS["qwen3_5"]
    assert model.weights_note.startswith("GGUF"), model.weights_note
    assert_opens_as_the_folder(model, folder)


def test_a_gguf_architecture_neither_transformers_loader_reads_is_refused_naming_it(tmp_path):
    """Both of transformers' GGUF loaders count: "qwen35" (the newer one only) and "llama" (the legacy one) are
    read, "qwen3next" (neither, though posviz reads Qwen3-Next folders) is refused in the words a "mamba" file is."""
    import numpy as np
    from gguf import GGUFWriter

    from posviz.models.hf import gguf

    def header(architecture):
        path = tmp_path / f"{architecture}.gguf"
        writer = GGUFWriter(str(path), architecture)
        writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return gguf.read_header(path)

    assert gguf.readable_architectures()["qwen35"] == "qwen3_5_text"
    gguf.check(header("qwen35"))
    gguf.check(header("llama"))
    with pytest.raises(Exception, match=r"'qwen3next' GGUF model: posviz opens GGUF files of .*llama.*qwen35"):
        gguf.check(header("qwen3next"))


def test_llama4s_adjacent_pairs_are_what_the_remap_attention_rotates(hf_family_dir, monkeypatch):
    """Llama 4 rotates features (2i, 2i + 1) together (complex ``freqs_cis``): the probe finds its remap attention equal
    to the plain pass with that pairing, and a copy that rotates the halves instead (as every cos/sin family) moves the
    logits by far more than the probe's tolerance."""
    from posviz.models.hf import probes
    from posviz.models.hf import remaps as hf_remaps

    config = hf_tiny.family_config("llama4")
    gap, moved = probes.measure_remap_gap(config)
    assert gap <= probes.SAME_LOGITS and moved > probes.MOVED_LOGITS
    monkeypatch.setattr(hf_remaps, "_half_split", lambda x: x)  # the pairs as they come: halves rotated
    broken, _ = probes.measure_remap_gap(config)
    assert broken > 0.1


def test_deepseek_v4s_entries_are_drawn_on_the_tokens_they_pool(hf_family_dir):
    """Each compressed entry of DeepSeek-V4's CSA and HCA layers, before its norm and rotation, is its tokens' kv
    weighted by posviz's shares, per channel (captured from transformers' compressor as the model runs); the same
    shares one window off do not reproduce it. The map gives each entry's weight to its tokens by their mean share."""
    folder = hf_family_dir["deepseek_v4"]
    net = direct(folder)
    for layer, m in ((1, 4), (2, 16)):  # CSA: 2m slots over two windows; HCA: m slots
        attention = net.model.layers[layer].self_attn
        seen = _captured(net, attention, attention.compressor.kv_norm)
        compressor, inputs, inner = attention.compressor, seen["x"].double(), seen["inner"][0].double()
        shares, offset = mixers.pooling_shares(compressor, seen["x"])
        kv = compressor.kv_proj(seen["x"]).double()  # (B, T, d or 2d)
        d, E = compressor.head_dim, shares.shape[1]
        slots = kv.new_zeros(shares.shape)  # each entry's slots: the kv of the tokens they pool
        for w in range(E):
            if offset:  # CSA: the first half of the channels of window w - 1, the second of window w
                if w:
                    slots[:, w, :m] = kv[:, (w - 1) * m:w * m, :d]
                slots[:, w, m:] = kv[:, w * m:(w + 1) * m, d:]
            else:
                slots[:, w] = kv[:, w * m:(w + 1) * m]
        entries = (shares * slots).sum(2)
        torch.testing.assert_close(entries, inner, atol=1e-5, rtol=0)
        off_by_one = (shares[:, 1:] * slots[:, :-1]).sum(2)
        assert (off_by_one - inner[:, 1:]).abs().max() > 1e-2
        # as a matrix: entry w's slot j lands on token w * m - offset + j, and nowhere else
        pooled = mixers.compressed_pooling(compressor, seen["x"])
        assert pooled.shape == (1, E, inputs.shape[1])
        mean = shares.mean(-1)
        expected = torch.zeros_like(pooled)
        for w in range(E):
            for j in range(shares.shape[2]):
                if 0 <= w * m - offset + j:
                    expected[:, w, w * m - offset + j] = mean[:, w, j]
        torch.testing.assert_close(pooled, expected, atol=0, rtol=0)
        torch.testing.assert_close(pooled.sum(-1), torch.ones(1, E, dtype=torch.float64))
        # the fold puts each entry's weight where the matrix says: random weights on window keys and entries
        T_all = inputs.shape[1]
        probs = torch.rand(1, 2, 3, 5 + E, dtype=torch.float32)
        folded = mixers.fold_compressed(attention, seen["x"], probs)
        by_matrix = torch.einsum("bhte,bes->bhts", probs[..., 5:].double(), pooled)
        by_matrix[..., T_all - 5:] += probs[..., :5].double()
        torch.testing.assert_close(folded.double(), by_matrix, atol=1e-6, rtol=0)


def test_a_deepseek_v4_map_of_a_cached_pass_is_the_full_pass_rows(hf_family_dir):
    """Chunks of 3 (shorter than any compressed block: no entry yet), 5, 9 and 23 tokens through a cache for maps: each
    chunk's rows of every layer equal those rows of the full pass's map (its window keys and entries in the cache)."""
    model = open_model(hf_family_dir["deepseek_v4"])
    x = model.encode(TEXT)[None, :40]
    every = model.attention_all_layers(x[0])
    for layer in range(model.n_layer):
        cache, start = model.new_cache(for_maps=True), 0
        for size in (3, 5, 9, 23):
            rows = model(x[:, start:start + size], cache=cache, attention_layer=layer).attention[0]
            assert rows.shape == (model.n_head, size, start + size)
            torch.testing.assert_close(rows, every[layer][:, start:start + size, :start + size], atol=1e-5, rtol=0)
            start += size
    short = model(x[:, :3], attention_layer=2).attention  # HCA blocks of 16: no entry at 3 tokens
    assert short.shape == (1, model.n_head, 3, 3) and not short[0].triu(1).any()


@pytest.mark.parametrize("index_topk, apart", [(64, False), (4, True)])
def test_transformers_own_deepseek_v4_decoding_parts_from_its_full_pass_where_its_indexer_selects(index_topk, apart):
    """transformers 5.25's DeepSeek-V4, all layers CSA (entries of 4 tokens), decoded one token at a time: equal to its
    full pass where the indexer keeps every entry (40 tokens: at most 10), apart where it picks 4 of them. Why posviz's
    decoding of it is compared with transformers' own (DECODES_APART): a release where they agree fails this test."""
    from transformers import DynamicCache

    config = hf_tiny.family_config("deepseek_v4")
    config.layer_types, config.index_topk = ["compressed_sparse_attention"] * 4, index_topk
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for p in net.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, p.shape[-1] ** -0.5)
    x = torch.tensor(list(hf_tiny.training_text().encode()[:40]))[None] % config.vocab_size
    cache = DynamicCache(config=net.config)
    with torch.no_grad():
        full = net(x).logits
        steps = torch.cat([net(x[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(40)], 1)
    assert ((steps - full).abs().max() > 1e-2) == apart


def test_deepseek_v4_is_refused_the_remaps_and_scalings_in_words(hf_family_dir):
    """Its values are its keys (rotated, turned back after attention) and it turns with two RoPE bases: the remaps
    and the scalings are refused with the reason, before any work."""
    from posviz.errors import PosvizError

    model = open_model(hf_family_dir["deepseek_v4"], None, "cpu")
    assert model.remaps == () and model.remap_refusal.startswith("its values are its keys")
    with pytest.raises(PosvizError, match="cannot take the self_extend remap: its values are its keys"):
        model.with_position_options({"remap": "self_extend"})
    with pytest.raises(PosvizError, match="2 RoPE bases"):
        model.with_position_options({"scaling": "yarn", "factor": 4.0})
    # a map's cost counts its compressed entries (one per 4 keys at the most) and the map over tokens it is folded into
    assert model.work_bytes(64, 64, attention_map=True) == 4 * (model.n_head * 64 * (64 + 16) * 4)


def test_falcon_h1s_mamba2_beside_its_attention_is_drawn_as_its_implied_matrix(hf_family_dir):
    """Falcon-H1's Mamba-2 mixer (its muP multipliers in: input and projection scaled) as a matrix times its values is
    the scan's output, and with its gate and out_proj the mixer's; a copy without the multipliers is not. The model
    draws it beside each layer's attention (``beside_map``) from its own pass, heads as the attention's."""
    folder = hf_family_dir["falcon_h1"]
    net = direct(folder)
    module = net.model.layers[1].mamba
    seen = _captured(net, module, module.out_proj)
    with torch.no_grad():
        values, Bm, Cm, dt, A, D = mixers.mamba2_parts(module, seen["x"])
        w = mixers.ssd_matrix(Bm, Cm, dt, A, D)
        ours = (w @ values.transpose(1, 2).double()).transpose(1, 2).reshape(*values.shape[:2], -1).float()
        gate = (module.in_proj(seen["x"] * module.ssm_in_multiplier) * module.mup_vector)[..., :module.intermediate_size]
        gated = module.norm(ours, gate) if module.mamba_rms_norm else ours * F.silu(gate)
        torch.testing.assert_close(gated, seen["inner"][0], atol=2e-6, rtol=1e-4)
        torch.testing.assert_close(module.out_proj(gated), seen["out"], atol=2e-6, rtol=1e-4)
        bare = copy.copy(module)  # the same mixer with its multipliers at one
        bare._buffers = {**module._buffers, "mup_vector": torch.ones_like(module.mup_vector)}
        bare.ssm_in_multiplier = 1.0
        values, Bm, Cm, dt, A, D = mixers.mamba2_parts(bare, seen["x"])
        plain = (mixers.ssd_matrix(Bm, Cm, dt, A, D) @ values.transpose(1, 2).double()).transpose(1, 2)
        off = plain.reshape(*values.shape[:2], -1).float() * F.silu(gate) - seen["inner"][0]
        assert off.norm() > 0.1 * seen["inner"][0].norm()
    model = open_model(folder)
    assert model.beside_kind(1) == "Mamba-2 (recurrent)" and open_model(hf_family_dir["qwen3_next"]).beside_kind(3) is None
    ids = model.encode(TEXT)[:40]
    drawn = model.beside_map(ids, 1)
    assert drawn.shape == (model.n_head, 40, 40) and not drawn.triu(1).any()
    with torch.no_grad():
        inputs = {}
        hook = net.model.layers[1].mamba.register_forward_pre_hook(
            lambda m, a, k: inputs.update(x=a[0] if a else k["hidden_states"]), with_kwargs=True)
        net(ids[None], position_ids=torch.arange(40)[None])
        hook.remove()
        _v, Bm, Cm, dt, A, D = mixers.mamba2_parts(net.model.layers[1].mamba, inputs["x"])
        assert net.model.layers[1].mamba.num_heads == model.n_head  # one Mamba-2 head per attention head here
        torch.testing.assert_close(drawn, mixers.ssd_matrix(Bm, Cm, dt, A, D)[0].float(), atol=1e-6, rtol=0)


def test_the_extrapolation_lab_draws_falcon_h1s_mamba2_beside_its_attention(tiny_models, hf_family_dir, monkeypatch):
    """A visitor inspects Falcon-H1: under its layer's attention map, the Mamba-2 mixer beside it, labelled as its
    implied matrix, each head a map; a model with one mixer per layer (the shipped rope) shows none."""
    from test_pages_labs import page, run, texts

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("POSVIZ_ALLOW_ANY_MODEL", raising=False)
    monkeypatch.setenv("POSVIZ_MODELS", str(hf_family_dir["falcon_h1"]))
    at = run(page("extrapolation", models="rope,falcon_h1", M="1"))
    assert "beside the attention" not in texts(at.markdown)
    at.selectbox(key="w_inspect").set_value("falcon_h1")
    run(at)
    at.selectbox(key="w_layer").set_value(2)
    run(at)
    assert not at.exception and not at.error
    assert "**Implied matrix (Mamba-2 (recurrent)) beside the attention of falcon\\_h1, layer 2" in texts(at.markdown)
    assert "Layer 2 runs a Mamba-2 (recurrent) mixer beside its attention on the same input" in texts(at.caption)
    assert "**Attention of falcon\\_h1, layer 2" in texts(at.markdown)


def test_a_hybrid_is_measured_past_its_context_and_listed_on_the_scoreboard(hf_family_dir, corpus, tmp_path, monkeypatch):
    """``posviz_tools.measure_published`` on a tiny Qwen3-Next as on any published model: its bits per byte at 1x and 2x
    (the lab's own scores), Self-Extend on its rotary layer, its effective length; the scoreboard lists it from the file."""
    from posviz.labs import scoreboard
    from posviz.labs.published_results import read_results
    from posviz.training.evaluate import published_eval_table
    from posviz_tools import measure_published

    monkeypatch.setenv("POSVIZ_PUBLISHED_RESULTS", str(tmp_path / "published"))
    folder = str(hf_family_dir["qwen3_next"])
    assert measure_published.main(["--model", folder, "--multiples", "1", "2", "--remaps", "self_extend",
                                   "--effective", "as_trained", "--trials", "1", "--threads", "1"]) == 0
    record = read_results(folder)
    model = open_model(folder, None, "cpu")
    ids = model.encode(corpus.eval_stream(8 * (record["eval_ids"])).tobytes())[:record["eval_ids"]]
    assert record["eval"]["nonoverlapping_bpb"] == published_eval_table(model, ids, [64, 128], progress=False)
    assert set(record["eval"]["rope_remaps"]) == {"self_extend"}
    assert set(record["eval"]["effective_length"]["as_trained"]["rows"]) == {"1", "2"}
    rows = scoreboard.shown_rows(scoreboard.published_rows([folder], open_model))
    plain = next(r for r in rows if r["checkpoint"] == "qwen3_next")
    assert plain["bpb 1×"] == f"{record['eval']['nonoverlapping_bpb']['64']:.3f}" and plain["kind"] == "published"
