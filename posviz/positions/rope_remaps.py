"""Training-free position remaps of RoPE: which (query position, key position) each pair is attended with.

A frequency scaling (``rope_scaling``) changes how fast every pair turns; a remap keeps the speeds and changes
*which relative position* a query-key pair sees, so that no pair sees a distance the model never trained on.
Each remap is a few score maps: map m rotates the queries at ``q_positions[m]`` (a function of the query's
position i alone) and the keys at ``k_positions[m]`` (of the key's position j alone), and ``choice[i, j]``
picks the map a pair is scored with. Attention computes the maps a remap asks for and picks one per pair
(``Rotary.pair_scorer``); it never asks which remap it has. Because the key positions depend on j alone and
never on the sequence length, a KV cache that keeps its keys unrotated decodes every remap exactly.

A remap is one function registered by name, with its options and the rule that fills in what is not given
from the training length L and the length T it must cover (``target``):

* ``self_extend`` (Jin et al. 2024, "LLM Maybe LongLM", https://arxiv.org/abs/2401.01325; code
  datamllab/LongLM, llama.cpp's --grp-attn-n/--grp-attn-w): pairs closer than W keep their positions;
  farther ones are attended with grouped positions, the query at i // G + W - W // G and the key at j // G.
  The offset W - W // G is an integer here, as in LongLM's flash decoding step (``flash_self_extend_forward``
  at q_len == 1, every model file), in every path of its Mistral.py, Qwen2.py and Phi.py (they index a cos
  table) and in Llama_4_40.py's non-flash forward (its commit "Fix group query position calculation" calls
  the '/' there accidental). Its Llama.py and Gemma.py write W - W / G, a float, in the prefill (non-flash,
  flash, and Llama.py's Triton) and in the non-flash decoding step, as does Llama_4_40.py's flash prefill.
  The two agree when G divides W. llama.cpp keeps integer positions (it divides the cache's). Defaults:
  W = L/4, and the smallest G with (T - W) / G + W <= L, counted exactly: the largest relative position,
  (T - 1) // G + W - W // G, at most L - 1.
* ``rerope`` (Su 2023, https://kexue.fm/archives/9708; code bojone/rerope): relative positions clipped at w:
  pairs at d >= w see w (the query at w, the key at 0). Default w = L/4.
* ``leaky_rerope`` (same): past w the relative position goes on with slope 1/k: w + (d - w) / k (the query
  at i / k + w (1 - 1/k), the key at j / k). Defaults: w = L/4 (both ReRoPE patches set window = 512 at
  training_length = 4096, L/8), and the smallest k with w + (T - 1 - w) / k <= L - 1: posviz's own rule,
  a fraction in general. The reference fixes an integer k (scaling_factor = 16) and takes no other: both of
  its paths index a cos/sin table by position (the prefill at ``position_ids + offset``, the decoding step
  sliced from ``window + offset``, offset = window (k - 1)), so a fractional k has no reference path,
  prefill or decoding. Positions are float64 here, so any k >= 1 runs, and prefill and decoding agree.
  Both ReRoPE patches also scale every query by max(1, ln(i + 1) / ln L) (``log_scale``), as here.
* ``dca`` (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models", ChunkLlama,
  https://arxiv.org/abs/2402.17463; code HKUNLP/ChunkLlama; Qwen2.5-1M's ``dual_chunk_attention_config``):
  chunks of c = chunk_size - local_window positions, every key at j mod c; a query in the key's own chunk at
  i mod c (intra), in the next chunk at min(i mod c + c, chunk_size) (successive), further on at chunk_size
  (inter). Defaults: chunk_size = 3L/4 (``pretraining_length * 3 // 4`` in every ChunkLlama file) and
  local_window = L/16, the default of its flash_decoding_chunkllama.py and chunkqwen_attn_replace.py
  (chunkllama_attn_replace.py's is L/8); it covers any length. Past L the reference multiplies the cos and
  sin of q, qc and k alike (its ``get_mscale``), so every logit by the factor's square: 0.05 ln(T/L) + 1 in
  chunkllama_attn_replace.py (``scale``'s default here), 0.1 ln(T/L) + 1 in flash_decoding_chunkllama.py,
  none in chunkqwen_attn_replace.py; 1 while T <= L. The default thus pairs chunkllama_attn_replace.py's
  scale with the other two files' window: no one file has both. The reference reads T as the length so far
  (its tables are rebuilt whenever the sequence grows, so a cached key keeps the factor of the step that
  wrote it); here T is the length the options are resolved to cover, pinned as ``attention_factor``, so
  the maps depend on positions alone and cached decoding equals the full pass.
* ``string`` (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
  https://arxiv.org/abs/2410.18745; code HKUNLP/STRING): pairs closer than the shift S keep their positions;
  from S on the query is moved back by S - W, so distance d is seen as d - S + W: the well-trained small
  positions overwrite the rarely trained large ones. cos and sin are multiplied by 0.1 ln 2 + 1, as the
  reference does. Defaults: W = L/16 and S = max(L/3, T - L + W). The reference works within the trained
  context: its README sets S = int(0.33 L) (L its max_position_embeddings) and W = 128 tokens, its scripts S
  = int(0.33 x the test length); here S = L // 3 (85 at L = 256, where int(0.33 L) is 84) and W = L/16, a
  share of L for these small models in place of the fixed 128. S = T - L + W past L is posviz's own rule,
  not the reference's (whose one run past L, ruler/test_ruler_qwen2.py, keeps S = int(0.33 T) and adds YaRN):
  it sees the farthest pair at L - 1, and cannot cover T > 2L - W, where S itself passes L.

Shapes: q_pos (rows,), k_pos (keys,) integer positions; choice (rows, keys).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, ClassVar

import torch

from posviz.config import require, strict_from_dict


@dataclasses.dataclass(frozen=True)
class PairMaps:
    """The score maps of a remap for one block of queries against its keys."""
    q_positions: tuple[torch.Tensor, ...]  # per map (rows,) float64: the position each query is rotated at
    k_positions: tuple[torch.Tensor, ...]  # per map (keys,) float64: the position each key is rotated at
    choice: torch.Tensor  # (rows, keys) long: the map each pair is scored with
    q_scale: torch.Tensor | None = None  # (rows,) multiplies each query before it is scored (ReRoPE's log scaling)
    attention_factor: float = 1.0  # multiplies cos and sin in every map, so the logits by its square (STRING, DCA)

    def relative_positions(self) -> torch.Tensor:
        """(rows, keys) float64: the relative position each pair is attended at, q position minus k position."""
        q = torch.stack(self.q_positions)[:, :, None]  # (M, rows, 1)
        k = torch.stack(self.k_positions)[:, None, :]  # (M, 1, keys)
        return (q - k).gather(0, self.choice[None]).squeeze(0)


@dataclasses.dataclass(frozen=True)
class Remap:
    """A registered remap: its options, the rule for what is not given, its maps and two facts about them."""
    name: str
    display_name: str  # what the pages show ("dual chunk attention"); ``name`` is the id URLs and configs use
    summary: str
    paper: str
    Options: type
    resolve: Callable  # (options with None, L, T) -> options with every value
    maps: Callable  # (q_pos, k_pos, options, L) -> PairMaps
    # scores depend on i - j alone: a window of keys may start anywhere (not where chunks, groups or a
    # query scale read the absolute position)
    shift_invariant: Callable  # (options) -> bool
    registry: ClassVar[dict] = {}

    def build(self, values: dict | None, train_length: int, target_length: int):
        """The options of this remap from ``values`` (unknown keys rejected), every value filled in."""
        options = strict_from_dict(self.Options, values, f"{self.name} options")
        return self.resolve(options, train_length, max(int(target_length), train_length))

    def settings(self, values: dict | None, train_length: int, target_length: int) -> dict:
        """``build``'s options as a plain mapping, every parameter written out: what a page states and a
        checkpoint's config.json pins."""
        return dataclasses.asdict(self.build(values, train_length, target_length))


ROPE_REMAPS: dict[str, Remap] = {}


def register(name: str, display_name: str, summary: str, paper: str, options: type, resolve,
             shift_invariant=lambda o: False):
    def wrap(maps):
        ROPE_REMAPS[name] = Remap(name, display_name, summary, paper, options, resolve, maps, shift_invariant)
        return maps

    return wrap


def _f(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def _positive_int(value, what: str) -> None:
    require(value is None or (isinstance(value, int) and value >= 1), f"{what} must be a positive integer, got {value!r}")


# -- Self-Extend ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class SelfExtendOptions:
    group: int | None = None  # G: far keys share a position per G (None: the smallest G covering the target)
    window: int | None = None  # W: keys closer than this keep their own positions (None: L/4)

    def __post_init__(self):
        _positive_int(self.group, "self_extend's group")
        _positive_int(self.window, "self_extend's window")


def _self_extend_resolve(o: SelfExtendOptions, L: int, T: int) -> SelfExtendOptions:
    window = o.window or max(1, L // 4)
    group = o.group
    if group is None:  # the smallest G whose largest relative position, (T-1)//G + W - W//G, is at most L - 1
        group = max(1, math.ceil((T - window) / max(1, L - window)))  # the paper's (T - W)/G + W <= L ...
        while (T - 1) // group + window - window // group > L - 1 and group < T:  # ... counted exactly
            group += 1
    return SelfExtendOptions(group=group, window=window)


@register("self_extend", "Self-Extend",
          "Far keys grouped: beyond W, positions are floor-divided by G (neighbours keep theirs).",
          "https://arxiv.org/abs/2401.01325", SelfExtendOptions, _self_extend_resolve)
def self_extend(q_pos, k_pos, o: SelfExtendOptions, L: int) -> PairMaps:
    G, W = o.group, o.window
    # W - W // G: LongLM's flash decoding step (and Mistral.py, Qwen2.py, Phi.py, Llama_4_40.py's non-flash
    # forward); its Llama.py and Gemma.py prefill and non-flash decoding write W - W / G, a float (the same when G
    # divides W). One form for every pair here, so prefill and cached decoding agree.
    grouped_q = torch.div(q_pos, G, rounding_mode="floor") + (W - W // G)
    far = (q_pos[:, None] - k_pos[None, :]) >= W  # the reference's neighbour mask is d < W
    return PairMaps((_f(q_pos), _f(grouped_q)), (_f(k_pos), _f(torch.div(k_pos, G, rounding_mode="floor"))),
                    far.long())


# -- ReRoPE and Leaky ReRoPE -----------------------------------------------------------------------------------
@dataclasses.dataclass
class ReRopeOptions:
    window: int | None = None  # w: distances from w on are seen as w (None: L/4)
    log_scale: bool = True  # both reference patches scale each query by max(1, ln(i + 1) / ln L)

    def __post_init__(self):
        _positive_int(self.window, "rerope's window")
        require(isinstance(self.log_scale, bool), f"rerope's log_scale must be true or false, got {self.log_scale!r}")


def _log_scale(q_pos: torch.Tensor, L: int) -> torch.Tensor:
    return (torch.log(_f(q_pos) + 1) / math.log(L)).clamp(min=1.0)


def _rerope_resolve(o: ReRopeOptions, L: int, T: int) -> ReRopeOptions:
    return ReRopeOptions(window=o.window or max(1, L // 4), log_scale=o.log_scale)


@register("rerope", "ReRoPE",
          "Relative positions clipped at w: every key from w back is seen at distance w.",
          "https://kexue.fm/archives/9708", ReRopeOptions, _rerope_resolve, lambda o: not o.log_scale)
def rerope(q_pos, k_pos, o: ReRopeOptions, L: int) -> PairMaps:
    far = (q_pos[:, None] - k_pos[None, :]) >= o.window  # the reference: |i - j| < window keeps RoPE
    return PairMaps((_f(q_pos), torch.full_like(_f(q_pos), float(o.window))), (_f(k_pos), torch.zeros_like(_f(k_pos))),
                    far.long(), _log_scale(q_pos, L) if o.log_scale else None)


@dataclasses.dataclass
class LeakyReRopeOptions:
    window: int | None = None  # w: distances below w are RoPE's own (None: L/4)
    # k: past w a distance grows by 1/k per position (None: the smallest k covering the target, posviz's rule; the
    # reference takes an integer k alone, 16 by default)
    stretch: float | None = None
    log_scale: bool = True  # as ReRoPE's

    def __post_init__(self):
        _positive_int(self.window, "leaky_rerope's window")
        require(self.stretch is None or (isinstance(self.stretch, (int, float)) and self.stretch >= 1),
                f"leaky_rerope's stretch must be a number >= 1, got {self.stretch!r}")
        require(isinstance(self.log_scale, bool), f"leaky_rerope's log_scale must be true or false, got {self.log_scale!r}")


def _leaky_resolve(o: LeakyReRopeOptions, L: int, T: int) -> LeakyReRopeOptions:
    window = o.window or max(1, L // 4)
    stretch = o.stretch or max(1.0, (T - 1 - window) / max(1, L - 1 - window))
    return LeakyReRopeOptions(window=window, stretch=float(stretch), log_scale=o.log_scale)


@register("leaky_rerope", "Leaky ReRoPE",
          "ReRoPE whose far distances keep growing, k times slower: w + (d - w) / k.",
          "https://kexue.fm/archives/9708", LeakyReRopeOptions, _leaky_resolve, lambda o: not o.log_scale)
def leaky_rerope(q_pos, k_pos, o: LeakyReRopeOptions, L: int) -> PairMaps:
    w, k = o.window, o.stretch
    far = (q_pos[:, None] - k_pos[None, :]) >= w
    return PairMaps((_f(q_pos), _f(q_pos) / k + w * (1 - 1 / k)), (_f(k_pos), _f(k_pos) / k), far.long(),
                    _log_scale(q_pos, L) if o.log_scale else None)


# -- Dual Chunk Attention ----------------------------------------------------------------------------------------
# The factor each ChunkLlama file multiplies the q, qc and k cos and sin by past the trained context, named by the
# file (its ``get_mscale``): c ln(T / L) + 1 for T > L, 1 otherwise; chunkqwen_attn_replace.py has none (c = 0).
DCA_SCALES = {"chunkllama_attn_replace": 0.05, "flash_decoding_chunkllama": 0.1, "chunkqwen_attn_replace": 0.0}


def dca_attention_factor(scale: str, L: int, T: int) -> float:
    """The factor ``scale``'s file puts on cos and sin for a text of T positions from a model trained on L."""
    return 1.0 if T <= L else DCA_SCALES[scale] * math.log(T / L) + 1.0


@dataclasses.dataclass
class DcaOptions:
    chunk_size: int | None = None  # s: the largest position a query is given (None: 3L/4, every ChunkLlama file's)
    # chunks hold s - local_window positions (None: L/16, flash_decoding_chunkllama.py's and chunkqwen_attn_replace.py's;
    # chunkllama_attn_replace.py's is L/8)
    local_window: int | None = None
    scale: str = "chunkllama_attn_replace"  # whose rule gives the attention factor past L (DCA_SCALES)
    # multiplies cos and sin (the logits by its square); None: ``scale``'s rule at the length resolved for, then pinned
    attention_factor: float | None = None

    def __post_init__(self):
        _positive_int(self.chunk_size, "dca's chunk_size")
        _positive_int(self.local_window, "dca's local_window")
        require(self.scale in DCA_SCALES,
                f"dca's scale must be one of {', '.join(DCA_SCALES)} (the ChunkLlama file whose rule it follows), "
                f"got {self.scale!r}")
        require(self.attention_factor is None or (isinstance(self.attention_factor, (int, float))
                                                  and not isinstance(self.attention_factor, bool) and self.attention_factor > 0),
                f"dca's attention_factor must be a positive number, got {self.attention_factor!r}")


def _dca_resolve(o: DcaOptions, L: int, T: int) -> DcaOptions:
    # T, the length the options cover, not the length so far as the reference reads it: the maps then depend on
    # positions alone, and cached decoding equals the full pass
    factor = o.attention_factor if o.attention_factor is not None else dca_attention_factor(o.scale, L, T)
    resolved = DcaOptions(chunk_size=o.chunk_size or max(2, 3 * L // 4), local_window=o.local_window or max(1, L // 16),
                          scale=o.scale, attention_factor=float(factor))
    require(resolved.chunk_size > resolved.local_window,
            f"dca needs chunk_size > local_window, got {resolved.chunk_size} and {resolved.local_window}")
    return resolved


@register("dca", "dual chunk attention",
          "Dual chunk attention: keys at their place in a chunk; queries intra-, successive- or inter-chunk.",
          "https://arxiv.org/abs/2402.17463", DcaOptions, _dca_resolve)
def dual_chunk(q_pos, k_pos, o: DcaOptions, L: int) -> PairMaps:
    s, c = o.chunk_size, o.chunk_size - o.local_window
    within = q_pos % c
    q_intra, q_successive = within, (within + c).clamp(max=s)
    q_inter = torch.full_like(q_pos, min(2 * c - 1, s))  # the reference's qc position of index c - 1
    gap = torch.div(q_pos, c, rounding_mode="floor")[:, None] - torch.div(k_pos, c, rounding_mode="floor")[None, :]
    choice = gap.clamp(0, 2)  # 0: same chunk, 1: the previous one, 2: any before it (future keys are masked)
    k = _f(k_pos % c)
    return PairMaps((_f(q_intra), _f(q_successive), _f(q_inter)), (k, k, k), choice,
                    attention_factor=float(o.attention_factor))


# -- STRING -----------------------------------------------------------------------------------------------------
STRING_ATTENTION_FACTOR = 0.1 * math.log(2) + 1  # the reference's, "similar with YaRN"


@dataclasses.dataclass
class StringOptions:
    # S: from this distance on, pairs are moved back (None: max(L/3, T - L + W); the reference's is 0.33 L within
    # the trained context, T - L + W past it is posviz's)
    shift: int | None = None
    local_window: int | None = None  # W: distance S is seen as W (None: L/16)
    attention_factor: float = STRING_ATTENTION_FACTOR  # multiplies cos and sin (the logits by its square)

    def __post_init__(self):
        _positive_int(self.shift, "string's shift")
        _positive_int(self.local_window, "string's local_window")
        require(isinstance(self.attention_factor, (int, float)) and self.attention_factor > 0,
                f"string's attention_factor must be a positive number, got {self.attention_factor!r}")


def _string_resolve(o: StringOptions, L: int, T: int) -> StringOptions:
    local = o.local_window or max(1, L // 16)
    shift = o.shift or max(L // 3, T - L + local)
    require(shift > local, f"string needs shift > local_window, got {shift} and {local}")
    return StringOptions(shift=shift, local_window=local, attention_factor=float(o.attention_factor))


@register("string", "STRING",
          "Shifted RoPE: from distance S on, a pair is seen S - W closer (well-trained small positions).",
          "https://arxiv.org/abs/2410.18745", StringOptions, _string_resolve, lambda o: True)
def shifted_rope(q_pos, k_pos, o: StringOptions, L: int) -> PairMaps:
    # The reference's prefill (flash attention with window [S, 0]) also attends the key at exactly distance S a
    # second time, at its own position, beside the shifted one; its decoding step attends it once, shifted.
    # The decoding step's split here (d < S plain, d >= S shifted), so prefill and cached decoding agree.
    far = (q_pos[:, None] - k_pos[None, :]) >= o.shift
    return PairMaps((_f(q_pos), _f(q_pos) - (o.shift - o.local_window)), (_f(k_pos), _f(k_pos)), far.long(),
                    attention_factor=float(o.attention_factor))


def remap_names() -> list[str]:
    return list(ROPE_REMAPS)


def relative_position_matrix(name: str, options: dict | None, train_length: int, length: int) -> torch.Tensor:
    """(length, length) float64: the relative position each causal pair (i, j <= i) is attended at under the remap
    (NaN above the diagonal), with its options resolved for ``length``: what the RoPE page draws."""
    remap = ROPE_REMAPS[name]
    resolved = remap.build(options, train_length, length)
    pos = torch.arange(length)
    rel = remap.maps(pos, pos, resolved, train_length).relative_positions()
    return rel.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("nan"))
