"""The Gated DeltaNet layer: a recurrent layer that takes attention's place in a hybrid model (Yang, Kautz and
Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta Rule", https://arxiv.org/abs/2412.06464;
Qwen3-Next and Qwen3.5 put three of them before each attention layer, Kimi Linear a variant).

Each head keeps a state S (hs_k, hs_v), a memory from keys to values. At each byte t it forgets a share (alpha_t =
exp(g_t), from the byte itself), corrects what the memory says of k_t towards v_t by a step beta_t (the delta rule),
and reads with q_t:

    S_t = alpha_t S_(t-1) + k_t beta_t (v_t - alpha_t S_(t-1)^T k_t)^T,      o_t = S_t^T q_t

with q and k L2-normed and q scaled by 1/sqrt(hs_k). Order comes from the recurrence itself: no position enters.
Around it, as in the reference: q, k and v pass a short causal depthwise convolution (kernel 4) and SiLU first; the
output is RMS-normed per head and multiplied by SiLU of a gate z from the layer's input.

Reference path: transformers' ``Qwen3NextGatedDeltaNet`` (``models/qwen3_next/modeling_qwen3_next.py``) with
``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule``: its projections (``in_proj_qkvz`` per key
head [q | k | v | z], ``in_proj_ba`` [b | a]), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), its
initialisation (dt_bias one, A = uniform(0.01, 16), every Linear normal(0, 0.02), the norm's weight one). Here one
value head per key head (Qwen3-Next has two), so that each head has one implied matrix, as an attention head has one
map. The reference computes the rule in float32 whatever its input; posviz in the input's dtype, so that float64
checks are float64.

Three forms of one rule, held equal by the tests: ``recurrent`` (byte by byte, the definition, and a cached decoding
step), ``chunked`` (a chunk of bytes at a time through a triangular solve, what training runs), and ``implied_matrix``:
o_t = sum_s w_ts v_s with w_ts = q_t^T [prod_(r = t..s+1) alpha_r (I - beta_r k_r k_r^T)] beta_s k_s, one scalar per
head and pair, the matrix a lab draws where it draws attention (Ali, Zimerman and Wolf 2024, "The Hidden Attention of
Mamba Models"; Zimerman, Ali and Wolf, ICLR 2025, arXiv 2405.16504).
Shapes: x (B, T, C); q, k (B, H, T, hs_k); v (B, H, T, hs_v); g, beta (B, H, T); S (B, H, hs_k, hs_v).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02  # Qwen3NextConfig.initializer_range
CONV_KERNEL = 4  # Qwen3NextConfig.linear_conv_kernel_dim
CHUNK = 64  # bytes per chunk of the chunked form (the reference's chunk_size)
NORM_EPS = 1e-6  # Qwen3NextConfig.rms_norm_eps; also the L2 norm's


def l2_normed(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + NORM_EPS)


def recurrent(q, k, v, g, beta, state=None):
    """The rule byte by byte: outputs (B, H, T, hs_v) and the last state. q, k already normed and q scaled."""
    B, H, T, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        correction = (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]  # (B, H, hs_v)
        S = S + k[:, :, t, :, None] * correction[:, :, None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, dim=2), S


def chunked(q, k, v, g, beta, state=None, chunk: int = CHUNK):
    """The same rule a chunk at a time. Within a chunk, with gamma_i the cumulative log decay from its start and S0
    the state before it, the values written at each byte, w_i = beta_i (v_i - alpha_i S_(i-1)^T k_i), solve the lower
    unitriangular system w_i + sum_(j<i) beta_i e^(gamma_i - gamma_j) (k_i . k_j) w_j = beta_i (v_i - e^(gamma_i)
    S0^T k_i); then o_i = e^(gamma_i) S0^T q_i + sum_(j<=i) e^(gamma_i - gamma_j) (q_i . k_j) w_j and the state after
    the chunk is e^(gamma_C) S0 + sum_j e^(gamma_C - gamma_j) k_j w_j^T."""
    B, H, T, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state
    out = []
    for c0 in range(0, T, chunk):
        qc, kc, vc = q[:, :, c0:c0 + chunk], k[:, :, c0:c0 + chunk], v[:, :, c0:c0 + chunk]
        gamma = g[:, :, c0:c0 + chunk].cumsum(-1)  # (B, H, n)
        bc = beta[:, :, c0:c0 + chunk, None]
        n = gamma.shape[-1]
        lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # (B, H, i, j)
        system = (kc @ kc.transpose(-1, -2)) * decay * bc  # row i scaled by beta_i; the diagonal is replaced by one
        system = system.tril(-1) + torch.eye(n, dtype=q.dtype, device=q.device)
        rhs = bc * (vc - gamma.exp()[..., None] * (kc @ S))
        w = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # (B, H, n, hs_v)
        out.append(gamma.exp()[..., None] * (qc @ S) + ((qc @ kc.transpose(-1, -2)) * decay) @ w)
        S = gamma[..., -1:, None].exp() * S + (kc * (gamma[..., -1:] - gamma).exp()[..., None]).transpose(-1, -2) @ w
    return torch.cat(out, dim=2), S


@torch.no_grad()
def implied_matrix(q, k, g, beta):
    """(B, H, T, T) weights w_ts with o_t = sum_s w_ts v_s (zero above the diagonal): each byte's written key
    beta_s k_s carried through every later byte's forgetting and correction, alpha_r (I - beta_r k_r k_r^T), then read
    by q_t. O(T^2 hs_k) per head: for the maps a lab draws, not for training."""
    B, H, T, dk = k.shape
    carried = q.new_zeros(B, H, T, dk)  # row s: beta_s k_s as the state holds it by now
    weights = q.new_zeros(B, H, T, T)
    for t in range(T):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]  # (B, H, hs_k), (B, H, 1, 1)
        if t:
            seen = carried[:, :, :t]
            carried[:, :, :t] = (seen - bt * (seen @ kt[..., None]) * kt[:, :, None, :]) * g[:, :, t].exp()[..., None, None]
        carried[:, :, t] = bt[..., 0] * kt
        weights[:, :, t, :t + 1] = (carried[:, :, :t + 1] @ q[:, :, t, :, None])[..., 0]
    return weights


@torch.no_grad()
def implied_rows(q, k, g, beta):
    """The rows of the implied matrix for the last n bytes only: (B, H, n, T) for queries q (B, H, n, hs_k) at
    positions T-n..T-1 over every key k, g, beta (.., T, ..) since the first byte. The same weights read from the
    query's end: u_t(t) = q_t, u_t(s-1) = alpha_s (I - beta_s k_s k_s^T) u_t(s) (each factor is symmetric), and
    w_ts = beta_s k_s^T u_t(s); one sweep from the last byte back carries the n queries together, O(T n hs_k) per
    head, so a cached pass of a few queries over a long text draws its rows without a (T, T) matrix."""
    B, H, T, dk = k.shape
    n = q.shape[2]
    first = T - n  # position of the first query
    u = q.new_zeros(B, H, n, dk)  # row i: u_(first+i)(s), zero while s is past that query
    weights = q.new_zeros(B, H, n, T)
    for s in range(T - 1, -1, -1):
        if s >= first:
            u[:, :, s - first] = q[:, :, s - first]
        ks, bs = k[:, :, s, :, None], beta[:, :, s, None]  # (B, H, hs_k, 1), (B, H, 1)
        read = (u @ ks)[..., 0]  # (B, H, n): k_s^T u
        weights[:, :, :, s] = bs * read
        u = (u - (bs * read)[..., None] * ks.transpose(-1, -2)) * g[:, :, s].exp()[..., None, None]
    return weights


class GatedRMSNorm(nn.Module):
    """``Qwen3NextRMSNormGated``: each head's output RMS-normed, scaled by a weight (one at first), times SiLU(z)."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, y, z):
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return self.weight * y * F.silu(z)


class GatedDeltaNet(nn.Module):
    """One layer, called as attention is: (x, pos, position, layer, cache, want_probs, blocks) -> (y (B, T, C), the
    implied matrix (B, H, T, T) when ``want_probs``, else None). A KV cache keeps its state and its convolution's last
    inputs (``KVCache.recent``); they follow the text, whatever a window evicts from the attention layers."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head, self.head_dim = n_head, n_embd // n_head
        self.in_proj_qkvz = nn.Linear(n_embd, 4 * n_embd, bias=False)  # per head [q | k | v | z]
        self.in_proj_ba = nn.Linear(n_embd, 2 * n_head, bias=False)  # per head [b | a]
        self.conv1d = nn.Conv1d(3 * n_embd, 3 * n_embd, CONV_KERNEL, groups=3 * n_embd, bias=False,
                                padding=CONV_KERNEL - 1)
        self.dt_bias = nn.Parameter(torch.ones(n_head))
        self.A_log = nn.Parameter(torch.empty(n_head).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(self.head_dim)
        self.out_proj = nn.Linear(n_embd, n_embd, bias=False)
        for proj in (self.in_proj_qkvz, self.in_proj_ba, self.out_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=INIT_STD)
        # conv1d keeps PyTorch's own initialisation, as the reference's _init_weights leaves it

    @staticmethod
    def cached_rows(q, k, g, beta, layer: int, cache, want_probs: bool):
        """The implied rows of a cached pass's bytes over every byte since the first (B, H, T, seen) when
        ``want_probs``, else None. The state forgets the keys it was written with, so a cache made ``for_maps``
        (``KVCache.for_maps``) keeps them, with their gates and steps; any other cannot draw these rows."""
        if cache.for_maps:
            seen = cache.recent.get((layer, "deltanet_seen"))
            if seen is not None:
                k, g, beta = (torch.cat((old, new), dim=2) for old, new in zip(seen, (k, g, beta)))
            cache.recent[(layer, "deltanet_seen")] = (k, g, beta)
        if not want_probs:
            return None
        if not cache.for_maps:
            from posviz.errors import PosvizError

            raise PosvizError(f"layer {layer} is recurrent: its map of cached queries needs a cache made for maps "
                              "(new_cache(for_maps=True)), which keeps the keys its state forgets")
        return implied_rows(q, k, g, beta)

    def inputs(self, x, layer: int = 0, cache=None):
        """q, k (normed, q scaled), v after the convolution, g, beta (shapes in the legend), and z (B, T, H, hs_v)."""
        B, T, C = x.shape
        H, hs = self.n_head, self.head_dim
        q, k, v, z = self.in_proj_qkvz(x).view(B, T, H, 4 * hs).split(hs, dim=-1)
        b, a = self.in_proj_ba(x).view(B, T, H, 2).unbind(-1)
        mixed = torch.cat((q.reshape(B, T, C), k.reshape(B, T, C), v.reshape(B, T, C)), dim=-1)  # (B, T, 3C)
        before = None if cache is None else cache.recent.get((layer, "deltanet_conv"))
        if before is not None:
            mixed = torch.cat((before, mixed), dim=1)
        if cache is not None:
            cache.recent[(layer, "deltanet_conv")] = mixed[:, -(CONV_KERNEL - 1):]
        w = self.conv1d.weight  # (3C, 1, K)
        conv = F.silu(F.conv1d(mixed.transpose(1, 2), w, padding=CONV_KERNEL - 1, groups=w.shape[0])[..., :mixed.shape[1]])
        conv = conv[..., -T:].transpose(1, 2)  # (B, T, 3C): the new bytes only
        q, k, v = (t.reshape(B, T, H, hs).transpose(1, 2) for t in conv.split(C, dim=-1))  # (B, H, T, hs)
        q, k = l2_normed(q) / hs ** 0.5, l2_normed(k)
        g = (-self.A_log.exp() * F.softplus(a + self.dt_bias)).transpose(1, 2)  # (B, H, T) log decay, <= 0
        return q, k, v, g, b.sigmoid().transpose(1, 2), z

    def forward(self, x, pos=None, position=None, layer: int = 0, cache=None, want_probs: bool = False, blocks=None):
        q, k, v, g, beta, z = self.inputs(x, layer, cache)
        state = None if cache is None else cache.recent.get((layer, "deltanet_state"))
        rule = recurrent if x.shape[1] == 1 else chunked  # a decoding step is the recurrence's one step
        y, state = rule(q, k, v, g, beta, state)  # (B, H, T, hs_v)
        probs = implied_matrix(q, k, g, beta) if want_probs and cache is None else None
        if cache is not None:
            cache.recent[(layer, "deltanet_state")] = state
            # no keys to keep, but the step is noted as every layer's is (positions, windows, sinks): width 0
            cache.append(layer, k[..., :0], v[..., :0], pos)
            probs = self.cached_rows(q, k, g, beta, layer, cache, want_probs)
        B, H, T, hs = y.shape
        y = self.norm(y.transpose(1, 2), z).reshape(B, T, H * hs)
        return self.out_proj(y), probs
