"""A GPT-2-style byte-level decoder whose position method is a constructor argument.

Pre-LayerNorm blocks, GELU MLP, biases, tied input/output embeddings, as in GPT-2. The position
method plugs in at three fixed hooks (see ``positions.base``) and attention never asks which method
it has. Shape legend: B batch, T sequence length (Tq queries, Tk keys), C n_embd, H n_head, hs head
size, V vocab (256 bytes).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .errors import PosvizError
from .positions import ModelShape, PositionMethod, build_position_method
from .positions.base import mark_run, position_range, run_start


def _reads_are_free(t: torch.Tensor) -> bool:
    """Whether reading a value of ``t`` costs no wait for a device (the tests pretend it does)."""
    return t.device.type == "cpu"


@dataclass
class KVCache:
    """Keys and values per layer, with the absolute position each key was written at.

    ``max_size`` turns it into a sliding window: the oldest entries are dropped once it is full.
    Keys are cached *after* rotation, so a rotary key keeps the angle of the position it was seen at.

    Storage is one buffer per layer with room to spare: a step writes its keys after the last ones
    and the attention reads a view, so decoding does not copy the whole cache for every byte (a
    ``torch.cat`` per layer per step was a quarter of a cached step). When a window's buffer is
    full, the keys still needed move to its front, once every ``max_size`` or so steps.
    """

    n_layer: int
    max_size: int | None = None
    keys: list = field(default_factory=list)  # per layer: buffer (B, H, capacity, hs); see _filled
    values: list = field(default_factory=list)
    positions: torch.Tensor | None = None  # (Tk,) of the kept keys, shared by all layers

    def __post_init__(self):
        if self.max_size is not None and not (isinstance(self.max_size, int) and self.max_size >= 1):
            raise PosvizError(f"KV cache max_size must be a positive integer or None, got {self.max_size!r}")
        self.keys = [None] * self.n_layer
        self.values = [None] * self.n_layer
        self._filled = [0] * self.n_layer  # entries of each buffer in use
        self._last = None  # last position written (int), so a step needs no read of ``positions``
        self.keys_are_run = True  # the kept positions are p0, p0+1, ... (attention's shortcuts need it)
        self._known = None  # the ``positions`` tensor _last and keys_are_run describe

    def _sync(self) -> None:
        """Re-read _last and keys_are_run when ``positions`` was set from outside (a lab relabels it)."""
        if self.positions is not self._known:
            self._known = self.positions
            start = None if self.positions is None else run_start(self.positions)  # a noted run: no read
            self._last = None if self.positions is None else (
                start + self.positions.numel() - 1 if start is not None else int(self.positions[-1]))
            self.keys_are_run = self.positions is None or start is not None

    @property
    def attended_keys_are_run(self) -> bool:
        """Whether the keys of the step being appended (old and new) are a run: for attention, after append."""
        return self._new_is_run

    def next_position(self) -> int:
        """The position right after the last cached key (0 for an empty cache)."""
        self._sync()
        return 0 if self._last is None else self._last + 1

    def __len__(self) -> int:
        return 0 if self.positions is None else int(self.positions.numel())

    def _make_room(self, layer: int, k: torch.Tensor, v: torch.Tensor, keep: int) -> None:
        """Ensure the buffers can take ``k.shape[2]`` more entries after the last ``keep`` ones."""
        T, n, buf = k.shape[2], self._filled[layer], self.keys[layer]
        if buf is not None and n + T <= buf.shape[2]:
            return
        capacity = 2 * (keep + T) if self.max_size is None else 2 * (self.max_size + T)
        new_k = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
        new_v = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
        if buf is not None and keep:
            new_k[:, :, :keep] = buf[:, :, n - keep:n]
            new_v[:, :, :keep] = self.values[layer][:, :, n - keep:n]
        self.keys[layer], self.values[layer], self._filled[layer] = new_k, new_v, keep

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor):
        """Add this step's keys/values; return the keys, values and key positions this step attends to.

        With a window, every query sees the ``max_size`` keys ending at itself (attention masks the
        older ones), so a chunk of T new queries needs the last ``max_size + T - 1`` keys although only
        the last ``max_size`` are kept: a chunk then gives exactly what feeding its bytes one by one gives.
        """
        T, n = k.shape[2], self._filled[layer]
        if layer == 0:  # positions are the same for every layer; update them once per step
            self._sync()
            self._new_positions = pos if self.positions is None else torch.cat((self.positions, pos))
            start = run_start(pos)
            self._new_is_run = start is not None and (self._last is None or (self.keys_are_run and start == self._last + 1))
            self._new_last = int(pos[-1]) if start is None else start + T - 1
            if self._new_is_run:  # so that nothing downstream reads the key positions back
                mark_run(self._new_positions, self._new_last + 1 - self._new_positions.numel())
        k_pos = self._new_positions
        keep = n if self.max_size is None else min(n, self.max_size - 1)  # old keys this step still needs
        if self.keys[layer] is not None and self.keys[layer].shape[:2] != k.shape[:2]:
            raise PosvizError(f"this KV cache holds batch x heads {tuple(self.keys[layer].shape[:2])}, "
                              f"got {tuple(k.shape[:2])}")
        self._make_room(layer, k, v, keep)
        n = self._filled[layer]
        keys, values = self.keys[layer], self.values[layer]
        keys.narrow(2, n, T).copy_(k)  # narrow + copy_: a slice assignment costs several times more per step
        values.narrow(2, n, T).copy_(v)
        self._filled[layer] = n = n + T
        needed = n if self.max_size is None else min(n, self.max_size + T - 1)
        k, v = keys.narrow(2, n - needed, needed), values.narrow(2, n - needed, needed)
        k_pos = k_pos[-needed:]
        if self._new_is_run:
            mark_run(k_pos, self._new_last + 1 - needed)
        if layer == self.n_layer - 1:
            self.positions = self._new_positions if self.max_size is None else self._new_positions[-self.max_size:]
            if self._new_is_run:
                mark_run(self.positions, self._new_last + 1 - self.positions.numel())
            self.keys_are_run, self._last, self._known = self._new_is_run, self._new_last, self.positions
        return k, v, k_pos


BLOCK_ELEMENTS = 1 << 21  # scores per query block (8 MB in fp32): small enough to stay in a CPU's cache
# On a GPU the CPU's cache size means nothing, and each block is a few kernel launches: at 8,192 bytes
# the CPU block would be 2 query rows, thousands of launches per pass. 64 M scores (256 MB in fp32)
# keep a block's temporaries far below the smallest GPU's memory while a pass takes a few blocks.
BLOCK_ELEMENTS_CUDA = 1 << 26


def block_elements(device) -> int:
    """Scores per query block on ``device``."""
    return BLOCK_ELEMENTS_CUDA if device is not None and torch.device(device).type == "cuda" else BLOCK_ELEMENTS


MASK_ALIGNMENT_BYTES = 16  # what the CUDA memory-efficient kernel reads at a time from an attention mask


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
            if T == 1 and (k0 + Tk == q0 + T if k0 is not None else bool(visible.all())):
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


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x, pos, position: PositionMethod, layer: int, cache: KVCache | None, want_probs: bool,
                blocks: dict):
        B, T, C = x.shape
        # Functional calls (not module calls) for the linear maps: a cached step runs 17 of them on one
        # byte, and the module machinery around each cost about as much as the product itself.
        qkv = F.linear(x, self.c_attn.weight, self.c_attn.bias).view(B, T, 3, self.n_head, C // self.n_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, T, hs) each
        q, k = position.rotate_qk(q, k, pos)
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.append(layer, k, v, pos)  # (B, H, Tk, hs), (Tk,)
        dropout = self.dropout if self.training else 0.0

        if not position.has_logit_bias and cache is None and not want_probs:
            # the one case the fused kernels handle alone
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
            return self._project(y), None

        shortcut = position.has_distance_bias or position.has_banded_bias or position.has_relative_key_range
        if FAST_PATHS and shortcut and not (torch.is_grad_enabled() and q.requires_grad):
            if "distance" not in blocks:  # once per forward pass, as the plan below
                blocks["distance"] = DistanceBlocks.plan(
                    pos, k_pos, None if cache is None else cache.max_size, B * self.n_head, blocks.get("q_run"),
                    None if cache is None else cache.attended_keys_are_run, q.device)
            plan = blocks["distance"]
            table = None if plan is None else position.distance_bias(layer, pos, 0, plan.max_visible)
            if table is not None:
                y, probs = self._attend_by_distance(q, k, v, plan, table, want_probs, dropout)
                return self._project(y), probs
            band = None if plan is None else position.banded_bias(layer, q, pos)
            if band is not None:
                y, probs = self._attend_banded(q, k, v, plan, band, blocks, want_probs, dropout)
                return self._project(y), probs
            keys = None if plan is None or want_probs else position.relative_key_range(
                layer, q, plan.d_max - plan.N + 1, plan.d_max)
            if keys is not None:
                return self._project(self._attend_relative_shift(q, k, v, plan, *keys, dropout)), None

        if (FAST_PATHS and T == 1 and not position.has_logit_bias and not want_probs and cache is not None
                and cache.attended_keys_are_run):
            # a decoding step without a bias: the cache returned exactly the keys the query sees
            # (positions up to its own, inside its window), so nothing needs masking
            return self._project(F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)), None

        if "plan" not in blocks:  # once per forward pass: positions are the same in every layer
            blocks["plan"] = QueryBlocks(pos, k_pos, None if cache is None else cache.max_size, B * self.n_head, q.device,
                                         blocks.get("q_run"), None if cache is None else cache.attended_keys_are_run)
        Tk = k.shape[-2]
        y = torch.empty_like(q)  # (B, H, T, hs)
        probs = q.new_zeros(B, self.n_head, T, Tk) if want_probs else None  # future keys stay exactly 0
        plan = blocks["plan"]
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
                y[:, :, r0:r1] = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=dropout)
        return self._project(y), probs

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
        y = torch.empty_like(q)  # (B, H, T, hs)
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
        key = ("band", B, H, R, width, K, q.dtype)
        buf = blocks.get(key)
        if buf is None:  # the 0 / -inf pattern, once per forward pass
            d = torch.arange(Rb, device=q.device)[:, None] - torch.arange(Wb, device=q.device)[None, :] + (Wb - Rb)
            unseen = d < 0 if plan.window is None else (d < 0) | (d >= plan.window)  # d: distance from bottom-right
            buf = blocks[key] = torch.zeros(Rb, Wb, dtype=q.dtype, device=q.device).masked_fill_(
                unseen, float("-inf")).expand(B, H, Rb, Wb).contiguous()
        y = torch.empty_like(q)
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
        y = torch.empty_like(q)
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


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new", so exports match exactly
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        h = F.gelu(F.linear(x, self.c_fc.weight, self.c_fc.bias), approximate=self.gelu.approximate)
        return F.linear(h, self.c_proj.weight, self.c_proj.bias)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, pos, position, layer, cache, want_probs, blocks):
        a, probs = self.attn(self.ln_1(x), pos, position, layer, cache, want_probs, blocks)
        x = x + a
        ln = self.ln_2
        x = x + self.mlp(F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps))
        return x, probs


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, V)
    attention: torch.Tensor | None = None  # (B, H, T, Tk) or (B, T, Tk) for one head; only when asked


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        shape = ModelShape(cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd, cfg.train_length)
        self.position = build_position_method(cfg.position, shape, cfg.position_options)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        # GPT-2's init for the model's own layers only: the position method initialised its parameters
        # itself, as its paper does (FIRE's MLP under N(0, 0.02) and zero biases starts linear, with
        # half its units dead for good).
        own = set(map(id, self.position.modules()))
        for module in self.modules():
            if id(module) not in own:
                self._init_weights(module)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by depth
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | int | None = None,
        cache: KVCache | None = None,
        attention_layer: int | None = None,
        attention_head: int | None = None,
    ) -> ModelOutput:
        """Logits for byte ids ``idx`` (B, T).

        positions: absolute positions (T,), or an int p0 for p0, p0+1, ...; default continues after the
            cache (0.. without one). An int (or the default) lets the pass run without reading a position
            back from the device, where a tensor may need a read or two (a host sync each on a GPU).
        attention_layer: also return that layer's attention probabilities (all heads, or only
            ``attention_head``), computed eagerly for that layer alone; other layers stay fused.
        """
        if idx.dim() != 2 or idx.shape[1] == 0:
            raise PosvizError(f"expected a non-empty batch of byte ids of shape (B, T), got shape {tuple(idx.shape)}")
        if idx.is_floating_point() or idx.dtype == torch.bool or idx.is_complex() or (
                _reads_are_free(idx) and not 0 <= int(idx.min()) <= int(idx.max()) < self.config.vocab_size):
            # The values are checked where reading them costs nothing: on a GPU that read would wait for
            # the device at every pass (every decoded byte). posviz encodes bytes on the CPU and moves
            # them, and a decoding loop feeds back bytes sampled from the 256 logits.
            raise PosvizError(f"byte ids must be integers in 0..{self.config.vocab_size - 1}; encode text with posviz.data.encode_text")
        B, T = idx.shape
        query_blocks = {}
        if cache is not None and cache.n_layer != len(self.blocks):
            raise PosvizError(f"the KV cache was made for {cache.n_layer} layers but the model has {len(self.blocks)}")
        if positions is None or isinstance(positions, int):
            start = (0 if cache is None else cache.next_position()) if positions is None else positions
            if start < 0:
                raise PosvizError(f"positions must be {T} non-negative integers (one per byte), got a run from {start}")
            positions = mark_run(torch.arange(start, start + T, device=idx.device), start)
            query_blocks = {"q_run": start}  # these positions are a run: attention need not check
        elif (not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.numel() != T
              or positions.is_floating_point() or positions.dtype == torch.bool or position_range(positions)[0] < 0):
            raise PosvizError(f"positions must be {T} non-negative integers (one per byte), got shape "
                              f"{tuple(getattr(positions, 'shape', ()))} of {getattr(positions, 'dtype', type(positions))}")
        self.position.check_positions(positions)
        if attention_layer is not None and not 0 <= attention_layer < len(self.blocks):
            raise PosvizError(f"attention_layer must be in 0..{len(self.blocks) - 1}, got {attention_layer}")
        if attention_head is not None and not 0 <= attention_head < self.config.n_head:
            raise PosvizError(f"attention_head must be in 0..{self.config.n_head - 1}, got {attention_head}")

        x = self.position.add_to_input(self.wte(idx), positions)  # (B, T, C)
        attention = None  # query_blocks: what the layers share, built by the first layer that needs it
        try:
            for layer, block in enumerate(self.blocks):
                x, probs = block(x, positions, self.position, layer, cache, layer == attention_layer, query_blocks)
                if probs is not None:
                    attention = probs if attention_head is None else probs[:, attention_head]
        finally:
            # A bias shared across layers is as large as an attention map (256 MB at 4,096 bytes):
            # let it go with the forward pass instead of keeping one per loaded model.
            self.position.forget()
        ln = self.ln_f
        logits = F.linear(F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps), self.lm_head.weight)  # (B, T, V)
        return ModelOutput(logits, attention)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(idx).logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
