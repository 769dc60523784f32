"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda & Kim, NeurIPS 2025, "PaTH Attention: Position Encoding
via Accumulating Householder Transformations"), https://arxiv.org/abs/2505.16381

RoPE puts a fixed rotation R^(i - j) between query i and key j. PaTH puts the product of one transform per token
between them, each made from that token's own content:

    s_ij = q_i^T H_i H_(i-1) ... H_(j+1) k_j / sqrt(hs),      H_t = I - beta_t w_t w_t^T

with w_t a unit vector per head and beta_t = 2 sigmoid(.) in (0, 2) (beta > 1 reflects: negative eigenvalues).
Every token between key and query turns the key a little, by how much and which way its content says, so distance is
measured in what lies between, not in positions: nothing reads an index. (Key j is turned first by H_(j+1), last by
H_i: the order of fla's decoding, which updates every cached key with each new token's H.)

Per layer and head, as fla's ``PaTHAttention`` (``fla/layers/path_attn.py``) makes them: w = l2norm(SiLU(causal
conv, kernel 3, of a low-rank projection C -> 32 -> C of the layer's input)), split by head; beta = 2 sigmoid(a linear
map of the input, with bias). Initialisation as fla's ``_init_weights``: every Linear and the Conv1d N(0, 0.02),
biases 0. Options the reference leaves off stay off: no forget gate (``use_forget_gate``), no q/k norm.

How it is computed (the paper's blockwise algorithm, in PyTorch): keys in chunks of 64. A product of Householders over
a range has the compact form I - W^T T W (W the range's w rows, T = (I + diag(beta) striu(W W^T))^-1 diag(beta),
upper triangular, one triangular solve per chunk), and T of a sub-range is T's diagonal block, so within a chunk
every pair's product comes from one T. Keys of earlier chunks are carried forward chunk by chunk through each chunk's
whole product (a hs x hs matrix). fla's kernels (``fla/ops/path_attn/``) are fused Triton code; the reference the
tests hold this to is written from the equation above and from fla's decoding loop (rank-one updates of the keys).
Shapes: x (B, T, C); w (B, H, T, hs); beta (B, H, T); state (B, H, T, hs + 1); q, k (B, H, T|Tk, hs).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from posviz.config import require
from posviz.positions.base import PositionMethod, run_start
from posviz.positions.short_conv import causal_conv

CHUNK = 64  # keys per chunk of the compact form: fla's block size; the triangular solve stays well conditioned
L2_EPS = 1e-6  # fla's l2_norm: x / sqrt(sum x^2 + eps)


@dataclasses.dataclass
class PathOptions:
    w_rank: int = 32  # fla: w_proj = Linear(C, 32) then Linear(32, C) when heads == kv heads
    conv_kernel: int = 3  # fla: ShortConvolution(kv_dim, 3) over w

    def __post_init__(self):
        require(isinstance(self.w_rank, int) and self.w_rank >= 1, f"PaTH's w_rank must be a positive integer, got {self.w_rank!r}")
        require(self.conv_kernel == 3, f"PaTH's conv_kernel is fla's 3 (reads_before counts on it), got {self.conv_kernel!r}")


class PathLayer(nn.Module):
    """One layer's maps from its input to w and beta."""

    def __init__(self, n_embd: int, n_head: int, rank: int, kernel: int):
        super().__init__()
        self.w_down = nn.Linear(n_embd, rank, bias=False)
        self.w_up = nn.Linear(rank, n_embd, bias=False)
        self.w_conv = nn.Conv1d(n_embd, n_embd, kernel, groups=n_embd, bias=False)
        self.beta = nn.Linear(n_embd, n_head, bias=True)
        for module in (self.w_down, self.w_up, self.w_conv, self.beta):  # fla's _init_weights
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.beta.bias)


class PathAttention(PositionMethod):
    name = "path"
    display_name = "PaTH"
    summary = ("Between key and query, one Householder reflection per token in between, each made from that "
               "token's content: distance is what lies between, not how many positions.")
    paper = "https://arxiv.org/abs/2505.16381"
    acts_on = "q/k"
    kind = "content"
    learned = True
    Options = PathOptions
    explore_sections = ("path-turn",)
    reads_before = 2  # fla's kernel-3 convolution over w: a key's w reads the 2 bytes before it (conv_kernel - 1)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        self.layers = nn.ModuleList(PathLayer(shape.n_embd, shape.n_head, self.options.w_rank, self.options.conv_kernel)
                                    for _ in range(shape.n_layer))

    def directions(self, layer: int, x: torch.Tensor, cache=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(w (B, H, T, hs) unit vectors, beta (B, H, T) in (0, 2)) of the tokens x (B, T, C) in ``layer``."""
        B, T, C = x.shape
        p = self.layers[layer]
        u = F.linear(F.linear(x, p.w_down.weight), p.w_up.weight)  # (B, T, C)
        u = F.silu(causal_conv(u, p.w_conv.weight[:, 0], cache, (layer, "path_w")))
        w = u.view(B, T, self.shape.n_head, -1).transpose(1, 2)  # (B, H, T, hs)
        w = w * torch.rsqrt((w * w).sum(-1, keepdim=True) + L2_EPS)
        beta = 2.0 * torch.sigmoid(F.linear(x, p.beta.weight, p.beta.bias)).transpose(1, 2)  # (B, H, T)
        return w, beta

    def token_state(self, layer, x, cache=None):
        w, beta = self.directions(layer, x, cache)
        return torch.cat((w, beta[..., None]), dim=-1)  # (B, H, T, hs + 1): kept beside the keys

    def content_scorer(self, layer, q, k, state, q_pos=None, cache=None):
        state = state.to(q.dtype)  # the cache keeps it in the keys' dtype; the products run in attention's (>= fp32)
        w, beta = state[..., :-1], state[..., -1]
        start = None if q_pos is None or cache is None or not cache.attended_keys_are_run else run_start(q_pos)
        if start is None:
            return ChunkedScores(q, k, w, beta)
        # Cached decoding as fla's: the cache keeps every key turned by the bytes after it up to the newest (under
        # (layer, "path_turned"), with the position of the newest), so a step turns them once more by its own byte's
        # H (a rank-one update of each) and scores q . k plainly, where re-forming every chunk's compact form would
        # cost a triangular solve per 64 keys at every byte. Kept only while the keys are one run ending right
        # before the step (a window drops the oldest rows); anything else scores from the keys as written.
        held = cache.recent.get((layer, "path_turned"))
        T, Tk = q.shape[2], k.shape[2]
        if held is not None and isinstance(held[0], ChunkedScores):  # a pass's scorer: its keys turned to its end
            held = cache.recent[(layer, "path_turned")] = (held[0].all_turned().detach(), held[1])
        if (T == 1 and held is not None and held[1] == start - 1 and held[0].shape[2] >= Tk - 1
                and held[0].shape[:2] == k.shape[:2]):
            before = held[0][:, :, held[0].shape[2] - (Tk - 1):]
            w_t, b_t = w[:, :, -1], beta[:, :, -1]  # (B, H, hs), (B, H): the new byte's H
            before = before - b_t[..., None, None] * (before @ w_t[..., None]) * w_t[:, :, None, :]
            turned = torch.cat((before, k[:, :, -1:]), dim=2)
            cache.recent[(layer, "path_turned")] = (turned.detach(), start)
            return lambda r0, r1, seen, qp=None, kp=None: (q[:, :, r0:r1] @ turned[:, :, :seen].transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scorer = ChunkedScores(q, k, w, beta)
        # the keys turned to this pass's end are worked out when the next step asks: by then the pass has carried
        # them to its last chunk, one or two steps short of the end
        cache.recent[(layer, "path_turned")] = (scorer, start + T - 1)
        return scorer

    def turned_keys(self, k, state):
        """Every key turned by the H of each token after it up to the last: (H_(T-1) ... H_(j+1)) k_j, as the last
        query reads it. One token at a time, as fla's decoding turns its cache (the page draws 256 bytes at most)."""
        w, beta = state[..., :-1], state[..., -1]
        out = k.clone()
        for t in range(1, k.shape[2]):  # token t turns every key before it
            before = out[:, :, :t]
            out[:, :, :t] = before - beta[:, :, t, None, None] * (before @ w[:, :, t, :, None]) * w[:, :, t, None, :]
        return out


class ChunkedScores:
    """The scores s_ij of one layer's pass, block by block of queries, from chunks of CHUNK keys (module docstring).

    Made once per layer from all queries q (B, H, T, hs) (the last T of the Tk keys) and keys k, w (B, H, Tk, hs),
    beta (B, H, Tk). Called with a block of queries r0..r1 that sees keys 0..seen-1, it returns (B, H, rows, seen):
    exact for every key at or before each query, 0 for the later ones (attention masks those). Blocks asked in order
    reuse the keys carried forward so far; one asked out of order starts them again."""

    def __init__(self, q, k, w, beta):
        B, H, Tk, hs = k.shape
        self.q, self.n_keys, self.scale = q, Tk, 1.0 / math.sqrt(hs)
        n = -(-Tk // CHUNK)
        pad = n * CHUNK - Tk  # a padded key has w = 0 and beta = 0: H = I, it changes nothing
        self.k = F.pad(k, (0, 0, 0, pad)).view(B, H, n, CHUNK, hs)
        self.w = F.pad(w, (0, 0, 0, pad)).view(B, H, n, CHUNK, hs)
        b = F.pad(beta, (0, pad)).view(B, H, n, CHUNK)
        gram = self.w @ self.w.transpose(-1, -2)  # (B, H, n, C, C): w_s . w_t
        eye = torch.eye(CHUNK, dtype=k.dtype, device=k.device)
        # T = (I + diag(beta) striu(W W^T))^-1 diag(beta): the compact form of H_a ... H_b over a chunk
        self.t = torch.linalg.solve_triangular(eye + b[..., :, None] * gram.triu(1), torch.diag_embed(b), upper=True)
        self.tt = self.t.transpose(-1, -2)  # T^T, lower triangular: the reversed product H_b ... H_a
        # each key turned by the tokens after it in its own chunk: k~_j = (H_end ... H_(j+1)) k_j
        after = (self.w @ self.k.transpose(-1, -2)).tril(-1)  # (.., t, j): w_t . k_j where t > j
        self.k_in = self.k - (self.tt @ after).transpose(-1, -2) @ self.w  # (B, H, n, C, hs)
        # a chunk's whole reversed product as a matrix, to carry earlier keys across it: M = I - W^T T^T W
        self.m = torch.eye(hs, dtype=k.dtype, device=k.device) - self.w.transpose(-1, -2) @ self.tt @ self.w
        self.carried, self.upto = None, 0  # keys 0 .. upto*CHUNK - 1 turned by every H up to that chunk's end

    def _keys_before(self, c: int) -> torch.Tensor | None:
        """(B, H, c*CHUNK, hs): every key before chunk ``c`` turned by all the H of the tokens up to chunk c's start."""
        if c < self.upto:  # asked out of order: start again
            self.carried, self.upto = None, 0
        while self.upto < c:
            j = self.upto
            moved = None if self.carried is None else self.carried @ self.m[:, :, j].transpose(-1, -2)
            self.carried = self.k_in[:, :, j] if moved is None else torch.cat((moved, self.k_in[:, :, j]), dim=2)
            self.upto += 1
        return self.carried

    def all_turned(self) -> torch.Tensor:
        """(B, H, Tk, hs) every key turned by the H of each byte after it, up to the last: what the last query reads."""
        return self._keys_before(self.k.shape[2])[:, :, :self.n_keys]

    def __call__(self, r0: int, r1: int, seen: int, qp=None, kp=None) -> torch.Tensor:
        B, H, _, hs = self.q.shape
        offset = seen - r1  # key index of query row r: offset + r (the new queries are the last keys)
        out = self.q.new_zeros(B, H, r1 - r0, seen)
        a, end = offset + r0, offset + r1
        while a < end:
            c = a // CHUNK
            b = min(end, (c + 1) * CHUNK)
            q = self.q[:, :, a - offset:b - offset]  # (B, H, rows, hs): queries at key indices a..b-1
            lo = c * CHUNK
            w, t_t, k = self.w[:, :, c], self.tt[:, :, c], self.k[:, :, c]
            # (q . w_s) for s <= i in the chunk, times T^T: the query side of the in-chunk products
            row = torch.arange(a - lo, b - lo, device=q.device)[:, None]
            qw = (q @ w.transpose(-1, -2)).masked_fill(torch.arange(CHUNK, device=q.device)[None, :] > row, 0.0)
            y = qw @ t_t  # (B, H, rows, C)
            # keys in the query's own chunk: q . k_j - sum_{j < t <= s <= i} (q . w_s) T_ts (w_t . k_j)
            inside = q @ k.transpose(-1, -2) - y @ (w @ k.transpose(-1, -2)).tril(-1)  # (B, H, rows, C)
            width = min(CHUNK, seen - lo)
            out[:, :, a - offset - r0:b - offset - r0, lo:lo + width] = inside[..., :width] * self.scale
            if c:  # earlier chunks: the query turned back to its chunk's start, against the keys carried to it
                q_hat = q - y @ w
                out[:, :, a - offset - r0:b - offset - r0, :lo] = (q_hat @ self._keys_before(c).transpose(-1, -2)) * self.scale
            a = b
        return out
