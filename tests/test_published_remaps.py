"""The five training-free RoPE remaps on published models (``posviz/models/hf/remaps.py``).

* **Equal on our own export**: ``models/hf/rope-neox`` (the shipped rope exported to GPT-NeoX, run by
  transformers' own forward) under each remap gives the shipped rope's logits under the same remap to 1e-4 at
  4x and 16x, and its bits per byte to 1e-3; on third-party code (transformers' own source, read where it is
  installed), under Self-Extend its 4x stays within 10 % of its 1x, as the shipped rope's does.
* **The rotation is transformers'**: the attention function, given unrotated q and k and a remap that keeps
  every pair at its own position, equals each family's own eager attention on q and k rotated by the family's own
  ``apply_rotary_pos_emb`` (GPT-OSS's sink logits and Gemma 2's soft-cap included), and scores a NoPE layer
  (SmolLM3's) plainly.
* **Every rotary family's tiny model**: a remap changes nothing inside its near window, runs past the context,
  and decodes with a KV cache exactly as the full pass; a sliding-window layer keeps its window. Falcon's rotary
  models too, where the installed transformers routes their attention through its interface (5.25 does, 5.24 did
  not), and a refusal in words where it does not: whether a family takes the remaps is measured on the installed
  library (``posviz/models/hf/probes.py``), checked here against the family's source and against the family's
  own forward.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import transformers
from posviz.errors import PosvizError
from posviz.labs import generation as g
from posviz.models.hf import remaps as hf_remaps
from posviz.models.interface import open_model
from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.training.evaluate import published_eval_table
from tests.hf_tiny import FAMILIES as TINY, Family, _save, family_config

ROOT = Path(__file__).resolve().parent.parent
EXPORT = ROOT / "models" / "hf" / "rope-neox"
ROTARY_FAMILIES = ("neox", "llama3", "llama_yarn", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3", "falcon_rope")
CONTEXT = 64  # the tiny families' trained context (tests/hf_tiny.py); llama_yarn and phi3 state 128


@pytest.fixture(autouse=True)
def single_thread():
    with g.one_thread():  # tiny models: a second intra-op thread costs more than it saves
        yield


@pytest.fixture(scope="module")
def rotary_dirs(hf_family_dir, tmp_path_factory):
    """The tiny rotary families' folders, and Falcon's rotary arrangement (the tiny Falcon with alibi=False)."""
    spec = TINY["falcon"]
    falcon_rope = _save(Family(spec.config_class, {**spec.kwargs, "alibi": False}, "rope", seed=spec.seed),
                        tmp_path_factory.mktemp("falcon-rope"))
    return lambda family: falcon_rope if family == "falcon_rope" else hf_family_dir[family]


def falcon_uses_the_interface() -> bool:
    """An independent reading of the installed library: Falcon's modeling source hands attention to transformers'
    attention interface (5.25) or does not (5.24)."""
    import inspect

    from transformers.models.falcon import modeling_falcon

    return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(modeling_falcon)


@pytest.fixture(scope="module")
def source_code(corpus) -> bytes:
    return bytes(corpus.validation[: 1 << 13])


# ------------------------------------------------------------------------------------------------
# Equal on our own export
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("remap", list(ROPE_REMAPS))
def test_our_export_under_each_remap_equals_the_shipped_rope_under_it(remap, source_code):
    for factor in (4, 16):
        shipped = open_model("rope", {"remap": remap, "factor": float(factor)}, "cpu")
        export = open_model(str(EXPORT), {"remap": remap, "factor": float(factor)}, "cpu")
        # the same defaults rule as the checkpoints': covering factor x the trained context
        assert export.position_options["remap_options"] == ROPE_REMAPS[remap].settings(None, 256, factor * 256)
        n = factor * 256
        ids = shipped.encode(source_code)[:n + 1][None]
        assert ids.shape[1] == n + 1
        a, b = shipped(ids[:, :n]).logits, export(ids[:, :n]).logits
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4)
        # bits per byte of the window (one byte an id): the mean cross-entropy of the next byte, in bits
        bits = [float(F.cross_entropy(x[0], ids[0, 1:])) / math.log(2) for x in (a, b)]
        assert bits[1] == pytest.approx(bits[0], abs=1e-3)
    assert export.name == "rope-neox+" + remap and export.acts_on == "pairs"


def test_on_third_party_code_self_extend_keeps_4x_within_10_percent_of_1x_on_our_export_as_on_the_shipped_rope():
    # transformers' own generation code: Apache-2.0 Python, read where it is installed, never in the corpus
    text = (Path(transformers.__file__).parent / "generation" / "utils.py").read_bytes()[: 1 << 13]
    scores = {}
    for ref in ("rope", str(EXPORT)):
        plain, extended = open_model(ref, None, "cpu"), open_model(ref, {"remap": "self_extend", "factor": 4.0}, "cpu")
        ids = plain.encode(text)
        one = published_eval_table(plain, ids, [256, 1024], progress=False)
        four = published_eval_table(extended, ids, [1024], progress=False)["1024"]
        assert one["1024"] > 1.3 * one["256"]  # plain RoPE breaks at 4x: the remap has something to fix
        assert four <= 1.10 * one["256"]  # ... and Self-Extend keeps 4x within 10 % of 1x (lower is better)
        scores[ref] = (one["256"], four)
    assert scores[str(EXPORT)] == pytest.approx(scores["rope"], abs=1e-3)


# ------------------------------------------------------------------------------------------------
# The attention function against each family's own rotation and eager attention
# ------------------------------------------------------------------------------------------------
def _module(layer_idx=0, use_rope=True, H=4, Hkv=2):
    module = torch.nn.Module()
    module.layer_idx, module.use_rope, module.num_key_value_groups = layer_idx, use_rope, H // Hkv
    return module.eval()


def _run(T, inv_freq, remap="self_extend", options=None, probs=False):
    """A pass whose remap keeps every pair at its own position (Self-Extend with a window past the text)."""
    remap = ROPE_REMAPS[remap]
    return hf_remaps.RemapPass(remap, remap.build(options or {"window": 4 * T, "group": 2}, 2 * T, 2 * T), 2 * T,
                               {None: (inv_freq.double(), 1.0)}, None, torch.arange(T), torch.arange(T),
                               frozenset({0}) if probs else frozenset())


@pytest.mark.parametrize("family,extra", [("llama", {}), ("gemma2", {"softcap": 7.0}), ("gpt_oss", {"sinks": True}),
                                          ("gpt_neox", {"partial": 8})])
def test_the_attention_function_equals_each_familys_own_rotation_and_eager_attention(family, extra):
    module_name = f"transformers.models.{family}.modeling_{family}"
    modeling = __import__(module_name, fromlist=["x"])
    torch.manual_seed(0)
    B, H, Hkv, T, D = 1, 4, 2 if family != "gpt_neox" else 4, 24, 16
    rot = extra.get("partial", D)
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None]
    # the family's own cos/sin layout: GPT-OSS keeps one angle per pair, the others repeat them for both halves
    emb = angles if family == "gpt_oss" else torch.cat((angles, angles), dim=-1)
    qr, kr = modeling.apply_rotary_pos_emb(q, k, emb.cos()[None], emb.sin()[None])
    module = _module(H=H, Hkv=Hkv)
    kwargs = {}
    if "softcap" in extra:
        kwargs["softcap"] = extra["softcap"]
    if extra.get("sinks"):
        module.sinks = torch.nn.Parameter(torch.randn(H))
        kwargs["s_aux"] = module.sinks
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    additive = torch.zeros(1, 1, T, T).masked_fill(~mask, float("-inf"))
    want, want_probs = modeling.eager_attention_forward(module, qr, kr, v, additive, scaling=D ** -0.5, **kwargs)
    with hf_remaps.pass_positions(_run(T, inv_freq, probs=True)):
        got, probs = hf_remaps.remap_attention(module, q, k, v, mask, scaling=D ** -0.5, **kwargs)
        unmasked, _ = hf_remaps.remap_attention(module, q, k, v, None, scaling=D ** -0.5, **kwargs)  # causal alone
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(unmasked, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(probs, want_probs, rtol=1e-5, atol=1e-5)


def test_a_layer_without_rotation_is_scored_plainly_and_a_far_pair_is_scored_at_its_remapped_distance():
    from transformers.models.llama import modeling_llama

    torch.manual_seed(1)
    T, D = 40, 16
    q, k, v = torch.randn(1, 4, T, D), torch.randn(1, 2, T, D), torch.randn(1, 2, T, D)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    additive = torch.zeros(1, 1, T, T).masked_fill(~mask, float("-inf"))
    nope = _module(use_rope=False)
    want, _ = modeling_llama.eager_attention_forward(nope, q, k, v, additive, scaling=0.25)  # unrotated q and k
    rerope = _run(T, inv_freq, "rerope", {"window": 8, "log_scale": False})
    with hf_remaps.pass_positions(rerope):
        got, _ = hf_remaps.remap_attention(nope, q, k, v, mask, scaling=0.25)
        _, probs = hf_remaps.remap_attention(_module(), q, k, v, mask, scaling=0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert probs is None  # the pass asked for no map
    # ReRoPE reading, loop by loop: pair (i, j) is rotated at distance min(i - j, w), the query at i or w, the key at j or 0
    rerope.probs_for = frozenset({0})
    with hf_remaps.pass_positions(rerope):
        _, probs = hf_remaps.remap_attention(_module(), q, k, v, mask, scaling=0.25)
    kk = k.repeat_interleave(2, dim=1)
    for h, i in ((0, 39), (3, 20)):
        logits = []
        for j in range(i + 1):
            qi, kj = (i, j) if i - j < 8 else (8, 0)
            a = torch.tensor([float(qi)])[:, None] * inv_freq.double()[None]
            b = torch.tensor([float(kj)])[:, None] * inv_freq.double()[None]
            rq = _rotate(q[0, h, i].double(), a[0])
            rk = _rotate(kk[0, h, j].double(), b[0])
            logits.append(float(rq @ rk) * 0.25)
        torch.testing.assert_close(probs[0, h, i, :i + 1].double(), torch.tensor(logits, dtype=torch.float64).softmax(-1), rtol=1e-5, atol=1e-6)


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX's half-split rotation of one vector: pair (x[i], x[i + d/2]) turned by angles[i]."""
    h = x.numel() // 2
    x1, x2 = x[:h], x[h:]
    return torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()))


# ------------------------------------------------------------------------------------------------
# Every rotary family's tiny model
# ------------------------------------------------------------------------------------------------
# The global logit scales a remap applies (STRING's 0.1 ln 2 + 1, DCA's chunkllama scale past the context)
# multiply every logit, near pairs' too; turned off here, so that the near window's positions alone are compared.
NO_SCALE = {"string": {"attention_factor": 1.0}, "dca": {"scale": "chunkqwen_attn_replace"}}


def near_window(remap: str, options: dict) -> int:
    """Pairs closer than this keep their own positions under the remap (its options resolved)."""
    return {"self_extend": lambda o: o["window"], "rerope": lambda o: o["window"], "leaky_rerope": lambda o: o["window"],
            "dca": lambda o: o["chunk_size"] - o["local_window"], "string": lambda o: o["shift"]}[remap](options)


@pytest.mark.parametrize("family", ROTARY_FAMILIES)
def test_each_remap_on_each_rotary_family_keeps_its_near_window_runs_past_the_context_and_decodes_alike(
        family, rotary_dirs, source_code):
    plain = open_model(rotary_dirs(family), None, "cpu")
    if family == "falcon_rope" and not falcon_uses_the_interface():  # transformers 5.24 and before: refused in words
        assert plain.remaps == () and "attention interface" in plain.remap_refusal
        with pytest.raises(PosvizError, match="cannot take the dca remap: transformers .*'s falcon attention"):
            plain.with_position_options({"remap": "dca"})
        return
    assert plain.remaps == tuple(ROPE_REMAPS) and plain.remap_refusal is None
    L = plain.train_length
    ids = plain.encode(source_code)[: 4 * L][None]
    base = plain(ids).logits
    for remap in ROPE_REMAPS:
        model = plain.with_position_options({"remap": remap, "factor": 4.0,
                                             "remap_options": NO_SCALE.get(remap, {})})
        near = near_window(remap, model.position_options["remap_options"])
        logits = model(ids).logits
        assert torch.isfinite(logits).all()
        torch.testing.assert_close(logits[:, :near], base[:, :near], rtol=1e-4, atol=1e-4)  # nothing moved in there
        assert (logits[:, near:] - base[:, near:]).abs().max() > 1e-4  # far pairs moved, past the context too
        # cached decoding: a prefill of half, a chunk of 5, then one token at a time, equals the full pass
        cache = model.new_cache()
        steps = [model(ids[:, :2 * L], cache=cache).logits, model(ids[:, 2 * L:2 * L + 5], cache=cache).logits]
        steps += [model(ids[:, t:t + 1], cache=cache).logits for t in range(2 * L + 5, 4 * L)]
        torch.testing.assert_close(torch.cat(steps, 1), logits, rtol=1e-4, atol=1e-4)


def test_a_sliding_window_layer_keeps_its_window_under_a_remap(hf_family_dir, source_code):
    model = open_model(hf_family_dir["gemma2"], {"remap": "self_extend", "factor": 4.0}, "cpu")
    ids = model.encode(source_code)[:200][None]
    window = model.config.sliding_window
    sliding = [row["layer"] for row in model.layer_layout() if row["window"]]
    full = [row["layer"] for row in model.layer_layout() if not row["window"]]
    assert sliding and full
    probs = model(ids, attention_layer=sliding[0]).attention[0]  # (H, T, T)
    i, j = torch.meshgrid(torch.arange(200), torch.arange(200), indexing="ij")
    assert float(probs[:, (i - j) >= window].abs().max()) == 0.0 and float(probs[:, i < j].abs().max()) == 0.0
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:2]))
    far = model(ids, attention_layer=full[0]).attention[0]
    assert float(far[:, (i - j) >= window].sum()) > 0  # the full layer reaches past the window
    every = model.attention_all_layers(ids[0])
    torch.testing.assert_close(every[sliding[0]], probs)


def test_a_family_takes_the_remaps_exactly_where_its_attention_goes_through_the_interface():
    """posviz's probe (a small model of the family, run plainly and as a remap runs it) against an independent
    reading of the installed library's source: a rotary family whose attention is handed to transformers' attention
    interface takes the remaps, one whose attention is its own (GPT-NeoX-Japanese's, Falcon's before 5.25) is
    refused in words, with the logit difference that refused it."""
    import inspect

    from transformers import FalconConfig, GPTNeoXJapaneseConfig
    from transformers.models.gpt_neox_japanese import modeling_gpt_neox_japanese

    from posviz.models.hf import probes

    japanese = GPTNeoXJapaneseConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
                                     intermediate_multiple_size=2)
    refusal = probes.measured(japanese, "rope").remap_refusal
    if "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(modeling_gpt_neox_japanese):
        assert refusal is None
    else:
        assert "does not go through its attention interface" in refusal and "changed its logits by" in refusal
        assert f"transformers {transformers.__version__}'s gpt_neox_japanese" in refusal
    falcon = FalconConfig(**{**TINY["falcon"].kwargs, "alibi": False})
    assert (probes.measured(falcon, "rope").remap_refusal is None) == falcon_uses_the_interface()
    # what the probe compares moves: without posviz's attention, the identity rotation changes the logits
    gap, moved = probes.measure_remap_gap(family_config("qwen2"))
    assert gap <= probes.SAME_LOGITS < probes.MOVED_LOGITS < moved


def test_a_model_whose_attention_cannot_take_a_remap_says_so_in_words(hf_family_dir):
    with pytest.raises(PosvizError, match="rotary models only"):
        open_model(hf_family_dir["bloom"], {"remap": "rerope"}, "cpu")
    with pytest.raises(PosvizError, match="Unknown RoPE remap 'nope'"):
        open_model(hf_family_dir["qwen2"], {"remap": "nope"}, "cpu")
    with pytest.raises(PosvizError, match="scaling or a remap, not both"):
        open_model(hf_family_dir["qwen2"], {"remap": "rerope", "scaling": "yarn", "factor": 4.0}, "cpu")
    with pytest.raises(PosvizError, match="self_extend's group must be a positive integer"):
        open_model(hf_family_dir["qwen2"], {"remap": "self_extend", "remap_options": {"group": 0}}, "cpu")
    assert family_config("qwen2").model_type == "qwen2"
    # a factor given later resolves the remap's defaults anew (the CLI's and the labs' way: remap, then each length's)
    later = open_model(hf_family_dir["qwen2"], {"remap": "self_extend"}, "cpu").with_position_options({"factor": 4.0})
    direct = open_model(hf_family_dir["qwen2"], {"remap": "self_extend", "factor": 4.0}, "cpu")
    assert later.position_options == direct.position_options
    assert later.position_options["remap_options"] == ROPE_REMAPS["self_extend"].settings(None, 64, 256)


@pytest.mark.parametrize("remap", list(ROPE_REMAPS))
def test_the_merged_softmax_equals_the_whole_blocks_softmax_under_each_remap(remap):
    """The fast path (each map's span on its own, merged as flash attention merges blocks) against the block's
    whole scores and one softmax, with GQA, a sliding-window mask, Gemma 2's soft-cap and GPT-OSS's sink logits,
    over more than one block of queries (300 > 256)."""
    torch.manual_seed(2)
    T, D, L = 300, 16, 64
    q, k, v = torch.randn(1, 4, T, D), torch.randn(1, 2, T, D), torch.randn(1, 2, T, D)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for mask in (None, ((j <= i) & (i - j < 40))[None, None]):
        for extra in ({}, {"softcap": 3.0}, {"s_aux": torch.randn(4)}):
            spec = ROPE_REMAPS[remap]
            run = hf_remaps.RemapPass(spec, spec.build(None, L, 4 * L), L, {None: (inv_freq, 1.0)}, None,
                                      torch.arange(T), torch.arange(T))
            with hf_remaps.pass_positions(run):
                fast, none = hf_remaps.remap_attention(_module(), q, k, v, mask, scaling=0.3, **extra)
                run.probs_for = frozenset({0})
                whole, probs = hf_remaps.remap_attention(_module(), q, k, v, mask, scaling=0.3, **extra)
            assert none is None and probs.shape == (1, 4, T, T)
            torch.testing.assert_close(fast, whole, rtol=1e-5, atol=1e-5)
