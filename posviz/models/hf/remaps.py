"""The training-free RoPE remaps (``positions.rope_remaps``) on a published model, with transformers' own forward.

A remap attends each query-key pair at positions of its own (Self-Extend's groups, ReRoPE's clip, DCA's chunks,
STRING's shift), which no rotation of q and k *before* attention can express: a key is seen at different
positions by different queries. Every reference patches the attention class of a few model families by hand
(LongLM, ChunkLlama, STRING). posviz does it once for every rotary family, through transformers' attention
interface:

1. The model's rotary module is wrapped (``Unrotated``) so that it hands the layers cos = 1 and sin = 0: each
   layer's own ``apply_rotary_pos_emb`` (half-split, partial, GPT-OSS's first/second half: all of them) leaves
   q and k as they are, and the KV cache keeps its keys unrotated, so cached decoding needs no re-rotation.
2. The model runs with ``config._attn_implementation = "posviz_remap"``, an attention function registered with
   transformers (``remap_attention``), with the causal mask transformers builds for sdpa (sliding windows
   included). Given the unrotated q and k of a layer, it rotates them once per score map of the remap, at the
   positions of that map, with the model's own speeds (``inv_freq`` and attention factor of its rotary module,
   one set per layer type for Gemma 3), and scores each pair with the map the remap chose for it, a block of
   queries at a time. Everything else (the projections, the norms, GQA, Gemma 2's logit soft-cap, GPT-OSS's
   sink logits, the scale) is the model's: the function reads them from the arguments transformers passes.
3. A layer that does not rotate (SmolLM3's and Llama 4's NoPE layers, ``use_rope`` false) is scored plainly.

The positions of one pass (the queries', and every cached key's) are set by the model for that pass
(``pass_positions``), in a context variable: a forward pass holds its engine's lock, and a thread's context is
its own.

Shapes: q (B, H, T, D); k, v (B, Hkv, Tk, D); positions (T,) and (Tk,); a block's scores (B, Hkv, G, rows, keys).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import torch

from posviz.errors import PosvizError
from posviz.positions.rope import apply_rotary, rope_cos_sin
from posviz.positions.rope_remaps import Remap

ATTENTION_NAME = "posviz_remap"
# A block of queries is scored against its keys with at most this many bytes of float32 scores per map in flight:
# a 16,384-token pass of a 9-head model takes 128 rows a block instead of a 9.6 GB score map.
BLOCK_BYTES = 256 * 2**20


@dataclass
class RemapPass:
    """What one forward pass of a remapped model needs beyond what transformers hands its attention."""

    remap: Remap
    options: object  # the remap's options, every value filled in (``Remap.build``)
    train_length: int  # L, the trained context the remap's rules read
    speeds: dict  # layer type (None: every layer) -> (inv_freq (rot/2,) float64, the model's attention factor)
    layer_types: list | None  # per layer index, where the speeds differ by layer type (Gemma 3)
    q_pos: torch.Tensor  # (T,) the positions of the pass's queries
    k_pos: torch.Tensor  # (Tk,) the positions of every key the pass attends: the cache's, then the queries'
    probs_for: frozenset = frozenset()  # the layers whose attention probabilities the pass returns (a map)
    # pairs of adjacent features rotate together (Llama 4), not the two halves: set by ``Unrotated`` as the pass runs
    interleaved: bool = False
    _rotations: dict = field(default_factory=dict)  # (layer type, side, Tk) -> per-map cos/sin: once per pass


_PASS: contextvars.ContextVar[RemapPass | None] = contextvars.ContextVar("posviz_remap_pass", default=None)


@contextlib.contextmanager
def pass_positions(run: RemapPass):
    """``run`` is what ``remap_attention`` reads during the forward pass inside this block."""
    token = _PASS.set(run)
    try:
        yield run
    finally:
        _PASS.reset(token)


class Unrotated(torch.nn.Module):
    """A model's rotary module that hands every layer the identity rotation (cos 1, sin 0) of the right shape and
    dtype: the layers' own rotation code then leaves q and k unrotated, for ``remap_attention`` to rotate per map."""

    def __init__(self, rotary: torch.nn.Module):
        super().__init__()
        self.rotary = rotary

    def forward(self, *args, **kwargs):
        turns = self.rotary(*args, **kwargs)
        if isinstance(turns, torch.Tensor) and turns.is_complex():
            # Llama 4: one complex factor e^(i theta) per pair of adjacent features (2i, 2i + 1), applied by
            # view_as_complex: the pass's remap attention rotates those pairs (RemapPass.interleaved)
            run = _PASS.get()
            if run is not None:
                run.interleaved = True
            return torch.ones_like(turns)
        cos, sin = turns
        return torch.ones_like(cos), torch.zeros_like(sin)


def _rotations(run: RemapPass, layer_type, side: str, positions: torch.Tensor, device, dtype):
    """Per map, (cos, sin) (n, rot) at that map's positions of ``side`` ("q": the queries, "k": the keys), in the
    layer's dtype; and the queries' scale (ReRoPE's log scaling, or None). Worked out once per pass and layer type:
    a map's query positions depend on the query alone and its key positions on the key alone (the remaps'
    contract, tested in test_rope_remaps), so each side is read against one position of the other."""
    key = (layer_type, side, int(positions.numel()), device, dtype)
    if key not in run._rotations:
        inv_freq, model_factor = run.speeds[layer_type]
        q_pos, k_pos = (positions, run.k_pos[:1]) if side == "q" else (run.q_pos[:1], positions)
        maps = run.remap.maps(q_pos.cpu(), k_pos.cpu(), run.options, run.train_length)
        factor = model_factor * maps.attention_factor
        # angles in float64 (a leaky stretch makes positions fractions); cast once to the layer's dtype
        per_map = [rope_cos_sin(p, inv_freq, factor, torch.float64) for p in
                   (maps.q_positions if side == "q" else maps.k_positions)]
        scale = maps.q_scale if side == "q" else None
        run._rotations[key] = ([(c.to(device, dtype), s.to(device, dtype)) for c, s in per_map],
                               None if scale is None else scale.to(device, dtype))
    return run._rotations[key]


def _choice(run: RemapPass, r0: int, r1: int, k_pos: torch.Tensor, device) -> torch.Tensor:
    """(rows, keys) the map each pair of a block is scored with: once per pass, shared by the layers."""
    key = ("choice", r0, r1, int(k_pos.numel()), device)
    if key not in run._rotations:  # one byte a pair (a remap has at most 3 maps): 256 MB at 16,384 tokens
        run._rotations[key] = run.remap.maps(run.q_pos[r0:r1].cpu(), k_pos.cpu(), run.options,
                                             run.train_length).choice.to(device, torch.uint8)
    return run._rotations[key]


def _layer_type(run: RemapPass, module) -> object:
    if run.layer_types is None:
        return None
    kind = run.layer_types[int(module.layer_idx)]
    return kind if kind in run.speeds else next(iter(run.speeds))


def remap_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                    softcap: float | None = None, s_aux: torch.Tensor | None = None, **kwargs):
    """transformers' attention interface under the pass's remap: (B, T, H, D) outputs and (B, H, T, Tk) weights
    when the pass wants them, else None. q (B, H, T, D) and k, v (B, Hkv, Tk, D) arrive unrotated (``Unrotated``).
    ``attention_mask``: sdpa's boolean mask (B, 1, T, Tk), True where a pair attends, or None for plain causal.

    Each block of queries is scored map by map, each map over the one span of keys it scores in that block. Without
    a map to return, the maps' softmax parts are merged as flash attention merges blocks (``_merged_block``: no
    (rows, keys) buffer of every map, no selection pass); with one, the block's scores are assembled whole and
    normalised (``_weights_block``, the reading the other is tested against)."""
    run = _PASS.get()
    if run is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention runs only inside posviz's pass_positions")
    B, H, T, D = query.shape
    Hkv, Tk, Dv = key.shape[1], key.shape[2], value.shape[-1]  # MLA: values narrower than q.k
    G = H // Hkv  # query heads per key head (GQA): scored as (B, Hkv, G, ...), keys never repeated
    k_pos = run.k_pos[-Tk:].to(query.device)  # a sliding-window layer's cache keeps its newest keys only
    rotates = bool(getattr(module, "use_rope", True))  # SmolLM3 / Llama 4 NoPE layers: plain scores
    query = query * scaling  # the model's scale, folded into the queries once instead of every block's scores
    if rotates:
        kind = _layer_type(run, module)
        q_rot, q_scale = _rotations(run, kind, "q", run.q_pos, query.device, query.dtype)
        k_rot, _ = _rotations(run, kind, "k", k_pos, query.device, query.dtype)
        if q_scale is not None:
            query = query * q_scale[:, None]  # (T, 1): each query's own scale (ReRoPE's log scaling)
        # MLA (DeepSeek): each head's unrotated part comes first, its rotated part last, de-interleaved by the layer's
        # own apply_rotary_pos_emb_interleave (identity angles): half-split pairs, as apply_rotary turns them
        start = int(getattr(module, "qk_nope_head_dim", 0) or 0)
        if run.interleaved:  # Llama 4: q and k in the same order, half-split (q.k is the same in any common order)
            query, key = _half_split(query), _half_split(key)
            if getattr(module, "qk_norm", None) is not None and run.speeds[kind][1] != 1.0:
                raise PosvizError("its queries and keys are normed after their rotation, which cancels the rotary "
                                  "module's attention factor; posviz's remaps rotate after the norm")
        qs = [_rotate_from(query, start, c, s).view(B, Hkv, G, T, D) for c, s in q_rot]
        ks = [_rotate_from(key, start, c, s)[:, :, None] for c, s in k_rot]  # (B, Hkv, 1, Tk, D)
    else:
        qs, ks = [query.view(B, Hkv, G, T, D)], [key[:, :, None]]
    v = value[:, :, None]  # (B, Hkv, 1, Tk, D)
    sink = None if s_aux is None else s_aux.float().reshape(1, Hkv, G, 1, 1)  # GPT-OSS: a learned logit per head
    out = query.new_empty(B, Hkv, G, T, Dv)
    probs = query.new_zeros(B, H, T, Tk) if getattr(module, "layer_idx", None) in run.probs_for else None
    whole = probs is not None or (dropout and module.training)
    # blocks of at most BLOCK_BYTES of scores, and of at most 256 queries: a causal block scores the keys up to its
    # last query only, so small blocks skip most of the masked triangle
    rows = max(1, min(256, BLOCK_BYTES // (4 * B * H * Tk)))
    for r0 in range(0, T, rows):
        r1 = min(T, r0 + rows)
        seen = Tk - T + r1  # causal: no query of the block sees a key past its last query's own
        # (rows, seen) by index: query r0 + r is the key Tk - T + r0 + r
        causal = torch.arange(seen, device=query.device)[None, :] <= torch.arange(Tk - T + r0, Tk - T + r1,
                                                                                  device=query.device)[:, None]
        visible = causal
        if attention_mask is not None:
            allowed = attention_mask[:, :, r0:r1, :seen]
            # (B, 1, 1, rows, seen): every head of every group
            visible = ((allowed if allowed.dtype == torch.bool else allowed == 0) & causal)[:, None]
        choice = _choice(run, r0, r1, k_pos[:seen], query.device) if rotates else None
        spans = []  # per map: (its queries and keys, the pairs it scores, its span of keys)
        for m, (qm, km) in enumerate(zip(qs, ks)):
            picked = causal if choice is None else (choice == m) & causal
            cols = picked.any(0).nonzero()
            if cols.numel():  # else no pair of this block is scored with map m
                a, b = int(cols[0]), int(cols[-1]) + 1  # the keys map m scores in this block: one span
                spans.append((qm[..., r0:r1, :], km[..., a:b, :], (picked & visible)[..., a:b], a, b))
        if whole:
            weights = _weights_block(spans, (B, Hkv, G, r1 - r0, seen), softcap, sink).to(value.dtype)
            if dropout and module.training:
                weights = torch.nn.functional.dropout(weights, p=dropout)
            out[..., r0:r1, :] = torch.matmul(weights, v[..., :seen, :])
            if probs is not None:
                probs[:, :, r0:r1, :seen] = weights.reshape(B, H, r1 - r0, seen)
        else:
            out[..., r0:r1, :] = _merged_block(spans, v, softcap, sink)
    return out.reshape(B, H, T, Dv).transpose(1, 2).contiguous(), probs


def _half_split(x: torch.Tensor) -> torch.Tensor:
    """(..., D) with the even features first, then the odd: adjacent pairs (2i, 2i + 1) become (i, i + D/2)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def _rotate_from(x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary`` on the features from ``start`` on (MLA's rotated part); the ones before pass through."""
    return apply_rotary(x, cos, sin) if not start else torch.cat((x[..., :start], apply_rotary(x[..., start:], cos, sin)), -1)


def _scores(qm, km, keep, softcap):
    """(B, Hkv, G, rows, span) float32 scaled scores of one map's span, -inf where the map does not score a pair."""
    s = torch.matmul(qm, km.transpose(-1, -2)).float()
    if softcap is not None:  # Gemma 2: logits soft-capped after the scale, before the mask (its eager attention)
        s = s.div_(softcap).tanh_().mul_(softcap)
    return s.masked_fill_(~keep, float("-inf"))


def _weights_block(spans, shape, softcap, sink) -> torch.Tensor:
    """A block's attention weights, (B, Hkv, G, rows, seen): each map's scores where it scores, one softmax."""
    scores = torch.full(shape, float("-inf"), device=spans[0][0].device)
    for qm, km, keep, a, b in spans:
        s = _scores(qm, km, keep, softcap)
        scores[..., a:b] = torch.where(keep, s, scores[..., a:b])
    if sink is None:
        return scores.softmax(dim=-1)
    # GPT-OSS: the sink logit takes a share of the softmax, then is dropped
    return torch.cat((scores, sink.expand(*shape[:-1], 1)), dim=-1).softmax(dim=-1)[..., :-1]


def _merged_block(spans, v, softcap, sink) -> torch.Tensor:
    """A block's output, (B, Hkv, G, rows, D), from each map's span on its own: the softmax of each part with its
    own maximum, merged by rescaling to the common one (every pair belongs to one map, so the parts partition the
    keys); a sink logit adds to the denominator only."""
    top = total = acc = None
    for qm, km, keep, a, b in spans:
        s = _scores(qm, km, keep, softcap)
        m = s.amax(dim=-1, keepdim=True)
        m = m.masked_fill(m == float("-inf"), 0.0)  # a row with no pair in this span: every weight exp(-inf) = 0
        p = s.sub_(m).exp_()
        part, o = p.sum(dim=-1, keepdim=True), torch.matmul(p.to(v.dtype), v[..., a:b, :]).float()
        if top is None:
            top, total, acc = m, part, o
        else:
            new = torch.maximum(top, m)
            old_w, new_w = torch.exp(top - new), torch.exp(m - new)
            top, total, acc = new, total * old_w + part * new_w, acc * old_w + o * new_w
    if sink is not None:
        new = torch.maximum(top, sink)
        top, total, acc = new, total * torch.exp(top - new) + torch.exp(sink - new), acc * torch.exp(top - new)
    return (acc / total).to(v.dtype)


def register_once() -> None:
    """``remap_attention`` and sdpa's mask under ``ATTENTION_NAME``, in transformers' global interfaces."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, remap_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def work_bytes(n_head: int, n_queries: int, n_keys: int, attention_map: bool) -> int:
    """The biggest temporaries of one remapped pass: a block's scores and choice (``BLOCK_BYTES`` a map at most,
    the picked map, the weights), the boolean mask transformers builds, and the map when one is asked for."""
    block = min(BLOCK_BYTES, 4 * n_head * n_queries * n_keys)
    return 4 * block + n_queries * n_keys + (4 * n_head * n_queries * n_keys if attention_map else 0)


def speeds_of(model) -> tuple[dict, list | None]:
    """``RemapPass``'s speeds of a published model (``PublishedModel``): its own rotary module, built from its config."""
    rotary = model._new_rotary(torch.device("cpu"))
    if model.rope_parameters.get("rope_type") in ("dynamic", "longrope"):
        # speeds that follow the pass's length: a remap attends every pair within the trained context, so the
        # speeds are the model's at that length (Phi-3-128k's long factors past its original 4k)
        rotary(torch.zeros(1, dtype=torch.float32), torch.tensor([[model.train_length - 1]]))
    return model_speeds(rotary, getattr(model.config, "layer_types", None), dict(model.rope_parameters))


def model_speeds(rotary: torch.nn.Module, layer_types: list | None, rope_parameters: dict) -> tuple[dict, list | None]:
    """(speeds, layer types) of ``RemapPass`` from a model's rotary module: its ``inv_freq`` and
    ``attention_scaling``, or Gemma 3's one pair per layer type (``<type>_inv_freq``), with the plain speeds
    θ^(-2i/d) of a ``"default"`` rope type recomputed in float64 (``exact_speeds``)."""
    if hasattr(rotary, "inv_freq") or not layer_types:
        buffer = rotary.inv_freq.detach().double().cpu()
        return {None: (exact_speeds(buffer, rope_parameters), float(rotary.attention_scaling))}, None
    speeds = {kind: (exact_speeds(getattr(rotary, f"{kind}_inv_freq").detach().double().cpu(), rope_parameters.get(kind, {})),
                     float(getattr(rotary, f"{kind}_attention_scaling")))
              for kind in dict.fromkeys(layer_types) if hasattr(rotary, f"{kind}_inv_freq")}
    return speeds, list(layer_types)


def exact_speeds(buffer: torch.Tensor, params: dict) -> torch.Tensor:
    """The speeds of ``buffer`` (the rotary module's float32 ``inv_freq``) in float64 where they are plain RoPE's,
    θ^(-2i/d): transformers rounds them to float32, which turns a pair at position 4,000 by up to 2e-4 radians
    more than the model's definition (posviz rotates in float64 throughout). Other rope types (YaRN, Llama 3,
    LongRoPE) keep the buffer's values, widened."""
    if params.get("rope_type", "default") != "default":
        return buffer
    dims = 2 * buffer.numel()
    exact = 1.0 / float(params.get("rope_theta", 10000.0)) ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims)
    # the same speeds, to float32's rounding: anything else means the buffer is not θ^(-2i/d) (keep the model's)
    return exact if torch.allclose(exact, buffer, rtol=1e-6, atol=0) else buffer
