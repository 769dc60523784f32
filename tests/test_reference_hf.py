"""Every position formula of posviz checked against Hugging Face transformers (a test-only dependency).

transformers is an independent implementation written for real models (T5, BLOOM, Llama, GPT-NeoX,
GPT-2), so agreement here means our formulas are the published ones, not just self-consistent.
Written against transformers 5.x: RoPE settings live in ``config.rope_parameters`` and the scalings
in ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``.
"""
from __future__ import annotations


import math

import pytest
import torch
from transformers import GPT2LMHeadModel, GPTNeoXConfig, LlamaConfig, T5Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply_rotary_pos_emb
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply_rotary_pos_emb
from transformers.models.llama.modeling_llama import rotate_half as llama_rotate_half
from transformers.models.t5.modeling_t5 import T5Attention

from conftest import tiny_model
from posviz.models.export import export_gpt2
from posviz.errors import PosvizError
from posviz.positions import ModelShape, build_position_method
from posviz.positions.alibi import alibi_bias, alibi_slopes
from posviz.positions.rope import RopeOptions, apply_rotary, rope_cos_sin, rotary_dim, rotate_half
from posviz.positions.rope_scaling import ROPE_SCALINGS
from posviz.positions.t5 import t5_bucket

# ----------------------------------------------------------------------------------------------- T5

T5_SETTINGS = [(32, 128), (16, 64), (64, 256), (8, 20), (32, 40)]


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("num_buckets,max_distance", T5_SETTINGS)
def test_t5_buckets_match_hf(num_buckets, max_distance, bidirectional):
    # every relative position from far in the past to far in the future, past max_distance both ways
    relative = torch.arange(-3 * max_distance, 3 * max_distance + 1)[None, :] + torch.arange(0, 3)[:, None]
    ours = t5_bucket(relative, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, theirs)
    # the grid reaches every bucket (bidirectional: "0 steps into the future" is not a thing)
    expected = set(range(num_buckets)) - ({num_buckets // 2} if bidirectional else set())
    assert set(torch.unique(ours).tolist()) == expected


def test_t5_bias_of_the_method_matches_hf_decoder_compute_bias():
    """The method's (1, H, Tq, Tk) bias equals T5's decoder self-attention bias with the same table,
    including for a query block that continues after cached keys (past_seen_tokens)."""
    shape = ModelShape(n_layer=2, n_head=4, head_dim=8, n_embd=32, train_length=64)
    ours = build_position_method("t5", shape, {"num_buckets": 16, "max_distance": 40})
    torch.manual_seed(0)
    torch.nn.init.normal_(ours.bucket_bias.weight)
    config = T5Config(d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=16,
                      relative_attention_max_distance=40, is_decoder=True, dropout_rate=0.0)
    theirs = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    theirs.relative_attention_bias.weight.data.copy_(ours.bucket_bias.weight.data)
    q = torch.zeros(1, 4, 1, 8)
    with torch.no_grad():
        for past, Tq in [(0, 100), (90, 10)]:
            q_pos, k_pos = torch.arange(past, past + Tq), torch.arange(0, past + Tq)
            mine = ours.logit_bias(0, q.expand(1, 4, Tq, 8), q_pos, k_pos)
            ref = theirs.compute_bias(Tq, past + Tq, past_seen_tokens=past)
            visible = q_pos[:, None] >= k_pos[None, :]  # only the causal part is ever used
            assert mine.shape == ref.shape == (1, 4, Tq, past + Tq)
            assert torch.equal(mine[..., visible], ref[..., visible])


# ---------------------------------------------------------------------------------------------- ALiBi

@pytest.mark.parametrize("n_heads", [6, 8, 12, 16])
def test_alibi_slopes_and_bias_rows_match_bloom(n_heads):
    T = 20
    mask = torch.ones(1, T, dtype=torch.long)
    bloom = build_alibi_tensor(mask, n_heads, torch.float32).view(n_heads, T)  # (H, Tk): slope_h * key position
    slopes = alibi_slopes(n_heads)
    # BLOOM's value for key 1 is exactly the slope
    torch.testing.assert_close(slopes, bloom[:, 1], rtol=1e-6, atol=0)
    assert torch.all(slopes[:-1] > 0) and len(set(slopes.tolist())) == n_heads  # distinct, positive

    pos = torch.arange(T)
    ours = alibi_bias(slopes, pos, pos)  # (H, Tq, Tk) = -slope * (q - k)
    # BLOOM adds slope * k to every query row; ours adds slope * k - slope * q: the same row up to a
    # per-row constant, which softmax ignores.
    shifted = ours + slopes[:, None, None] * pos[None, :, None]
    torch.testing.assert_close(shifted, bloom[:, None, :].expand(n_heads, T, T), rtol=1e-5, atol=1e-5)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    p_ours = ours.masked_fill(~causal, float("-inf")).softmax(-1)
    p_bloom = bloom[:, None, :].expand(n_heads, T, T).masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(p_ours, p_bloom, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------- RoPE

def test_rotate_half_and_apply_rotary_match_llama():
    torch.manual_seed(0)
    B, H, T, hs = 2, 3, 17, 16
    q, k = torch.randn(B, H, T, hs), torch.randn(B, H, T, hs)
    pos = torch.arange(5, 5 + T)
    inv_freq = ROPE_SCALINGS["none"](hs, RopeOptions(), T)[0]
    cos, sin = rope_cos_sin(pos, inv_freq)  # (T, hs)
    assert torch.equal(rotate_half(q), llama_rotate_half(q))
    q_ref, k_ref = llama_apply_rotary_pos_emb(q, k, cos[None].expand(B, T, hs), sin[None].expand(B, T, hs))
    torch.testing.assert_close(apply_rotary(q, cos, sin), q_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(apply_rotary(k, cos, sin), k_ref, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(q_ref, q, atol=1e-2)  # the rotation did something


def test_cos_sin_match_llama_rotary_embedding():
    head_dim, T = 32, 300
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=512,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    pos = torch.arange(T)
    cos_ref, sin_ref = LlamaRotaryEmbedding(config)(torch.zeros(1, T, head_dim), pos[None])
    cos, sin = rope_cos_sin(pos, ROPE_SCALINGS["none"](head_dim, RopeOptions(), T)[0])
    # HF multiplies positions by float32 frequencies; angles reach 300 rad, so allow float32 rounding of them
    torch.testing.assert_close(cos, cos_ref[0], rtol=0, atol=1e-4)
    torch.testing.assert_close(sin, sin_ref[0], rtol=0, atol=1e-4)


# (scaling, our options, HF rope_parameters). For linear, yarn and llama3 the HF config says
# max_position_embeddings = factor * original and gives original_max_position_embeddings explicitly,
# so no HF default can step in. HF's "dynamic" has no separate original length: it reads
# max_position_embeddings *as* the trained length, so there it is set to the original length.
ORIGINAL = 256
SCALING_CASES = [
    ("linear", {"factor": 4.0}, {"rope_type": "linear", "factor": 4.0}),
    ("linear", {"factor": 2.5, "base": 500000.0}, {"rope_type": "linear", "factor": 2.5}),
    ("yarn", {"factor": 4.0}, {"rope_type": "yarn", "factor": 4.0}),
    ("yarn", {"factor": 16.0, "beta_fast": 16.0, "beta_slow": 2.0},
     {"rope_type": "yarn", "factor": 16.0, "beta_fast": 16.0, "beta_slow": 2.0}),
    ("yarn", {"factor": 8.0, "attention_factor": 1.5}, {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.5}),
    ("llama3", {"factor": 8.0}, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("llama3", {"factor": 4.0, "base": 500000.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
     {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0}),
]


def _hf_config(hf_params: dict, base: float, factor: float, head_dim: int = 32) -> LlamaConfig:
    params = {"rope_theta": base, **hf_params}
    if params["rope_type"] in ("yarn", "llama3"):
        params["original_max_position_embeddings"] = ORIGINAL
    return LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                       max_position_embeddings=int(factor * ORIGINAL), rope_parameters=params)


@pytest.mark.parametrize("name,ours,theirs", SCALING_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(SCALING_CASES)])
def test_scaled_inverse_frequencies_match_hf(name, ours, theirs):
    head_dim = 32
    opts = RopeOptions(scaling=name, original_length=ORIGINAL, **ours)
    config = _hf_config(dict(theirs), opts.base, opts.factor, head_dim)
    for seq_len in (ORIGINAL // 2, ORIGINAL, 3 * ORIGINAL):  # static scalings ignore the length
        inv_freq, attention = ROPE_SCALINGS[name](head_dim, opts, seq_len)
        inv_ref, attention_ref = ROPE_INIT_FUNCTIONS[name](config, "cpu", seq_len)
        torch.testing.assert_close(inv_freq.float(), inv_ref.float(), rtol=2e-6, atol=0)
        assert attention == pytest.approx(attention_ref, rel=1e-12)
    base_freq = ROPE_SCALINGS["none"](head_dim, opts, ORIGINAL)[0]
    assert not torch.allclose(inv_freq, base_freq)  # the case really scales something
    if name == "llama3":  # the three llama3 regions are all present in the case
        ratio = base_freq / inv_freq
        assert (ratio == 1).any() and torch.isclose(ratio, torch.tensor(opts.factor, dtype=ratio.dtype)).any()
        assert ((ratio > 1.001) & (ratio < opts.factor - 0.001)).any()


@pytest.mark.parametrize("factor,attention", [(4.0, None), (16.0, None), (8.0, 1.3)])
def test_longrope_with_given_factors_matches_hf(factor, attention):
    """Phi-3's LongRoPE: per-pair short factors up to the original length, long ones past it, and the attention
    factor sqrt(1 + ln s / ln L) (or the one given), as transformers' ``"longrope"`` computes them."""
    head_dim, pairs = 32, 16
    rng = torch.Generator().manual_seed(int(factor))
    long = (1 + (factor - 1) * torch.rand(pairs, generator=rng).sort().values).tolist()  # increasing, as searched ones
    short = (1 + 0.2 * torch.rand(pairs, generator=rng)).tolist()
    opts = RopeOptions(scaling="longrope", factor=factor, original_length=ORIGINAL, long_factor=long,
                       short_factor=short, attention_factor=attention)
    params = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": long, "short_factor": short,
              "original_max_position_embeddings": ORIGINAL, **({"attention_factor": attention} if attention else {})}
    config = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                         max_position_embeddings=int(factor * ORIGINAL), rope_parameters=params)
    for seq_len in (ORIGINAL // 2, ORIGINAL, ORIGINAL + 1, 3 * ORIGINAL):
        inv_freq, att = ROPE_SCALINGS["longrope"](head_dim, opts, seq_len)
        inv_ref, att_ref = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len)
        torch.testing.assert_close(inv_freq.float(), inv_ref.float(), rtol=2e-6, atol=0)
        assert att == pytest.approx(att_ref, rel=1e-12)
    # past the original length the long factors act: the slowest pair turns `long[-1]` times slower
    base = ROPE_SCALINGS["none"](head_dim, opts, ORIGINAL)[0]
    assert float(base[-1] / inv_freq[-1]) == pytest.approx(long[-1], rel=1e-9)


def test_longrope_without_factors_takes_yarn_ratios_and_rejects_a_wrong_count():
    opts = RopeOptions(scaling="longrope", factor=8.0, original_length=ORIGINAL)
    below, _ = ROPE_SCALINGS["longrope"](32, opts, ORIGINAL)
    above, att = ROPE_SCALINGS["longrope"](32, opts, 4 * ORIGINAL)
    torch.testing.assert_close(below, ROPE_SCALINGS["none"](32, opts, ORIGINAL)[0])
    torch.testing.assert_close(above, ROPE_SCALINGS["yarn"](32, opts, 4 * ORIGINAL)[0])
    assert att == pytest.approx((1 + math.log(8) / math.log(ORIGINAL)) ** 0.5)
    with pytest.raises(ValueError, match="one factor per rotary pair"):
        ROPE_SCALINGS["longrope"](32, RopeOptions(scaling="longrope", factor=2.0, original_length=ORIGINAL,
                                                    long_factor=[1.0, 2.0]), 1000)


def test_default_frequencies_match_hf():
    config = GPTNeoXConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=ORIGINAL,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.5})
    inv_ref, attention_ref = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(config)
    rot = rotary_dim(32, 0.5)
    inv_freq, attention = ROPE_SCALINGS["none"](rot, RopeOptions(rotary_fraction=0.5), ORIGINAL)
    assert inv_freq.shape == inv_ref.shape == (8,)
    torch.testing.assert_close(inv_freq.float(), inv_ref, rtol=2e-6, atol=0)
    assert attention == attention_ref == 1.0


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_dynamic_ntk_matches_hf_at_every_length(factor):
    head_dim = 32
    opts = RopeOptions(scaling="dynamic", factor=factor, original_length=ORIGINAL)
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=ORIGINAL,
                         rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": factor})
    seen = []
    for seq_len in (1, ORIGINAL // 2, ORIGINAL, ORIGINAL + 1, 2 * ORIGINAL, 5 * ORIGINAL + 3):
        inv_freq, _ = ROPE_SCALINGS["dynamic"](head_dim, opts, seq_len)
        inv_ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len)
        torch.testing.assert_close(inv_freq.float(), inv_ref, rtol=5e-6, atol=0)
        seen.append(inv_freq[-1].item())
    assert seen[0] == seen[2] and seen[-1] < seen[3] < seen[2]  # unchanged up to L, then slower and slower


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_static_ntk_equals_hf_dynamic_at_the_length_where_its_ratio_is_the_factor(factor):
    # Our "ntk" raises the base by factor^(d/(d-2)) once and for all. HF has no static NTK twin, but
    # its "dynamic" raises the base by r^(d/(d-2)) with r = factor * seq_len / L - (factor - 1):
    # r equals factor exactly when seq_len = L * (2 * factor - 1) / factor, so at that length the two
    # must give the same frequencies. (Config as for dynamic: max_position_embeddings is L.)
    head_dim = 32
    seq_len = ORIGINAL * (2 * factor - 1) / factor
    assert seq_len == int(seq_len)
    opts = RopeOptions(scaling="ntk", factor=factor, original_length=ORIGINAL)
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=ORIGINAL,
                         rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": factor})
    inv_freq, attention = ROPE_SCALINGS["ntk"](head_dim, opts, ORIGINAL)
    inv_ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", int(seq_len))
    torch.testing.assert_close(inv_freq.float(), inv_ref, rtol=5e-6, atol=0)
    assert attention == 1.0
    base_freq = ROPE_SCALINGS["none"](head_dim, opts, ORIGINAL)[0]
    # the slowest pair is slowed by exactly the factor, the fastest is untouched
    assert base_freq[-1] / inv_freq[-1] == pytest.approx(factor, rel=1e-9)
    assert inv_freq[0] == base_freq[0]


NEOX_CASES = [
    ("none", {}, {"rope_type": "default"}, ORIGINAL),
    ("linear", {"factor": 4.0}, {"rope_type": "linear", "factor": 4.0}, 4 * ORIGINAL),
    ("dynamic", {"factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}, ORIGINAL),
    ("yarn", {"factor": 4.0}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
     4 * ORIGINAL),
    ("llama3", {"factor": 8.0},
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": ORIGINAL}, 8 * ORIGINAL),
]


@pytest.mark.parametrize("name,ours,theirs,max_positions", NEOX_CASES, ids=[c[0] for c in NEOX_CASES])
def test_rotary_method_end_to_end_matches_gpt_neox(name, ours, theirs, max_positions):
    """The Rotary method (partial rotation, scaling, attention factor) rotates q and k exactly like
    GPT-NeoX's rotary embedding + apply_rotary_pos_emb, past the original length too."""
    head_dim, n_head, T = 32, 2, 3 * ORIGINAL
    shape = ModelShape(n_layer=1, n_head=n_head, head_dim=head_dim, n_embd=n_head * head_dim, train_length=ORIGINAL)
    method = build_position_method("rope", shape, {"scaling": name, "rotary_fraction": 0.5, **ours})
    config = GPTNeoXConfig(hidden_size=n_head * head_dim, num_attention_heads=n_head,
                           max_position_embeddings=max_positions,
                           rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5, **theirs})
    rotary = GPTNeoXRotaryEmbedding(config)
    torch.manual_seed(0)
    q, k = torch.randn(1, n_head, T, head_dim), torch.randn(1, n_head, T, head_dim)
    pos = torch.arange(T)
    cos, sin = rotary(q, pos[None])  # (1, T, rot)
    q_ref, k_ref = neox_apply_rotary_pos_emb(q, k, cos, sin)
    q_ours, k_ours = method.rotate_qk(q, k, pos)
    # float32 angles in HF reach 768 rad: compare to the rounding of those angles
    torch.testing.assert_close(q_ours, q_ref, rtol=0, atol=5e-4)
    torch.testing.assert_close(k_ours, k_ref, rtol=0, atol=5e-4)
    assert torch.equal(q_ours[..., 16:], q[..., 16:])  # half the head passes through unrotated


# --------------------------------------------------------------------------------------- GPT-2 export

def test_learned_model_exports_to_hf_gpt2_with_identical_logits(tmp_path):
    model = tiny_model("learned", seed=3)
    with torch.no_grad():  # move away from the near-zero init so every weight matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    folder = export_gpt2(model, tmp_path / "gpt2")
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    hf = GPT2LMHeadModel.from_pretrained(str(folder), local_files_only=True).eval()
    assert hf.config.n_positions == model.config.train_length
    idx = torch.randint(0, 256, (3, model.config.train_length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(idx).logits, hf(idx).logits
    assert ours.abs().max() > 1.0  # logits are not trivially small
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def test_export_refuses_methods_gpt2_cannot_represent(tmp_path):
    with pytest.raises(PosvizError, match="only the 'learned' method"):
        export_gpt2(tiny_model("rope"), tmp_path / "rope")
    assert not (tmp_path / "rope").exists()
