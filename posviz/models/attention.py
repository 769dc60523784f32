"""The byte GPT's causal self-attention: one path for every position method (the method's three hooks,
``positions.base``), walking its queries in blocks so that a long text's scores never fill memory, and
the shortcuts for biases that depend on distance only. Attention never asks which method it has.

Shape legend as in ``byte_gpt``: B batch, H heads, Tq queries, Tk keys, hs head size.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from posviz.config import ModelConfig
from posviz.models.kv_cache import KVCache
from posviz.positions import POSITION_METHODS, PositionMethod
from posviz.positions.base import Seen, mark_run, may_overwrite, run_start


BLOCK_ELEMENTS = 1 << 21  # scores per query block (8 MB in fp32): small enough to stay in a CPU's cache
# On a GPU the CPU's cache size means nothing, and each block is a few kernel launches: at 8,192 bytes
# the CPU block would be 2 query rows, thousands of launches per pass. 64 M scores (256 MB in fp32)
# keep a block's temporaries far below the smallest GPU's memory while a pass takes a few blocks.
BLOCK_ELEMENTS_CUDA = 1 << 26


def block_elements(device) -> int:
    """Scores per query block on ``device``."""
    return BLOCK_ELEMENTS_CUDA if device is not None and torch.device(device).type == "cuda" else BLOCK_ELEMENTS


MASK_ALIGNMENT_BYTES = 16  # what the CUDA memory-efficient kernel reads at a time from an attention mask


def _out_like(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An empty (B, H, T, width of v) output for queries ``q``: the values' width, which a method may make differ from
    the queries' (PoPE's queries and keys are twice as wide)."""
    return q.new_empty(*q.shape[:-1], v.shape[-1])


def _sdpa(q, k, v, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with v padded to the width of q where the two differ (PoPE): the fused CPU
    kernel takes only equal widths (else a path about 10x slower); the padding's output columns are dropped."""
    if v.shape[-1] == q.shape[-1]:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    y = F.scaled_dot_product_attention(q, k, F.pad(v, (0, q.shape[-1] - v.shape[-1])), **kwargs)
    return y[..., :v.shape[-1]]


def _round_up(n: int, multiple: int = 16) -> int:
    """``n`` rounded up to a multiple of ``multiple``: mask rows of 16 elements keep every row of a view
    on an aligned start, whatever the dtype (16 >= the elements in 16 bytes)."""
    return -(-n // multiple) * multiple


def _mask_alignment(dtype: torch.dtype) -> int:
    """Elements per 16 bytes: a mask view read in place must start and step by multiples of this."""
    return max(1, MASK_ALIGNMENT_BYTES // torch.empty((), dtype=dtype).element_size())


class QueryBlocks:
    """How one forward pass walks through its queries when attention needs an explicit mask.

    Every layer of a forward pass sees the same query and key positions, so the blocks, their
    position tensors and their visibility masks are made once and shared. Because the tensors are
    the same objects in every layer, a method that memoises its bias by position tensor (ALiBi, T5)
    builds each block's bias once per forward pass, not once per layer.

    Why blocks: the new queries are the last T keys, so the block of queries ending at row r never
    sees keys past Tk - T + r. Going through the queries a block at a time skips the future half of
    the work, as the fused causal kernel does, and keeps every temporary small. At 4,096 bytes a
    whole (B, H, T, Tk) bias or score tensor is 256 MB, and allocating one costs as much as using it.
    """

    def __init__(self, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None, batch_heads: int, device,
                 q0: int | None = None, keys_are_run: bool | None = None):
        T, Tk = q_pos.numel(), k_pos.numel()
        rows = max(1, block_elements(device) // (batch_heads * Tk))
        # Runs known without reading (q0: first query; keys_are_run: what the cache knows of its keys):
        # the blocks' positions are then noted as runs too, and a decoding step needs no mask.
        q0 = run_start(q_pos) if q0 is None else q0
        k0 = None
        if q0 is not None:
            k0 = (q0 + T - Tk if keys_are_run else None) if keys_are_run is not None else run_start(k_pos)
        self.blocks = []  # (r0, r1, seen, q_pos, k_pos, visible (rows, seen) or None when every key is)
        for r0 in range(0, T, rows):
            r1 = min(T, r0 + rows)
            seen = Tk - T + r1
            qp, kp = q_pos[r0:r1].clone(), k_pos[:seen].clone()
            if k0 is not None:
                mark_run(qp, q0 + r0)
                mark_run(kp, k0)
            visible = qp[:, None] >= kp[None, :]  # keys at or before the query ...
            if window is not None:  # ... and inside its window
                visible &= qp[:, None] - kp[None, :] < window
            # One decoding step: typically nothing to mask. The keys a cache hands in for a step whose
            # keys are a run ending at the query are all visible (it keeps none past the window).
            if T == 1 and (k0 + Tk == q0 + T and (window is None or Tk <= window) if k0 is not None
                           else bool(visible.all())):
                visible = None
            self.blocks.append((r0, r1, seen, qp, kp, None if visible is None else visible.to(device)))
        self._masked: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # block -> (bias, bias with -inf)

    def masked_bias(self, block: int, bias: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """``bias`` with -inf where a key is unseen, reused while a layer hands in the very same bias
        (ALiBi and T5 share one across layers; Shaw's is new in every layer)."""
        hit = self._masked.get(block)
        if hit is None or hit[0] is not bias:
            hit = self._masked[block] = (bias, bias.masked_fill(~visible, float("-inf")))
        return hit[1]


FAST_PATHS = True  # False: every bias goes through ``logit_bias`` as an (H, Tq, Tk) tensor (the reference path)


@contextlib.contextmanager
def reference_attention():
    """Within this block attention ignores the optional shortcuts (``distance_bias``) and computes every
    bias through ``logit_bias``: the reference path the tests compare the shortcuts with."""
    global FAST_PATHS
    before, FAST_PATHS = FAST_PATHS, False
    try:
        yield
    finally:
        FAST_PATHS = before


class DistanceBlocks:
    """How attention walks its queries when the bias is a per-distance vector (``distance_bias``).

    For positions that are runs, the logit bias of query i for key j is t[d] with d = q_i - k_j. Put
    the vector in reverse order with -inf at every distance a query may not see (future keys, keys
    past the window): F[m] = t[d_max - m]. A block of queries *taken in reverse order* (row r = its
    last query) then has the bias F[c + r + j]: a view of F with strides (1, 1), so the bias of a block
    costs nothing to build and the (H, rows, keys) mask the kernel reads is a few KB that stay in
    cache. The reference path instead builds the mask entry by entry (a gather) and reads it from
    memory: at 4,096 bytes that was 2.3x the fused causal kernel's time; this runs at about 1.05x.

    Blocks as in ``QueryBlocks``: a block sees no key past its last query (nor, in a window, before
    the window of its first query), so the future half of the work is skipped.
    """

    def __init__(self, T: int, Tk: int, off: int, window: int | None, batch_heads: int, device=None):
        self.T, self.N, self.window = T, T + Tk - 1, window  # N: entries of F (every distance a pair has)
        self.d_max = off + T - 1  # distance of the last query to the first key
        self.max_visible = self.d_max if window is None else min(self.d_max, window - 1)
        rows = max(1, block_elements(device) // (batch_heads * Tk))
        self.blocks = []  # (r0, r1, first key, keys seen)
        for r0 in range(0, T, rows):
            r1 = min(T, r0 + rows)
            first = 0 if window is None else max(0, off + r0 - window + 1)
            self.blocks.append((r0, r1, first, Tk - T + r1))

    @classmethod
    def plan(cls, q_pos, k_pos, window, batch_heads, q0: int | None = None, keys_are_run: bool | None = None,
             device=None) -> "DistanceBlocks | None":
        """None unless both position lists are runs ending at the same position. ``q0``: the first query
        position when known to be a run's start; ``keys_are_run``: what the cache knows of its keys."""
        q0 = run_start(q_pos) if q0 is None else q0
        if keys_are_run is None:
            k0 = run_start(k_pos)
        else:
            k0 = q0 + q_pos.numel() - k_pos.numel() if keys_are_run and q0 is not None else None
        if q0 is None or k0 is None or q0 + q_pos.numel() - 1 != k0 + k_pos.numel() - 1:
            return None  # positions are no runs, or the last query is not the last key: use the reference path
        return cls(q_pos.numel(), k_pos.numel(), q0 - k0, window, batch_heads, device)

    def reversed_table(self, table: torch.Tensor, dtype) -> torch.Tensor:
        """F (H, N) from the bias at distances 0..max_visible (H, max_visible + 1); made once per forward
        pass when the layers share their table (ALiBi, T5, FIRE hand in the very same tensor)."""
        last = getattr(self, "_last", None)
        if last is not None and last[0] is table and last[1].dtype == dtype:
            return last[1]
        if self.max_visible == self.d_max == self.N - 1:  # every key visible to some query: no -inf part
            F_ = table.flip(-1).to(dtype).contiguous()  # (a decoding step with a full window); block_bias needs (N, 1) strides
        else:
            F_ = table.new_full((table.shape[0], self.N), float("-inf"), dtype=dtype)
            F_[:, self.d_max - self.max_visible:self.d_max + 1] = table.flip(-1)
        self._last = (table, F_)
        return F_

    def block_bias(self, F_: torch.Tensor, r0: int, r1: int, first: int, seen: int) -> torch.Tensor:
        """(1, H, rows, seen - first) view: the bias of queries r1-1 .. r0 (reversed) for keys first..seen-1."""
        return F_.as_strided((1, F_.shape[0], r1 - r0, seen - first), (0, self.N, 1, 1),
                             F_.storage_offset() + self.T - r1 + first)


def _narrower(a: int | None, b: int | None) -> int | None:
    """The smaller of two windows (None: no window)."""
    return b if a is None else a if b is None else min(a, b)


def _query_blocks(blocks: dict, pos, k_pos, window, batch_heads, device, cache) -> QueryBlocks:
    """The pass's ``QueryBlocks`` for ``window``, made once per forward pass and window: positions are the same
    in every layer, and a layout's sliding-window layers share theirs."""
    if ("plan", window) not in blocks:
        blocks[("plan", window)] = QueryBlocks(pos, k_pos, window, batch_heads, device, blocks.get("q_run"),
                                               None if cache is None else cache.attended_keys_are_run)
    return blocks[("plan", window)]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        method = POSITION_METHODS.get(cfg.position)  # a visitor's formula is none of these: plain projections
        # None: the method makes q, k and v itself (MLA's latents), and a c_attn would be weights nothing reads
        self.c_attn = None if method is not None and method.projects_heads else nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def heads(self, x: torch.Tensor, position: PositionMethod | None = None, layer: int = 0,
              cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, T, hs) each of the layer's input x (B, T, C), before any position method rotates or biases
        them; with ``position``, mixed with the previous positions' where the method mixes at site "B" (Canon-B).

        A functional call (not a module call) for the linear map: a cached step runs 17 of them on one
        byte, and the module machinery around each cost about as much as the product itself."""
        B, T, C = x.shape
        if self.c_attn is None:
            return position.project_heads(layer, x)
        qkv = F.linear(x, self.c_attn.weight, self.c_attn.bias)  # (B, T, 3C)
        if position is not None:
            qkv = position.mix_hidden(layer, "B", qkv, cache)
        return qkv.view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x, pos, position: PositionMethod, layer: int, cache: KVCache | None, want_probs: bool,
                blocks: dict):
        """(B, T, C) output through c_proj, and the weights (B, H, T, Tk) when ``want_probs``; each head's output
        multiplied first by the method's output gate, where it has one."""
        position = position.at_layer(layer)  # a layout's method for this layer; any other method is itself
        y, probs = self._attend(x, pos, position, layer, cache, want_probs, blocks)  # (B, H, T, hs of v)
        gate = position.output_gate(layer, x)
        return self._project(y if gate is None else y * gate.to(y.dtype)), probs

    def _attend(self, x, pos, position: PositionMethod, layer: int, cache: KVCache | None, want_probs: bool,
                blocks: dict):
        """Each head's output (B, H, T, hs of v) and the weights when ``want_probs``."""
        B, T, C = x.shape
        window = _narrower(None if cache is None else cache.max_size, position.window)  # of the cache and the layer
        q, k, v = self.heads(x, position, layer, cache)  # (B, H, T, hs) each
        q, k = position.rotate_qk(q, k, pos)
        state = position.token_state(layer, x, cache)  # (B, H, T), (B, H, T, m) or None: kept beside the keys
        width = 0 if state is None else (1 if state.dim() == 3 else state.shape[-1])
        if state is not None:  # extra features per key, so that a KV cache keeps them with the keys
            k = torch.cat((k, state.to(k.dtype).view(*state.shape[:3], width)), dim=-1)
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.append(layer, k, v, pos)  # (B, H, Tk, hs), (Tk,)
        dropout = self.dropout if self.training else 0.0
        if position.scores_itself:
            if state is not None:  # (B, H, Tk, hs), and (B, H, Tk) or (B, H, Tk, m) as the method gave it
                k, state = k[..., :-width], (k[..., -1] if state.dim() == 3 else k[..., -width:])
            folded = None if not FAST_PATHS or cache is not None or window is not None or want_probs \
                else position.folded_scores(layer, q, k, state)
            if folded is not None:  # the method's scores are dot products of longer vectors: the fused kernel
                q2, k2, scale = folded
                # v padded to the same width: the fused CPU kernel takes only equal widths (else a 10x slower path)
                v2 = F.pad(v, (0, q2.shape[-1] - v.shape[-1]))
                y = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, dropout_p=dropout, scale=scale)
                return y[..., :v.shape[-1]], None
            y, probs = self._attend_by_content(q, k, v, state, pos, k_pos, position, layer, cache, window, blocks,
                                               want_probs, dropout)
            return y, probs

        if not position.has_logit_bias and cache is None and window is None and not want_probs:
            # the one case the fused kernels handle alone
            y = _sdpa(q, k, v, is_causal=True, dropout_p=dropout)
            return y, None

        shortcut = position.has_distance_bias or position.has_banded_bias or position.has_relative_key_range
        if FAST_PATHS and shortcut and not (torch.is_grad_enabled() and q.requires_grad):
            if ("distance", window) not in blocks:  # once per forward pass (and window), as the plan below
                blocks[("distance", window)] = DistanceBlocks.plan(
                    pos, k_pos, window, B * self.n_head, blocks.get("q_run"),
                    None if cache is None else cache.attended_keys_are_run, q.device)
            plan = blocks[("distance", window)]
            table = None if plan is None else position.distance_bias(layer, pos, 0, plan.max_visible)
            if table is not None:
                y, probs = self._attend_by_distance(q, k, v, plan, table, want_probs, dropout)
                return y, probs
            band = None if plan is None else position.banded_bias(layer, q, pos)
            if band is not None:
                y, probs = self._attend_banded(q, k, v, plan, band, blocks, want_probs, dropout)
                return y, probs
            keys = None if plan is None or want_probs else position.relative_key_range(
                layer, q, plan.d_max - plan.N + 1, plan.d_max)
            if keys is not None:
                return self._attend_relative_shift(q, k, v, plan, *keys, dropout), None

        if (FAST_PATHS and T == 1 and not position.has_logit_bias and not want_probs and cache is not None
                and cache.attended_keys_are_run and window == cache.max_size):
            # a decoding step without a bias: the cache returned exactly the keys the query sees
            # (positions up to its own, inside its window), so nothing needs masking
            return _sdpa(q, k, v, dropout_p=dropout), None

        plan = _query_blocks(blocks, pos, k_pos, window, B * self.n_head, q.device, cache)
        Tk = k.shape[-2]
        y = _out_like(q, v)  # (B, H, T, hs of v)
        probs = q.new_zeros(B, self.n_head, T, Tk) if want_probs else None  # future keys stay exactly 0
        for i, (r0, r1, seen, qp, kp, visible) in enumerate(plan.blocks):
            qb, kb, vb = q[:, :, r0:r1], k[:, :, :seen], v[:, :, :seen]  # (B, H, rows|seen, hs)
            bias = position.logit_bias(layer, qb, qp, kp)  # None or broadcastable to (B, H, rows, seen)
            if want_probs:
                scores = torch.matmul(qb * (1.0 / math.sqrt(qb.shape[-1])), kb.transpose(-2, -1))  # (B, H, rows, seen)
                if bias is not None:
                    scores += bias
                scores = scores.float()
                if visible is not None:
                    scores.masked_fill_(~visible, float("-inf"))
                block = scores.softmax(dim=-1).to(q.dtype)
                probs[:, :, r0:r1, :seen] = block
                y[:, :, r0:r1] = block @ vb
            else:
                if visible is None:
                    mask = bias
                else:
                    mask = visible if bias is None else plan.masked_bias(i, bias, visible)
                y[:, :, r0:r1] = _sdpa(qb, kb, vb, attn_mask=mask, dropout_p=dropout)
        return y, probs

    def _attend_by_content(self, q, k, v, state, pos, k_pos, position: PositionMethod, layer: int, cache, window,
                           blocks: dict, want_probs: bool, dropout: float):
        """Attention for a method that reads content (``token_state``, ``content_bias``, ``attention_weights``) or
        remaps its pairs (``pair_scorer``): each block of queries is scored here, the method adds its bias and
        turns scores into weights."""
        B, H, T, hs = q.shape
        plan = _query_blocks(blocks, pos, k_pos, window, B * H, q.device, cache)  # as the bias path's
        Tk, work = k.shape[-2], torch.promote_types(q.dtype, torch.float32)
        y = _out_like(q, v)  # (B, H, T, hs of v)
        probs = q.new_zeros(B, H, T, Tk) if want_probs else None
        pair_scores = position.pair_scorer(layer, q.to(work), k.to(work), pos, k_pos)  # None unless a remap
        if pair_scores is None:  # a transform between key and query from the keys' states (PaTH); None: q . k
            pair_scores = position.content_scorer(layer, q.to(work), k.to(work), state, pos, cache)
        for i, (r0, r1, seen, qp, kp, visible) in enumerate(plan.blocks):
            qb, kb, vb = q[:, :, r0:r1], k[:, :, :seen], v[:, :, :seen]
            if ("seen", window, i) not in blocks:  # once per forward pass: every layer sees the same keys
                blocks[("seen", window, i)] = (  # a decoding step that sees every key it was handed has no mask
                    torch.ones(r1 - r0, seen, dtype=torch.bool, device=q.device) if visible is None else visible,
                    torch.arange(Tk - T + r0, Tk - T + r1, device=q.device))
            view = Seen(*blocks[("seen", window, i)], None if state is None else state[:, :, :seen])
            # at least float32: the methods take sigmoids, logs and cumulative sums of the scores
            if pair_scores is not None:  # a remap's: each pair scored at positions of its own
                scores = pair_scores(r0, r1, seen, qp, kp)
            else:
                scores = torch.matmul(qb.to(work), kb.to(work).transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, H, rows, seen)
            # the content bias reads the plain scores; an index bias is added too, for a method that has both
            for bias in [position.content_bias(layer, scores, qb, kb, view), position.logit_bias(layer, qb, qp, kp)]:
                if bias is not None:
                    # in place where nothing records it: the block's scores are its own, and the bias has read them
                    scores = scores.add_(bias) if may_overwrite(scores) else scores + bias
            weights = position.attention_weights(layer, scores, view).to(q.dtype)
            if want_probs:
                probs[:, :, r0:r1, :seen] = weights
            if dropout:
                weights = F.dropout(weights, p=dropout)
            y[:, :, r0:r1] = weights @ vb
        return y, probs

    def _project(self, y: torch.Tensor) -> torch.Tensor:
        """(B, H, T, hs) heads -> (B, T, C) through c_proj."""
        B, H, T, hs = y.shape
        return F.linear(y.transpose(1, 2).reshape(B, T, H * hs), self.c_proj.weight, self.c_proj.bias)

    @staticmethod
    def _attend_by_distance(q, k, v, plan: DistanceBlocks, table, want_probs: bool, dropout: float):
        """Attention with the bias of ``plan``: each query block is taken in reverse order, so that its
        bias is a view of the reversed per-distance vector (see ``DistanceBlocks``)."""
        B, H, T, hs = q.shape
        F_ = plan.reversed_table(table.to(q.device), q.dtype)  # (H, N), -inf where a key is unseen
        if T == 1 and not want_probs:  # a decoding step: one query, nothing to reverse
            _, _, first, seen = plan.blocks[0]
            return F.scaled_dot_product_attention(q, k[:, :, first:seen], v[:, :, first:seen], dropout_p=dropout,
                                                  attn_mask=plan.block_bias(F_, 0, 1, first, seen)), None
        y = _out_like(q, v)  # (B, H, T, hs of v)
        probs = q.new_zeros(B, H, T, k.shape[-2]) if want_probs else None
        for r0, r1, first, seen in plan.blocks:
            bias = plan.block_bias(F_, r0, r1, first, seen)  # (1, H, rows, keys), rows reversed
            flip = r1 - r0 > 1
            qb = q[:, :, r0:r1].flip(2) if flip else q[:, :, r0:r1]
            kb, vb = k[:, :, first:seen], v[:, :, first:seen]
            if want_probs:
                scores = torch.matmul(qb * (1.0 / math.sqrt(hs)), kb.transpose(-2, -1))  # (B, H, rows, keys)
                scores += bias
                block = scores.float().softmax(dim=-1).to(q.dtype)
                probs[:, :, r0:r1, first:seen] = block.flip(2) if flip else block
                out = block @ vb
            else:
                out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=bias, dropout_p=dropout)
            y[:, :, r0:r1] = out.flip(2) if flip else out
        return y, probs

    @staticmethod
    def _attend_banded(q, k, v, plan: DistanceBlocks, band, blocks: dict, want_probs: bool, dropout: float):
        """Attention with a query-dependent bias of a clipped distance (``banded_bias``, (B, H, T, K+1)).

        Past K the bias is one value per query, which the softmax cancels: subtract it, and the mask of
        a block is 0 for far keys, -inf for unseen ones and the K near-diagonal values in between. Seen
        from its bottom-right corner (the block's last query and its own key) that pattern is the same
        for every block and layer of a forward pass, so it is written once into a buffer, and each
        block writes only its band (rows x K values) through a strided view before reading the mask
        as a view of that buffer. The reference path builds and masks a (B, H, rows, keys) bias per
        block instead.
        """
        B, H, T, hs = q.shape
        K = band.shape[-1] - 1
        Kb = K if plan.window is None else min(K, plan.window)  # band distances that can be visible
        if T == 1 and not want_probs:  # a decoding step: the cache returned only keys the query sees
            _, _, first, seen = plan.blocks[0]
            nk = seen - first
            near = min(Kb, nk)
            # strides a multiple of 16 elements, as for the blocks below
            mask = band.new_zeros(B, H, 1, _round_up(nk))[..., :nk]
            mask[..., nk - near:] = (band[..., :near] - band[..., K:]).flip(-1)  # key nk-1-d at distance d
            return F.scaled_dot_product_attention(q, k[:, :, first:seen], v[:, :, first:seen], attn_mask=mask,
                                                  dropout_p=dropout), None
        # Why the buffer is larger than the largest block (A - 1 more rows, width padded to A columns):
        # the CUDA memory-efficient kernel reads the mask 16 bytes at a time and PyTorch checks only
        # its strides, not where the view starts. A block's view starting off a 16-byte boundary
        # (lengths like 768 or 1536) is then "misaligned address", sticky for the whole process.
        # The pattern depends on (row - column) alone, so each block takes its view a few rows and
        # columns up the same diagonal, at a column that is a multiple of A.
        A = _mask_alignment(q.dtype)
        R = max(r1 - r0 for r0, r1, _, _ in plan.blocks)  # rows of the largest block
        width = max(max(seen - first for _, _, first, seen in plan.blocks), R + Kb - 1)
        Rb, Wb = R + A - 1, _round_up(width + A - 1)  # rows, columns (whole 16-element rows: PyTorch reads a view in place)
        key = ("band", B, H, R, width, K, q.dtype, plan.window)
        buf = blocks.get(key)
        if buf is None:  # the 0 / -inf pattern, once per forward pass
            d = torch.arange(Rb, device=q.device)[:, None] - torch.arange(Wb, device=q.device)[None, :] + (Wb - Rb)
            unseen = d < 0 if plan.window is None else (d < 0) | (d >= plan.window)  # d: distance from bottom-right
            buf = blocks[key] = torch.zeros(Rb, Wb, dtype=q.dtype, device=q.device).masked_fill_(
                unseen, float("-inf")).expand(B, H, Rb, Wb).contiguous()
        y = _out_like(q, v)
        probs = q.new_zeros(B, H, T, k.shape[-2]) if want_probs else None
        for r0, r1, first, seen in plan.blocks:
            rows, nk = r1 - r0, seen - first
            s = -nk % A  # steps up the diagonal that put the view's first column on a multiple of A
            top, left = Rb - rows - s, Wb - nk - s  # the view's corner in the buffer
            if Kb:  # row r of the buffer, distance d < Kb sits at column Wb - Rb + r - d
                near = buf.as_strided((B, H, rows, Kb), (H * Rb * Wb, Rb * Wb, Wb + 1, 1),
                                      buf.storage_offset() + top * (Wb + 1) + Wb - Rb - Kb + 1)
                near.copy_((band[:, :, r0:r1, :Kb] - band[:, :, r0:r1, K:]).flip(-1))
            mask = buf[:, :, top:top + rows, left:left + nk]  # (B, H, rows, keys) view
            kb, vb = k[:, :, first:seen], v[:, :, first:seen]
            if want_probs:
                scores = torch.matmul(q[:, :, r0:r1] * (1.0 / math.sqrt(hs)), kb.transpose(-2, -1))
                scores += mask
                block = scores.float().softmax(dim=-1).to(q.dtype)
                probs[:, :, r0:r1, first:seen] = block
                y[:, :, r0:r1] = block @ vb
            else:
                y[:, :, r0:r1] = F.scaled_dot_product_attention(q[:, :, r0:r1], kb, vb, attn_mask=mask,
                                                                dropout_p=dropout)
        return y, probs

    @staticmethod
    def _attend_relative_shift(q, k, v, plan: DistanceBlocks, query, rel_keys, dropout: float):
        """Attention with a bias ``query_i . rel_keys[i - j] / sqrt(hs)`` for every distance (``relative_key_range``).

        For a block of queries, S = query . rel_keys[d0 .. d0 + rows + keys - 2] holds the bias of query
        i at distance d0 + c in column c. With the block's keys in reverse order (key column j' is the
        key at distance d0 + i + j'), the bias of (i, j') is S[i, i + j']: a view of S with strides
        (width + 1, 1), Transformer-XL's "relative shift" without a copy. The softmax does not care
        in which order the keys come, so the keys and values are read reversed (one flip per layer).
        """
        B, H, T, hs = q.shape
        Tk, d_min = k.shape[-2], plan.d_max - plan.N + 1
        k_rev, v_rev = k.flip(2), v.flip(2)
        y = _out_like(q, v)
        query = query / math.sqrt(hs)  # scaled once here, not every block's (rows, width) product: 9 % of the pass
        for r0, r1, first, seen in plan.blocks:
            rows, nk = r1 - r0, seen - first
            width = rows + nk - 1
            d0 = plan.d_max - (T - 1) + r0 - seen + 1  # distance of query r0 to key seen - 1
            table = rel_keys[..., d0 - d_min:d0 - d_min + width, :]  # (H, width, hs)
            S = query[:, :, r0:r1] @ table.transpose(-1, -2)  # (B, H, rows, width)
            if d0 < 0:
                S[..., :-d0] = float("-inf")  # future keys
            if plan.window is not None and plan.window - d0 < width:
                S[..., max(0, plan.window - d0):] = float("-inf")  # keys past the window
            bias = S.as_strided((B, H, rows, nk), (H * rows * width, rows * width, width + 1, 1), S.storage_offset())
            y[:, :, r0:r1] = F.scaled_dot_product_attention(
                q[:, :, r0:r1], k_rev[:, :, Tk - seen:Tk - first], v_rev[:, :, Tk - seen:Tk - first],
                attn_mask=bias, dropout_p=dropout)
        return y
