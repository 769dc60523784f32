"""The position methods of 2026's open models against transformers' own modules, in float64 (forward and gradients):
gated attention against ``Qwen3NextAttention`` (its gate from ``q_proj``), NoPE's temperature against
``Llama4TextAttention``'s query scale. Each check also runs a deliberately broken copy, which must fail it."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from posviz.config import ModelConfig
from posviz.models.attention import CausalSelfAttention
from posviz.models.byte_gpt import GPT
from posviz.models.kv_cache import KVCache
from posviz.positions import ModelShape, build_position_method
from posviz.positions.rope import rope_cos_sin

H, HS, C, T = 3, 16, 48, 9


def _same_output_and_input_grads(want: torch.Tensor, run, x: torch.Tensor, atol: float) -> None:
    """``run(x')`` on a fresh copy x' of the reference's input ``x`` equals ``want`` (the reference's output on
    ``x``), and the gradients of the same loss (the squared sum) reach x and x' alike; both graphs are kept for
    the parameters' gradients a caller compares next."""
    x2 = x.detach().clone().requires_grad_(True)
    got = run(x2)
    torch.testing.assert_close(got, want, rtol=0, atol=atol)
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=0, atol=atol)


def _qwen3_next_attention():
    """transformers' Qwen3NextAttention at posviz's attention: full rotation (partial_rotary_factor 1), q and k not
    normed (the RMSNorms replaced by identities: posviz's RoPE has none, and they are not the gate)."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    config = Qwen3NextConfig(hidden_size=C, num_attention_heads=H, num_key_value_heads=H, head_dim=HS,
                             partial_rotary_factor=1.0, attention_bias=False, num_hidden_layers=4,
                             layer_types=["full_attention"] * 4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = "eager"
    attention = Qwen3NextAttention(config, layer_idx=3).double()
    attention.q_norm, attention.k_norm = nn.Identity(), nn.Identity()
    return attention, Qwen3NextRotaryEmbedding(config).double()


def _posviz_copy(reference):
    """posviz's attention with the gated_attention method, holding the reference's weights: q_proj's rows are each
    head's query then its gate (``view(..., -1, 2 hs)``, ``chunk(2)``)."""
    shape = ModelShape(n_layer=4, n_head=H, head_dim=HS, n_embd=C, train_length=64)
    method = build_position_method("gated_attention", shape).double()
    attention = CausalSelfAttention(ModelConfig(n_layer=4, n_head=H, n_embd=C, train_length=64,
                                                position="gated_attention")).double()
    rows = reference.q_proj.weight.detach().view(H, 2, HS, C)
    with torch.no_grad():
        attention.c_attn.weight.copy_(torch.cat((rows[:, 0].reshape(C, C), reference.k_proj.weight, reference.v_proj.weight)))
        attention.c_attn.bias.zero_()
        attention.c_proj.weight.copy_(reference.o_proj.weight)
        attention.c_proj.bias.zero_()
        method.gate_proj[3].weight.copy_(rows[:, 1].reshape(C, C))
    return attention, method


def test_gated_attention_equals_qwen3_next_attention_in_float64():
    torch.manual_seed(0)
    reference, _ = _qwen3_next_attention()
    attention, method = _posviz_copy(reference)
    x = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(T)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    # RoPE's cos and sin in float64 for both (transformers' rotary module computes them in float32): the angles are
    # RoPE's, checked against transformers in tests/test_rope.py; here the gate is what is compared
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS)
    angles = torch.cat([positions[:, None].double() * inv_freq] * 2, dim=-1)[None]  # (1, T, hs)
    want, _ = reference(x, (angles.cos(), angles.sin()), mask)
    # posviz's RoPE turns by angles computed in float32 (as transformers' rotary module does): 1e-7
    _same_output_and_input_grads(want, lambda x2: attention(x2, positions, method, 3, None, False, {})[0], x, 1e-7)
    gate_rows = reference.q_proj.weight.grad.view(H, 2, HS, C)[:, 1].reshape(C, C)
    torch.testing.assert_close(method.gate_proj[3].weight.grad, gate_rows, rtol=0, atol=1e-7)
    # a broken copy (the gate without its sigmoid) fails the same check
    broken = lambda layer, h: method.gate_proj[layer](h).view(*h.shape[:2], H, HS).transpose(1, 2)  # noqa: E731
    method.output_gate = broken
    with torch.no_grad():
        wrong, _ = attention(x, positions, method, 3, None, False, {})
    assert (wrong - want).abs().max() > 1e-3


def test_gated_attention_owns_its_gate_and_decodes_from_a_cache_as_it_runs_whole():
    shape = ModelShape(n_layer=4, n_head=4, head_dim=32, n_embd=128, train_length=256)
    method = build_position_method("gated_attention", shape)
    # one projection per layer, initialised as the reference initialises q_proj (normal, std 0.02), no bias
    assert [p.weight.shape for p in method.gate_proj] == [(128, 128)] * 4 and all(p.bias is None for p in method.gate_proj)
    assert abs(float(method.gate_proj[0].weight.std()) - 0.02) < 0.002
    net = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=64, train_length=64, position="gated_attention")).eval()
    assert net.position.gate_proj[0].weight.std().item() == pytest.approx(0.02, abs=0.003)  # kept: not GPT-2's re-init
    ids = torch.randint(0, 256, (1, 70))
    with torch.no_grad():
        whole = net(ids).logits
        cache = KVCache(n_layer=2)
        steps = [net(ids[:, :30], cache=cache).logits] + [net(ids[:, t:t + 1], cache=cache).logits for t in range(30, 70)]
    torch.testing.assert_close(torch.cat(steps, 1), whole, rtol=0, atol=1e-5)


def _llama4_scale(position: int, floor_scale: int, attn_scale: float) -> float:
    """Llama4TextAttention's attn_scales, one position at a time: log1p(floor((cache_position + 1) / floor_scale))
    * attn_scale + 1."""
    return math.log1p(math.floor((position + 1.0) / floor_scale)) * attn_scale + 1.0


def test_nope_temperature_scales_the_queries_as_llama4_does():
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    method = build_position_method("nope_temperature", ModelShape(4, 4, 32, 128, 256)).double()
    assert method.pinned_options() == {"temperature_floor_scale": 8, "temperature_attn_scale": 0.1}
    positions = torch.tensor([0, 1, 6, 7, 8, 255, 256, 1000, 4095])
    q, k = torch.randn(1, 4, 9, 32, dtype=torch.float64), torch.randn(1, 4, 9, 32, dtype=torch.float64)
    got_q, got_k = method.rotate_qk(q, k, positions)
    want = torch.tensor([_llama4_scale(p, 8, 0.1) for p in positions.tolist()], dtype=torch.float64)
    # in float32, as Llama 4 computes it (cache_position.float()): 1e-7 of the float64 reading
    torch.testing.assert_close(got_q, q * want[:, None], rtol=1e-7, atol=0)
    assert got_k is k
    # transformers' own module: a NoPE layer (no_rope_layers 0) of a tiny Llama 4 with these two numbers, its queries
    # read from the q_proj it runs (a hook), against posviz's scale of the same queries
    config = Llama4TextConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                              intermediate_size=64, intermediate_size_mlp=64, num_hidden_layers=1, no_rope_layers=[0],
                              floor_scale=8, attn_scale=0.1, attn_temperature_tuning=True, use_qk_norm=False)
    config._attn_implementation = "eager"
    layer = Llama4TextAttention(config, layer_idx=0).double()
    captured = []
    from transformers.models.llama4 import modeling_llama4

    old = modeling_llama4.eager_attention_forward

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        captured.append(query.detach().clone())  # the queries as the layer attends with them, after its scale
        return old(module, query, key, value, attention_mask, scaling, dropout, **kwargs)

    from transformers import DynamicCache

    small = build_position_method("nope_temperature", ModelShape(1, 2, 16, 32, 256)).double()
    x = torch.randn(1, 9, 32, dtype=torch.float64)
    raw = layer.q_proj(x).view(1, 9, 2, 16).transpose(1, 2)
    # the cache's argument as the installed layer names it (past_key_values in transformers 5.23, cache in 5.25)
    import inspect

    cache_argument = "cache" if "cache" in inspect.signature(Llama4TextAttention.forward).parameters else "past_key_values"
    modeling_llama4.eager_attention_forward = eager
    try:
        for seen_before in (0, 1000):  # the layer's positions: arange(T) past what its cache has seen
            cache = DynamicCache(config=config)
            if seen_before:
                cache.update(torch.zeros(1, 2, seen_before, 16, dtype=torch.float64),
                             torch.zeros(1, 2, seen_before, 16, dtype=torch.float64), 0)
            layer(x, position_embeddings=None, attention_mask=None, **{cache_argument: cache})
            mine, _ = small.rotate_qk(raw, raw, torch.arange(9) + seen_before)
            torch.testing.assert_close(mine.detach(), captured[-1], rtol=0, atol=1e-12)
    finally:
        modeling_llama4.eager_attention_forward = old
    # a broken copy (floor of pos / floor_scale, without the + 1) differs at the steps' edges
    off = torch.tensor([math.log1p(math.floor(p / 8)) * 0.1 + 1 for p in positions.tolist()], dtype=torch.float64)
    assert not torch.allclose(off, want)


def _deepseek_v3_attention():
    """transformers' DeepseekV3Attention at posviz's MLA sizes (scaled down: 3 heads of width 16), half-split RoPE
    (``rope_interleave`` False, as posviz's RoPE pairs), no bias."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    config = DeepseekV3Config(hidden_size=C, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=24,
                              kv_lora_rank=20, qk_nope_head_dim=HS, qk_rope_head_dim=8, v_head_dim=HS,
                              rope_interleave=False, attention_bias=False, num_hidden_layers=4,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = "eager"
    return DeepseekV3Attention(config, layer_idx=3).double()


MLA_OPTIONS = {"q_lora_rank": 24, "kv_lora_rank": 20, "qk_nope_head_dim": HS, "qk_rope_head_dim": 8, "v_head_dim": HS}


def test_mla_rope_equals_deepseek_v3_attention_in_float64():
    torch.manual_seed(0)
    reference = _deepseek_v3_attention()
    shape = ModelShape(n_layer=4, n_head=H, head_dim=HS, n_embd=C, train_length=64)
    method = build_position_method("mla_rope", shape, MLA_OPTIONS).double()
    attention = CausalSelfAttention(ModelConfig(n_layer=4, n_head=H, n_embd=C, train_length=64,
                                                position="mla_rope")).double()
    assert attention.c_attn is None  # the method makes q, k, v: no projection nothing reads
    mine = method.mla[3]
    with torch.no_grad():
        for name in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"):
            for (_, p), (_, r) in zip(getattr(mine, name).named_parameters(), getattr(reference, name).named_parameters()):
                r.uniform_(0.5, 1.5) if name.endswith("layernorm") else None  # norms' weights away from one
                p.copy_(r)
        attention.c_proj.weight.copy_(reference.o_proj.weight)
        attention.c_proj.bias.zero_()
    x = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(T)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    # the reference turns by posviz's cos and sin (its angles, over the rotated part's 8 features, are RoPE's: checked
    # against transformers in tests/test_rope.py), rounded to float32 as posviz's are: what differs is MLA alone
    inv_freq, _ = method.frequencies(T)  # 1 / 10000 ** (2i / 8), i < 4, as posviz holds them (float32)
    torch.testing.assert_close(inv_freq.double(), 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    cos, sin = rope_cos_sin(positions, inv_freq)  # (T, qk_rope) float32
    angles = (cos.double()[None], sin.double()[None])
    # the weights a lab draws: the reference's eager path, whose softmax runs in float32 as posviz's drawn weights' does
    # (the two round alike but for an ulp, 6e-8, where the 1/sqrt(d) scale goes before or after the product)
    with torch.no_grad():
        _, want_weights = reference(x, angles, mask)
        _, weights = attention(x, positions, method, 3, None, True, {})
    torch.testing.assert_close(weights, want_weights, rtol=0, atol=1e-7)
    # outputs and gradients in float64 throughout: the reference through torch's SDPA, posviz's fused path (training's)
    reference.config._attn_implementation = "sdpa"
    want, _ = reference(x, angles, mask)
    _same_output_and_input_grads(want, lambda x2: attention(x2, positions, method, 3, None, False, {})[0], x, 1e-12)
    for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "kv_a_layernorm"):
        torch.testing.assert_close(getattr(mine, name).weight.grad, getattr(reference, name).weight.grad, rtol=0, atol=1e-12)
    # a broken copy (each head its own rotated key, not the one shared by all: the first head's for every head)
    # fails the same check
    project = method.project_heads

    def broken(layer, h):
        q, k, v = project(layer, h)
        return q, torch.cat((q[..., :8], k[..., 8:]), dim=-1), v

    method.project_heads = broken
    with torch.no_grad():
        wrong, _ = attention(x, positions, method, 3, None, False, {})
    assert (wrong - want).abs().max() > 1e-3


def test_mla_rope_owns_its_projections_and_decodes_from_a_cache_as_it_runs_whole():
    net = GPT(ModelConfig(n_layer=4, n_head=4, n_embd=128, train_length=256, position="mla_rope")).eval()
    rope = GPT(ModelConfig(n_layer=4, n_head=4, n_embd=128, train_length=256, position="rope"))
    # sized to the q, k, v projection it replaces: within 4 % of rope's parameters
    assert abs(net.num_parameters() / rope.num_parameters() - 1) < 0.04
    assert all(block.attn.c_attn is None for block in net.blocks)
    assert net.position.mla[0].kv_b_proj.weight.std().item() == pytest.approx(0.02, abs=0.003)  # kept: its own init
    ids = torch.randint(0, 256, (1, 70))
    with torch.no_grad():
        whole = net(ids).logits
        cache = KVCache(n_layer=4)
        steps = [net(ids[:, :30], cache=cache).logits] + [net(ids[:, t:t + 1], cache=cache).logits for t in range(30, 70)]
    torch.testing.assert_close(torch.cat(steps, 1), whole, rtol=0, atol=1e-5)


def test_mla_logit_parts_add_up_to_the_logits_attention_takes_its_softmax_of():
    from posviz.explore.rope_2025 import mla_logit_parts, mla_logit_tables

    torch.manual_seed(3)
    net = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=64, train_length=64, position="mla_rope")).eval()
    ids = torch.randint(0, 256, (1, 30))
    tables = mla_logit_tables(net, ids)
    assert sorted(tables) == [0, 1]
    for layer, parts in tables.items():
        logits = sum(parts.values())  # (H, T, T)
        with torch.no_grad():
            probs = net(ids, attention_layer=layer).attention[0].double()  # (H, T, T), a float32 softmax
        # softmax is shift-invariant per row: the logits' differences from each row's first key are log p's
        torch.testing.assert_close(logits - logits[..., :1], (probs.log() - probs[..., :1].log()).float().tril()
                                   + (logits - logits[..., :1]).triu(1), rtol=0, atol=2e-4)
        assert parts["position (rotated part)"].abs().max() > 0 and parts["content (unrotated part)"].abs().max() > 0
    rows = mla_logit_parts(net, ids, 8)
    assert len(rows["mean logit"]) == 2 * 2 * 8 and set(rows["distance"]) == set(range(8))
