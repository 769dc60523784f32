"""What mixes the tokens in each layer of a published model, read from its config (transformers' ``layer_types``),
and, for a layer that is not attention, the matrix its output implies on the text.

A hybrid (Qwen3-Next, Qwen3.5, LFM2) puts recurrent or convolutional layers beside attention layers. Each layer
kind is one ``Mixer``: where the decoder layer keeps it, and for a non-attention kind the function that writes the
layer as a causal matrix on its values, o_t = sum_s w_ts v_s, from its own parameters and its input on this text
(Ali, Zimerman and Wolf 2024, "The Hidden Attention of Mamba Models"; Zimerman, Ali and Wolf, ICLR 2025, arXiv
2405.16504). Which parts of a layer are folded in follows the choice posviz's own Gated DeltaNet makes: the matrix is
the layer's core, what multiplies the values after their convolution; the output gate and norm, a row scale per
channel, are left out (the reference's "hidden attention", ``old_attention=True``, leaves the gates out likewise).
Kinds:
- Gated DeltaNet (Qwen3-Next, Qwen3.5): w_ts = q_t^T [prod_(r = t..s+1) alpha_r (I - beta_r k_r k_r^T)] beta_s k_s
  per value head (``posviz.models.gated_deltanet.implied_matrix``), with q, k, v, g, beta computed by the layer's own
  projections, its own convolution function and its gate formula; q and k repeated over the value heads that share
  them and L2-normed, q scaled by 1/sqrt(d_k), as ``torch_chunk_gated_delta_rule`` does.
- short convolution (LFM2): y = C * conv(B * x), a depthwise convolution of K taps with no activation, so each channel's
  matrix is exact and banded: w^c_ts = C^c_t kernel^c[K - 1 - (t - s)] B^c_s for 0 <= t - s < K. Drawn per group of
  hidden / heads channels, the group's mean (a display choice: the layer has no heads).
- Kimi Delta Attention (Kimi Linear): as Gated DeltaNet with a decay per key channel, applied before the delta rule's
  step: w_ts = q_t^T [prod_(r = t..s+1) (I - beta_r k_r k_r^T) D_r] beta_s k_s, D_r = diag(exp(g_r)).
- Mamba-2 (Granite 4.0, Nemotron-H): the scan as a matrix per head, w_ts = (C_t . B_s) exp(A_h sum_(r = s+1..t) dt_r)
  dt_s (Ali, Zimerman and Wolf's hidden attention of Mamba, in Mamba-2's scalar-decay form), on the values after the
  convolution; the D skip is added on the diagonal (the reference keeps it apart), so that the matrix reproduces
  the scan's output; the gate and grouped norm after it are left out, as above.
- MLP (Nemotron-H lists its MLP and MoE blocks as layers): no token mixing, the identity.
Shapes: x (B, T, C) the layer's input (after the decoder layer's norm); a map (B, H, T, T).
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from posviz.errors import PosvizError
from posviz.models.gated_deltanet import implied_matrix, l2_normed


@dataclass(frozen=True)
class Mixer:
    kind: str  # "attention", or the non-attention layer's name (``LabModel.layer_kind``)
    attribute: str | None = None  # the decoder layer's attribute that holds it (None: found by name, attention)
    implied: Callable | None = None  # (module, x (B, T, C), n_head) -> (B, H, T, T) implied matrix
    holds: str = "keys and values of every token"  # what its cache keeps, as the KV cache lab says it
    beside: str = ""  # what runs beside the attention in the same layer, in words (Falcon-H1's Mamba-2)
    beside_kind: str | None = None  # that mixer's layer kind, drawn beside the attention map as its implied matrix
    beside_attribute: str | None = None  # the decoder layer's attribute that holds it
    beside_implied: Callable | None = None  # as ``implied``, for it
    # attention whose keys are not all tokens (DeepSeek-V4's compressed entries): (module, x (B, T_all, C) its inputs
    # since the first token, probs (B, H, T, keys)) -> (B, H, T, T_all), the map over tokens
    fold: Callable | None = None
    grows: bool | None = None  # attention whose cache is not every token's keys: whether it grows with the text
    evictable: bool = True  # False: its cache keeps its own window and entries, which posviz cannot evict (DeepSeek-V4)

    @property
    def carries_order(self) -> bool:
        """Whether the layer reads the text token after token (a recurrence or a convolution): order without positions."""
        return self.kind not in ("attention", NO_MIXING)


ATTENTION = Mixer("attention")
GATED_DELTANET = "Gated DeltaNet (recurrent)"  # as posviz's own hybrid_deltanet names its layers
SHORT_CONV = "short convolution"
MAMBA2 = "Mamba-2 (recurrent)"
KDA = "Kimi Delta Attention (recurrent)"
MAMBA2_HOLDS = "a fixed-size state per head (head dim × state size) and its convolution's last 3 inputs"
NO_MIXING = "MLP (no token mixing)"
V4_HOLDS = "keys (equal to values) of its sliding window's tokens"
V4_ENTRIES = ", and one compressed entry per block of the tokens before (config compress_rates)"


def _own_conv(module, mixed: torch.Tensor, activation) -> torch.Tensor:
    """The layer's causal depthwise convolution over (B, channels, T), by its family's own function (no cache)."""
    modeling = importlib.import_module(type(module).__module__)
    return modeling.causal_conv1d_forward(module.conv1d, mixed, None, module.layer_idx, activation=activation)


def delta_rule_matrix(q, k, g, beta) -> torch.Tensor:
    """(B, Hv, T, T) float64 from q, k (B, T, Hk, dk), g, beta (B, T, Hv), as ``torch_chunk_gated_delta_rule`` reads
    them: o = w @ v with v (B, Hv, T, dv)."""
    repeat = g.shape[2] // k.shape[2]
    q, k = (t.repeat_interleave(repeat, dim=2) for t in (q, k))  # each key head serves `repeat` value heads
    q, k, g, beta = (t.transpose(1, 2).double() for t in (q, k, g, beta))
    q, k = l2_normed(q), l2_normed(k)
    return implied_matrix(q / math.sqrt(q.shape[-1]), k, g, beta)


def gated_deltanet_parts_qwen3_next(module, x: torch.Tensor) -> tuple:
    """``Qwen3NextGatedDeltaNet``'s q, k (B, T, Hk, dk), v (B, T, Hv, dv), g, beta (B, T, Hv): q, k, v, z from
    ``in_proj_qkvz`` grouped per key head (its own ``fix_query_key_value_ordering``), b and a from ``in_proj_ba``."""
    B, T, _ = x.shape
    q, k, v, _z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(x), module.in_proj_ba(x))
    mixed = torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], dim=-1).transpose(1, 2)
    return (*_split_qkv(module, _own_conv(module, mixed, module.activation).transpose(1, 2)), *_gate_and_step(module, a, b))


def gated_deltanet_parts_qwen3_5(module, x: torch.Tensor) -> tuple:
    """``Qwen3_5GatedDeltaNet``'s (as above): one ``in_proj_qkv`` (q | k | v), and ``in_proj_b``, ``in_proj_a`` apart."""
    mixed = module.in_proj_qkv(x).transpose(1, 2)
    q, k, v = _split_qkv(module, _own_conv(module, mixed, module.activation).transpose(1, 2))
    return q, k, v, *_gate_and_step(module, module.in_proj_a(x), module.in_proj_b(x))


def gated_deltanet_parts_olmo_hybrid(module, x: torch.Tensor) -> tuple:
    """``OlmoHybridGatedDeltaNet``'s (as above): q, k, v, a and b each from its own projection; with
    ``linear_allow_neg_eigval`` beta is doubled (a step in [0, 2]: the transition may flip a direction)."""
    mixed = torch.cat([module.q_proj(x), module.k_proj(x), module.v_proj(x)], dim=-1).transpose(1, 2)
    q, k, v = _split_qkv(module, _own_conv(module, mixed, module.activation).transpose(1, 2))
    g, beta = _gate_and_step(module, module.a_proj(x), module.b_proj(x))
    return q, k, v, g, beta * 2.0 if module.allow_neg_eigval else beta


def _gated_deltanet(parts: Callable) -> Callable:
    def implied(module, x: torch.Tensor, n_head: int) -> torch.Tensor:
        q, k, _v, g, beta = parts(module, x)
        return delta_rule_matrix(q, k, g, beta).float()

    return implied


def _split_qkv(module, mixed: torch.Tensor):
    B, T, _ = mixed.shape
    q, k, v = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    return (q.reshape(B, T, -1, module.head_k_dim), k.reshape(B, T, -1, module.head_k_dim),
            v.reshape(B, T, -1, module.head_v_dim))


def _gate_and_step(module, a, b):
    """g (the log of each step's forgetting, <= 0) and beta (the delta rule's step), as the layer computes them."""
    return -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias), b.sigmoid()


def short_conv_channels_lfm2(module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Lfm2ShortConv``: in_proj gives B, C and the values (channels first); y = C * conv(B * values). Returns each
    channel's matrix w (B, C, T, T) and the values (B, C, T): y_t = sum_s w_ts values_s, exactly."""
    b, c, values = module.in_proj(x).transpose(-1, -2).chunk(3, dim=-2)  # (B, C, T) each
    T, K = x.shape[1], module.conv.kernel_size[0]
    kernel = module.conv.weight[:, 0, :]  # (C, K): tap K-1 multiplies the current token
    distance = torch.arange(T, device=x.device)[:, None] - torch.arange(T, device=x.device)[None, :]  # t - s
    inside = (distance >= 0) & (distance < K)
    taps = kernel[:, (K - 1 - distance).clamp(0, K - 1)] * inside  # (C, T, T)
    return c[..., :, None] * taps[None] * b[..., None, :], values


def short_conv_lfm2(module, x: torch.Tensor, n_head: int) -> torch.Tensor:
    """The channels' matrices averaged over n_head groups, built band by band: (B, n_head, T, T) without the (B, C, T, T)
    of every channel (1,024 channels at 4,096 tokens would be 64 GiB)."""
    b, c, _ = module.in_proj(x).transpose(-1, -2).chunk(3, dim=-2)  # (B, C, T)
    Bn, C, T = b.shape
    if C % n_head:
        raise PosvizError(f"{type(module).__name__}: {C} channels do not split into {n_head} groups")
    K = module.conv.kernel_size[0]
    kernel = module.conv.weight[:, 0, :]  # (C, K)
    w = x.new_zeros(Bn, n_head, T, T)
    rows = torch.arange(T, device=x.device)
    for d in range(min(K, T)):  # the band d tokens back: w_(t, t-d) = mean over a group of C_t kernel[K-1-d] B_(t-d)
        band = c[..., d:] * kernel[:, K - 1 - d, None] * b[..., :T - d]  # (B, C, T-d)
        w[:, :, rows[d:], rows[:T - d]] = band.reshape(Bn, n_head, -1, T - d).mean(2)
    return w.float()


@torch.no_grad()
def kda_matrix(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Kimi Delta Attention as a matrix, (B, H, T, T) float64 from q, k, g (B, T, H, d) and beta (B, T, H): its state
    S_t = (I - beta_t k_t k_t^T) D_t S_(t-1) + beta_t k_t v_t^T with D_t = diag(exp(g_t)), a decay per key channel,
    applied before the correction (``recurrent_kimi_delta_attention``), and o_t = S_t^T q_t, so w_ts = q_t^T
    [prod_(r = t..s+1) (I - beta_r k_r k_r^T) D_r] beta_s k_s. q and k L2-normed, q scaled by 1/sqrt(d), as there."""
    q, k, g, beta = (t.transpose(1, 2).double() for t in (q, k, g, beta))
    q, k = l2_normed(q), l2_normed(k)
    q = q / math.sqrt(q.shape[-1])
    B, H, T, d = k.shape
    carried = q.new_zeros(B, H, T, d)  # row s: beta_s k_s as the state holds it by now
    weights = q.new_zeros(B, H, T, T)
    for t in range(T):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        if t:
            seen = carried[:, :, :t] * g[:, :, t, None, :].exp()  # the decay first, per key channel
            carried[:, :, :t] = seen - bt * (seen @ kt[..., None]) * kt[:, :, None, :]  # then the delta rule's step
        carried[:, :, t] = bt[..., 0] * kt
        weights[:, :, t, :t + 1] = (carried[:, :, :t + 1] @ q[:, :, t, :, None])[..., 0]
    return weights


def kda_parts_kimi(module, x: torch.Tensor) -> tuple:
    """``KimiLinearDeltaAttention``'s q, k, v (B, T, H, d), g (its ``forget_gate``, per key channel) and beta, from its
    own projections, its own convolution function over q | k | v with its activation, and its own gate module."""
    B, T, _ = x.shape
    mixed = torch.cat([module.q_proj(x), module.k_proj(x), module.v_proj(x)], dim=-1).transpose(1, 2)
    q, k, v = (t.reshape(B, T, -1, module.head_dim) for t in torch.split(
        _own_conv(module, mixed, module.activation).transpose(1, 2), [module.qkv_dim] * 3, dim=-1))
    return q, k, v, module.forget_gate(x).reshape(B, T, -1, module.head_dim), torch.sigmoid(module.b_proj(x))


def kda(module, x: torch.Tensor, n_head: int) -> torch.Tensor:
    q, k, _v, g, beta = kda_parts_kimi(module, x)
    return kda_matrix(q, k, g, beta).float()


def ssd_matrix(B: torch.Tensor, C: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """Mamba-2's scan (state space duality) as a matrix, (b, H, T, T) float64: w_ts = (C_t . B_s) exp(A_h sum_(r = s+1..t)
    dt_r) dt_s for s <= t, and D_h added on the diagonal (its skip). B, C (b, T, H, N) with each head's group's;
    dt (b, T, H) after its bias, softplus and limits; A (H,) negative. y_t = sum_s w_ts x_s, per head, on every one
    of the head's channels: what ``mamba2_chunk_scan`` computes a chunk at a time."""
    B, C, dt, A, D = (t.double() for t in (B, C, dt, A, D))
    cum = (A * dt).cumsum(1)  # (b, T, H): the log decay up to each token
    T = dt.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=dt.device).tril()
    decay = (cum[:, :, None] - cum[:, None, :]).permute(0, 3, 1, 2).masked_fill(~causal, float("-inf")).exp()
    w = torch.einsum("bthn,bshn->bhts", C, B) * decay * dt.permute(0, 2, 1)[:, :, None, :]
    return w + torch.diag_embed(D[None, :, None].expand(dt.shape[0], -1, T))


def mamba2_parts(module, x: torch.Tensor) -> tuple:
    """A Mamba-2 mixer's (Granite 4.0's ``GraniteMoeHybridMambaLayer``, ``NemotronHMamba2Mixer``) scan inputs: the
    values x (b, T, H, P) and B, C (b, T, H, N), dt (b, T, H), A, D (H,), from its own in_proj split [gate | x B C |
    dt], its own convolution function over x B C with its activation, and the scan's dt = clamp(softplus(dt +
    dt_bias), time_step_limit), A = -exp(A_log); B and C repeated over the heads of their group."""
    b, T, _ = x.shape
    # Falcon-H1's muP multipliers: its input scaled before in_proj, the projection's parts scaled after it
    projected = module.in_proj(x * getattr(module, "ssm_in_multiplier", 1.0))
    if getattr(module, "mup_vector", None) is not None:
        projected = projected * module.mup_vector
    _gate, xbc, dt = projected.split([module.intermediate_size, module.conv_dim, module.num_heads], dim=-1)
    xbc = _own_conv(module, xbc.transpose(1, 2), module.activation).transpose(1, 2)
    GN = module.n_groups * module.ssm_state_size
    values, Bm, Cm = torch.split(xbc, [module.intermediate_size, GN, GN], dim=-1)
    per_group = module.num_heads // module.n_groups
    Bm, Cm = (t.reshape(b, T, module.n_groups, -1).repeat_interleave(per_group, dim=2) for t in (Bm, Cm))
    low, high = module.time_step_limit or (0.0, float("inf"))
    dt = F.softplus(dt + module.dt_bias).clamp(low, high)
    return values.reshape(b, T, module.num_heads, module.head_dim), Bm, Cm, dt, -module.A_log.float().exp(), module.D


def mamba2(module, x: torch.Tensor, n_head: int) -> torch.Tensor:
    _values, Bm, Cm, dt, A, D = mamba2_parts(module, x)
    return ssd_matrix(Bm, Cm, dt, A, D).float()


@torch.no_grad()
def pooling_shares(compressor, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """DeepSeek-V4's compressed entries as shares of the tokens they pool: (B, E, 2m or m slots, channels) float64
    and the slots' offset, from the attention layer's input x (B, T, C); entry w's slot j is token w * m - offset + j.
    Entry w = sum over its slots of softmax(gate + position_bias) * kv, per channel (its compressor's own projections
    and bias), before its norm and rotation. Heavily compressed (HCA): entry w pools the m tokens of window w (offset
    0). Compressed sparse (CSA): window w - 1 by the first half of the channels, then window w by the second, 2m slots
    (offset m), the first m empty for w = 0 (``DeepseekV4CSACompressor``)."""
    B, T, _ = x.shape
    m, d = compressor.compress_rate, compressor.head_dim
    E = T // m
    # (B, E, m, channels): the width named, as E may be 0 (a text shorter than one block has no entry yet)
    gate = (compressor.gate_proj(x[:, :E * m]).view(B, E, m, compressor.gate_proj.out_features)
            + compressor.position_bias).double()
    if gate.shape[-1] == d:  # HCA: one series
        return gate.softmax(dim=2), 0
    slots = gate.new_full((B, E, 2 * m, d), float("-inf"))
    slots[:, :, m:] = gate[..., d:]  # window w's second series
    slots[:, 1:, :m] = gate[:, :-1, :, :d]  # window w - 1's first series
    return slots.softmax(dim=2), m


def compressed_pooling(compressor, x: torch.Tensor) -> torch.Tensor:
    """(B, E, T) float64: how much of entry w each token makes, the mean over the entry's channels of its shares
    (``pooling_shares``; each channel's sum to one, so the mean does too)."""
    shares, offset = pooling_shares(compressor, x)
    B, E, slots, _ = shares.shape
    m, T = compressor.compress_rate, x.shape[1]
    pooled = shares.new_zeros(B, E, T)
    mean = shares.mean(-1)
    for w in range(E):
        lo = w * m - offset
        pooled[:, w, max(0, lo):lo + slots] = mean[:, w, max(0, -lo):]
    return pooled


def fold_compressed(module, x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """A DeepSeek-V4 attention layer's weights (B, H, T, n + E), on its n newest tokens (its sliding window's keys)
    and its E compressed entries, as a map over every token, (B, H, T, T_all): each entry's weight spread over the
    tokens it pools by their mean share (``pooling_shares``; ``compressed_pooling`` is the same as a matrix), added
    entry by entry into the one output map (no (T, T_all) temporary). Rows keep their sum (less than one: its sink
    logits take the rest)."""
    T_all = x.shape[1]
    out = probs.new_zeros(*probs.shape[:-1], T_all)
    compressor = getattr(module, "compressor", None)
    if compressor is None:  # a sliding-window layer: its keys are its newest tokens
        out[..., T_all - probs.shape[-1]:] = probs
        return out
    shares, offset = pooling_shares(compressor, x)
    mean = shares.mean(-1).to(probs.dtype)  # (B, E, slots)
    B, E, slots = mean.shape
    n, m = probs.shape[-1] - E, compressor.compress_rate
    out[..., T_all - n:] = probs[..., :n]
    for w in range(E):
        lo = w * m - offset
        first = max(0, -lo)  # CSA's entry 0: its first m slots (the window before the text) are empty
        out[..., lo + first:lo + slots] += probs[..., n + w, None] * mean[:, None, None, w, first:]
    return out


def no_mixing(module, x: torch.Tensor, n_head: int) -> torch.Tensor:
    """A layer that is an MLP alone (Nemotron-H lists them as layers): each token reads itself, the identity."""
    b, T, _ = x.shape
    return torch.eye(T, device=x.device).expand(b, n_head, T, T).clone()


# model_type -> {an entry of the config's layer_types: the layer kind}. A family missing here: attention everywhere.
MIXERS: dict[str, dict[str, Mixer]] = {
    "qwen3_next": {"full_attention": ATTENTION, "linear_attention": Mixer(
        GATED_DELTANET, "linear_attn", _gated_deltanet(gated_deltanet_parts_qwen3_next), "a fixed-size state per head (d_k × d_v) and its "
        "convolution's last 3 inputs")},
    "qwen3_5_text": {"full_attention": ATTENTION, "linear_attention": Mixer(
        GATED_DELTANET, "linear_attn", _gated_deltanet(gated_deltanet_parts_qwen3_5), "a fixed-size state per head (d_k × d_v) and its "
        "convolution's last 3 inputs")},
    # OLMo-Hybrid: Gated DeltaNet layers (separate projections) beside attention (NoPE in the released models)
    "olmo_hybrid": {"full_attention": ATTENTION, "linear_attention": Mixer(
        GATED_DELTANET, "linear_attn", _gated_deltanet(gated_deltanet_parts_olmo_hybrid), "a fixed-size state per head "
        "(d_k × d_v) and its convolution's last inputs")},
    # Kimi Linear: Kimi Delta Attention layers beside MLA layers that use no positions; both kept at .self_attn
    "kimi_linear": {"full_attention": Mixer("attention", "self_attn"), "linear_attention": Mixer(
        KDA, "self_attn", kda, "a fixed-size state per head (d × d) and its convolution's last inputs")},
    # Falcon-H1: every layer runs RoPE attention and a Mamba-2 mixer side by side on the same input and adds their
    # outputs; its map is the attention's, the Mamba-2's implied matrix is drawn beside it (``beside_map``), and the
    # KV cache lab says the Mamba-2 state beside the keys
    "falcon_h1": {"hybrid": Mixer("attention", "self_attn", holds="and its Mamba-2's fixed-size state beside them",
                                  beside="a Mamba-2 mixer", beside_kind=MAMBA2, beside_attribute="mamba",
                                  beside_implied=mamba2)},
    # Granite 4.0-H: Mamba-2 layers beside attention layers (NoPE in the published models); layer_types "mamba" and
    # "attention" in its config.json, read by transformers as these
    "granitemoehybrid": {"full_attention": ATTENTION, "linear_attention": Mixer(MAMBA2, "mamba", mamba2, MAMBA2_HOLDS)},
    # Nemotron-H: every layer keeps its block at .mixer, Mamba-2, attention (NoPE), or an MLP or MoE alone
    "nemotron_h": {"full_attention": Mixer("attention", "mixer"), "linear_attention": Mixer(MAMBA2, "mixer", mamba2, MAMBA2_HOLDS),
                   "mlp": Mixer(NO_MIXING, "mixer", no_mixing, "nothing"), "moe": Mixer(NO_MIXING, "mixer", no_mixing, "nothing")},
    # DeepSeek-V4: every layer attends a sliding window of its newest keys; the compressed layers also one entry per
    # m tokens before (CSA: m = 4, its indexer picking the entries each query sees; HCA: m = 128), drawn on the tokens
    "deepseek_v4": {"sliding_attention": Mixer("attention", "self_attn", fold=fold_compressed, holds=V4_HOLDS,
                                               grows=False, evictable=False),
                    "compressed_sparse_attention": Mixer("attention", "self_attn", fold=fold_compressed,
                                                         holds=V4_HOLDS + V4_ENTRIES, grows=True, evictable=False),
                    "heavily_compressed_attention": Mixer("attention", "self_attn", fold=fold_compressed,
                                                          holds=V4_HOLDS + V4_ENTRIES, grows=True, evictable=False)},
    "lfm2": {"full_attention": ATTENTION, "conv": Mixer(
        SHORT_CONV, "conv", short_conv_lfm2, "its convolution's last inputs (the kernel's width less one)")},
}


def layer_mixers(config) -> list[Mixer]:
    """One ``Mixer`` per decoder layer, from ``config.layer_types`` (every layer attention where the family has none)."""
    n = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 0)
    table = MIXERS.get(config.model_type)
    if table is None:
        return [ATTENTION] * n
    types = list(getattr(config, "layer_types", None) or [])
    unknown = sorted({t for t in types if t not in table})
    if len(types) != n or unknown:
        raise PosvizError(f"{config.model_type}: posviz cannot read its layer_types {types!r} (known: "
                          f"{', '.join(table)}).")
    return [table[t] for t in types]


def mixer_heads(config, n_head: int) -> int:
    """The most heads a layer of the model draws a map for, before grouping: its attention heads, or a recurrent
    layer's own (Gated DeltaNet's value heads, Mamba-2's, Kimi Delta Attention's)."""
    names = ("linear_num_value_heads", "mamba_n_heads", "mamba_num_heads", "linear_num_heads")
    return max([n_head] + [int(getattr(config, a)) for a in names if isinstance(getattr(config, a, None), int)])


def keep_inputs(mixers: list[Mixer], layers, cache, asked, hooks: list) -> dict:
    """Hooks on ``layers`` (the decoder layers) that keep what each non-attention layer reads in this pass (the asked
    layers', and every one's in a cache for maps, ``cache.inputs``, whose inputs then run from the first token):
    layer -> (B, T, C), filled as the pass runs. The hooks are appended to ``hooks`` for the caller to remove."""
    keep = {}
    for i, mixer in enumerate(mixers):
        if (mixer.kind == "attention" and mixer.fold is None) or not (
                i in asked or (cache is not None and cache.inputs is not None)):
            continue

        def keep_input(module, args, kwargs, i=i):
            x = args[0] if args else kwargs["hidden_states"]
            if cache is not None and cache.inputs is not None:
                before = cache.inputs.get(i)
                cache.inputs[i] = x.detach() if before is None else torch.cat((before, x.detach()), dim=1)
                x = cache.inputs[i]
            keep[i] = x

        hooks.append(getattr(layers[i], mixer.attribute).register_forward_pre_hook(keep_input, with_kwargs=True))
    return keep


def implied_map(mixers: list[Mixer], layers, layer: int, x: torch.Tensor, n_head: int, name: str,
                beside: bool = False) -> torch.Tensor:
    """A non-attention layer's implied matrix on its input x (B, T, C), as (B, n_head, T, T) (``beside``: the mixer
    beside the layer's attention, Falcon-H1's Mamba-2): a layer with another number of heads (Qwen3-Next's 32 value
    heads beside 16 attention heads) is drawn per group of heads, the mean of their rows' |w| shares (each row then
    sums to one, as ``attention_maps.implied_shares`` draws it)."""
    mixer = mixers[layer]
    implied, attribute = (mixer.beside_implied, mixer.beside_attribute) if beside else (mixer.implied, mixer.attribute)
    w = implied(getattr(layers[layer], attribute), x, n_head)
    H = w.shape[1]
    if H == n_head:
        return w
    if H % n_head:
        raise PosvizError(f"{name}: layer {layer} has {H} heads, which do not group into {n_head}.")
    shares = w.abs() / w.abs().sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    return shares.reshape(w.shape[0], n_head, H // n_head, *w.shape[2:]).mean(2)
