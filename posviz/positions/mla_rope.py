"""Multi-head latent attention with decoupled RoPE (DeepSeek-V2, "DeepSeek-V2: A Strong, Economical, and Efficient
Mixture-of-Experts Language Model", https://arxiv.org/abs/2405.04434, section 2.1.3; DeepSeek-V3 and Kimi's MLA
layers keep it).

MLA caches one small latent per token instead of every head's key and value, and rebuilds them with an up-projection.
RoPE does not commute with that up-projection, so position is moved out of it: each head's query and key are split
into an unrotated part (from the latent) and a small rotated part; the rotated part of the key is one vector per
token, shared by every head. A logit is then content (q_nope . k_nope) plus position (q_rope . R(m - n) k_rope),
over sqrt(qk_nope_head_dim + qk_rope_head_dim).

Reference path: transformers' ``DeepseekV3Attention`` (``models/deepseek_v3/modeling_deepseek_v3.py``), line by line:
q = q_b_proj(q_a_layernorm(q_a_proj(x))) per head [q_nope | q_rope]; kv_a_proj_with_mqa(x) = [latent | k_rope];
kv_b_proj(kv_a_layernorm(latent)) per head [k_nope | v]; k_rope viewed as one head and expanded to all; scaling
qk_head_dim ** -0.5; the two norms RMSNorm with eps rms_norm_eps, weight one; every Linear normal(0,
initializer_range 0.02) without bias (``attention_bias`` False). Two choices differ and are said:
* the rotated part sits first in each head ([q_rope | q_nope]) so that posviz's RoPE (which turns the first rot_dim
  features) and every scaling and remap act on it unchanged; a dot product does not care in which order the parts are
  concatenated, and the reference test compares logits and outputs.
* RoPE's half-split pairs (``rope_interleave`` False); DeepSeek-V3's config interleaves (pairs 2i, 2i + 1), which is
  the same model with the projection's rope rows permuted.
The sizes, for n_embd 128 and 4 heads (DeepSeek-V3: hidden 7,168, 128 heads, q_lora_rank 1,536, kv_lora_rank 512,
qk_nope 128, qk_rope 64, v 128): qk_nope = v = the head size 32, qk_rope = 16 (half of qk_nope, as 64 of 128), and
both latents n_embd / 2 = 64, so that the projections hold 47,104 weights against the 49,152 of the q, k, v projection they
replace: the model's size stays the rope checkpoint's, and the latent's bottleneck is the difference.
Shapes: x (B, T, C); q, k (B, H, T, qk_rope + qk_nope); v (B, H, T, v_head_dim).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from posviz.config import require
from posviz.positions.rope import RopeOptions, Rotary

INIT_STD = 0.02  # DeepseekV3Config.initializer_range: _init_weights gives every Linear normal(0, 0.02)


@dataclasses.dataclass
class MlaOptions(RopeOptions):
    # None: sized from the model, as the module docstring says (written into config.json when built)
    q_lora_rank: int | None = None  # the query's latent (DeepSeek-V3: 1,536 of 7,168); here n_embd / 2
    kv_lora_rank: int | None = None  # the latent every head's key and value come from, what MLA caches (V3: 512); n_embd / 2
    qk_nope_head_dim: int | None = None  # each head's unrotated, content part of query and key (V3: 128); the head size
    qk_rope_head_dim: int | None = None  # each head's rotated part, the key's shared by every head (V3: 64); half that
    v_head_dim: int | None = None  # each head's value; n_head x v_head_dim must be n_embd (the output projection's input)
    rms_norm_eps: float = 1e-6  # DeepseekV3Config.rms_norm_eps

    def __post_init__(self):
        super().__post_init__()
        for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
                    f"mla_rope {name} must be a positive integer or None (sized from the model), got {value!r}")
        require(self.qk_rope_head_dim is None or self.qk_rope_head_dim % 2 == 0,
                f"mla_rope qk_rope_head_dim must be even (pairs turn), got {self.qk_rope_head_dim}")
        require(self.rotary_fraction == 1.0, "mla_rope rotates its whole qk_rope_head_dim part: leave rotary_fraction 1")
        require(self.rms_norm_eps > 0, f"mla_rope rms_norm_eps must be positive, got {self.rms_norm_eps!r}")

    def sized_for(self, n_embd: int, head_dim: int) -> None:
        """Fill the sizes left None from the model's: DeepSeek's proportions at posviz's width (module docstring)."""
        for name, size in (("q_lora_rank", n_embd // 2), ("kv_lora_rank", n_embd // 2), ("qk_nope_head_dim", head_dim),
                           ("qk_rope_head_dim", max(2, head_dim // 2 // 2 * 2)), ("v_head_dim", head_dim)):
            if getattr(self, name) is None:
                setattr(self, name, size)


class RMSNorm(nn.Module):
    """``DeepseekV3RMSNorm``: normalised in float32 whatever the input's dtype, scaled by a weight starting at one."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class MlaLayer(nn.Module):
    """One layer's projections, named as ``DeepseekV3Attention``'s."""

    def __init__(self, n_embd: int, n_head: int, o: MlaOptions):
        super().__init__()
        qk = o.qk_nope_head_dim + o.qk_rope_head_dim
        self.q_a_proj = nn.Linear(n_embd, o.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(o.q_lora_rank, o.rms_norm_eps)
        self.q_b_proj = nn.Linear(o.q_lora_rank, n_head * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(n_embd, o.kv_lora_rank + o.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(o.kv_lora_rank, o.rms_norm_eps)
        self.kv_b_proj = nn.Linear(o.kv_lora_rank, n_head * (o.qk_nope_head_dim + o.v_head_dim), bias=False)
        for proj in (self.q_a_proj, self.q_b_proj, self.kv_a_proj_with_mqa, self.kv_b_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=INIT_STD)


class MlaRope(Rotary):
    name = "mla_rope"
    display_name = "MLA decoupled RoPE"  # short: a legend at 1366 px shows about 18 characters
    summary = ("DeepSeek's multi-head latent attention: keys and values from a small latent, position in a separate "
               "small rotated part of each query and one rotated key shared by every head.")
    paper = "https://arxiv.org/abs/2405.04434"
    Options = MlaOptions
    projects_heads = True
    explore_sections = ("mla-logit-parts",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        o = self.options
        o.sized_for(shape.n_embd, shape.head_dim)  # pinned: every size written out
        require(shape.n_head * o.v_head_dim == shape.n_embd,
                f"mla_rope needs n_head x v_head_dim = n_embd ({shape.n_head} x {o.v_head_dim} != {shape.n_embd})")
        self.rot_dim = o.qk_rope_head_dim  # RoPE turns the rotated part alone, its speeds over that part's pairs
        self.mla = nn.ModuleList(MlaLayer(shape.n_embd, shape.n_head, o) for _ in range(shape.n_layer))

    def project_heads(self, layer, x):  # x (B, T, C) -> q, k (B, H, T, qk_rope + qk_nope), v (B, H, T, v_head_dim)
        o, m, H = self.options, self.mla[layer], self.shape.n_head
        B, T, _ = x.shape
        q = m.q_b_proj(m.q_a_layernorm(m.q_a_proj(x))).view(B, T, H, -1).transpose(1, 2)
        q_nope, q_rope = q.split((o.qk_nope_head_dim, o.qk_rope_head_dim), dim=-1)
        latent, k_rope = m.kv_a_proj_with_mqa(x).split((o.kv_lora_rank, o.qk_rope_head_dim), dim=-1)
        kv = m.kv_b_proj(m.kv_a_layernorm(latent)).view(B, T, H, -1).transpose(1, 2)
        k_nope, v = kv.split((o.qk_nope_head_dim, o.v_head_dim), dim=-1)
        k_rope = k_rope[:, None].expand(B, H, T, o.qk_rope_head_dim)  # one rotated key per token, every head's
        return torch.cat((q_rope, q_nope), dim=-1), torch.cat((k_rope, k_nope), dim=-1), v.contiguous()
