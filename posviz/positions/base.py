"""The one interface every position method implements.

A method can act at three places, and attention calls all three without asking which method it has:

* ``add_to_input(x, pos)``            add position vectors to the token embeddings (absolute methods)
* ``rotate_qk(q, k, pos)``            rotate queries and keys by their positions (rotary)
* ``logit_bias(layer, q, q_pos, k_pos)`` a bias added to the attention logits after the 1/sqrt(d) scale
  (ALiBi, T5, Shaw); ``None`` when the method adds nothing there.

A method whose bias depends on the distance alone may also offer an optional shortcut that attention
uses without knowing the method:

* ``distance_bias(layer, q_pos, lo, hi)``  the same bias as a per-distance vector (H, hi - lo + 1) for
  distances lo..hi >= 0, or ``None`` when, for these queries, it is not a function of the distance
  alone (FIRE past its threshold). Attention then reads each block's bias as a strided view of that
  vector instead of an (H, Tq, Tk) tensor; ``logit_bias`` stays the reference.
* ``banded_bias(layer, q, q_pos)``  for a query-dependent bias of a clipped distance (Shaw, NEZHA): the
  bias at distances 0..K-1 and at every distance >= K, per query. Beyond K it is one constant per
  query, which cancels in the softmax, so attention only writes a band of K keys per query.
* ``relative_key_range(layer, q, lo, hi)``  for an unclipped query-dependent bias q'_i . P_(i-j)
  (Transformer-XL): the query and the key of every distance; attention reads the bias of a block as
  a skewed view of q' . P (Transformer-XL's "relative shift"), its keys taken in reverse order.

A method may also compute what counts as far from the *content* (FoX, CoPE, stick-breaking): attention
then scores every query block itself and hands the method what it has, again without asking which it is:

* ``token_state(layer, x, cache)``  (B, H, T) per-token values from the layer's input hidden states (FoX's log
  forget gates), or (B, H, T, m) vectors (PaTH's Householder directions and strengths); a KV cache keeps them beside
  the keys, so a decoding step has them for every key.
* ``content_scorer(layer, q, k, state, q_pos, cache)``  once per layer: a function giving each block's scores (as ``pair_scorer``)
  from the queries, the keys and the keys' states, for a method whose transform sits between key and query (PaTH);
  None: the plain q . k / sqrt(hs).
* ``content_bias(layer, scores, q, k, seen)``  a bias (B, H, rows, keys) computed from the block's own
  scores, queries, keys and token states (``Seen``), added to the scores.
* ``attention_weights(layer, scores, seen)``  the weights from the (biased) scores: a softmax over the
  visible keys by default; stick-breaking's own normalisation otherwise.

A RoPE remap (Self-Extend, ReRoPE, DCA, STRING: ``positions.rope_remaps``) attends each query-key pair at
positions of its own; attention then takes each block's scores from the method instead of q . k:
* ``pair_scorer(layer, q, k, q_pos, k_pos)``  once per layer: a function giving each block's scores (B, H,
  rows, keys), when ``remaps_pairs``; None otherwise.
A method may also mix each position's hidden states with its neighbours' (Canon layers), at four sites of a block:
* ``mix_hidden(layer, site, h, cache)``  h (B, T, D) at site "A" (attention's input, after its LayerNorm), "B" (the
  projected q, k, v side by side), "C" (the MLP's input) or "D" (the MLP's hidden layer), returned mixed; h itself
  by default. A KV cache keeps the rows a convolution needs from earlier steps (``KVCache.recent``).
A model may also give each layer its own method, window and sink logits (``positions.layers``: Llama 4's
NoPE layers, Gemma 3's local and global layers, GPT-OSS's sinks). Attention asks ``at_layer(layer)`` for
the method acting in a layer (every method but a layout answers itself) and reads two facts off it:

* ``window``  keys further back than this are unseen in this layer (a sliding-window layer); None: all.
* ``sink_logits``  (H,) learned logits that join every softmax row as one more key and are then dropped
  (GPT-OSS), so a head may put weight nowhere; None without. Such a layer scores its blocks itself.

What the explore pages draw of a method, without knowing which one it is (each has a default derived
from the hooks above, so a new method shows up with nothing more to write):

* ``bias_by_distance(layer, n_keys)``  (H, n) the bias its ``logit_bias`` adds for the last query of an
  n-key context, at distances 0..n-1; None when it adds none, or none that is a curve of distance alone.
* ``added_vectors(pos)``  (T, C) the vectors ``add_to_input`` adds at ``pos``; None when it adds none.
* ``rotation_frequencies(seq_len)``  (inv_freq, attention_factor) of a rotation; None without one.
* ``explore_sections``  the names of the extra sections it offers the explore pages (T5's buckets,
  Transformer-XL's four terms, ...): each name is drawn by the section of that name in views/_sections,
  so a page lists no method by name.

Shape legend: B batch, T / Tq / Tk sequence lengths, C model width, H heads, hs head size.
Positions are absolute integer positions (LongTensor of shape (T,)); with a KV cache the keys keep
the positions they were written at, so relative methods see true distances.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from posviz.config import strict_from_dict
from posviz.positions.runs import (  # noqa: F401  (re-exported: the methods import them from here)
    _version, mark_run, _noted_start, position_range, distance_range, run_start, relative_distance, bias_from_distance_table, at_least)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What a method needs to know about the model it plugs into."""

    n_layer: int
    n_head: int
    head_dim: int
    n_embd: int
    train_length: int


@dataclasses.dataclass
class NoOptions:
    """Methods without options still reject unknown keys."""


@dataclasses.dataclass
class Seen:
    """What a block of queries sees, for the methods that read content (shapes as in the legend)."""

    visible: torch.Tensor  # (rows, keys) bool: the keys each query may attend to (causal and window)
    q_index: torch.Tensor  # (rows,) long: the index of each query's own key among the keys
    k_state: torch.Tensor | None = None  # (B, H, keys) the keys' ``token_state``, None without one


def may_overwrite(t: torch.Tensor) -> bool:
    """Whether an operation may write over ``t`` in place: not while autograd records it (its backward may need it)."""
    return not (t.requires_grad and torch.is_grad_enabled())


class PositionMethod(nn.Module):
    """Base class: every hook defaults to "do nothing"."""

    name: ClassVar[str] = ""
    # What every page shows for this method (pickers, legends, tables): its name in the literature. ``name`` is
    # its id, kept for URLs, CSV files and configs. Empty: the id is shown (posviz.display falls back to it).
    display_name: ClassVar[str] = ""
    summary: ClassVar[str] = ""  # one line for tables in the app
    paper: ClassVar[str] = ""  # link to the paper that introduced it
    # "input", "q/k", "logits", "weights" or "nothing"; "pairs" for a RoPE remap, which rotates each query-key pair
    # at attention time (``pair_scorer``)
    acts_on: ClassVar[str] = "nothing"
    kind: ClassVar[str] = "none"  # "absolute", "relative", "content" (computed from the text) or "none"
    learned: ClassVar[bool] = False  # has trainable parameters
    # The bias uses the query's content (Shaw-style relative keys), so it is no curve of distance alone.
    bias_depends_on_query: ClassVar[bool] = False
    Options: ClassVar[type] = NoOptions
    # Extra explore sections this method offers (names registered in views/_sections); the pages draw
    # every registered method's generic views without it.
    explore_sections: ClassVar[tuple[str, ...]] = ()
    takes_remaps: ClassVar[bool] = False  # RoPE's rotation: the training-free remaps of ``rope_remaps`` apply
    # How many bytes before a token its keys read (a short convolution over time: PaTH's w reads 2): a window of keys
    # re-encoded from its first byte then differs a little from the same keys kept in a cache, which saw those bytes.
    reads_before: ClassVar[int] = 0
    weights_sum_to_one: ClassVar[bool] = True  # a softmax's rows (and stick-breaking's, its remainder on the diagonal)
    # The method makes each layer's q, k, v itself (``project_heads``: MLA's latents); attention then holds no c_attn.
    projects_heads: ClassVar[bool] = False

    def __init__(self, shape: ModelShape, options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.shape = shape
        self.options = strict_from_dict(self.Options, options, f"{self.name} options")
        self._memo: dict | None = None
        self.window: int | None = None  # set by a layout for its sliding-window layers
        self.register_parameter("sink_logits", None)  # (H,) set by a layout whose layers learn sinks

    def at_layer(self, layer: int) -> "PositionMethod":
        """The method acting in ``layer``: itself, except in a layout (``positions.layers``)."""
        return self

    def pinned_options(self) -> dict:
        """Every option this method was built with, written out (defaults and what a preset filled in), so
        that a checkpoint's config.json builds this very method again whatever later code defaults become."""
        return dataclasses.asdict(self.options)

    @property
    def computes_own_weights(self) -> bool:
        """Whether the method turns scores into weights itself (stick-breaking), not through the base softmax
        that a layer's sink logits join."""
        return type(self).attention_weights is not PositionMethod.attention_weights

    # -- the three hooks -------------------------------------------------------------------------
    def add_to_input(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        return x

    def rotate_qk(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k  # (B, H, T, hs) each

    def logit_bias(self, layer: int, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        return None  # else broadcastable to (B, H, Tq, Tk)

    def project_heads(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, T, widths of its own) from x (B, T, C), for a method that ``projects_heads``."""
        raise NotImplementedError(f"{self.name} does not project the heads itself")

    def token_mixer(self, layer: int) -> nn.Module | None:
        """The layer the method puts in attention's place in ``layer`` (a recurrent layer: Gated DeltaNet), called as
        attention is and answering the same; None (the default): attention."""
        return None

    def layer_kind(self, layer: int) -> str:
        """What mixes the bytes in ``layer``, as a lab titles its map."""
        return "attention"

    def output_gate(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        """None, or (B, H, T, hs) factors that multiply each head's output before the output projection, from the
        layer's input x (B, T, C): gated attention's sigmoid gate (Qwen3-Next), which lets a head output nothing
        without parking its weight on a sink."""
        return None

    # -- mixing neighbouring positions (see the module docstring) ----------------------------------
    def mix_hidden(self, layer: int, site: str, h: torch.Tensor, cache=None) -> torch.Tensor:
        return h  # (B, T, D) at ``site`` of ``layer``; a KVCache or None

    @property
    def mixes_hidden(self) -> bool:
        return type(self).mix_hidden is not PositionMethod.mix_hidden

    # -- positions from content (see the module docstring) ----------------------------------------
    def token_state(self, layer: int, x: torch.Tensor, cache=None) -> torch.Tensor | None:
        return None  # else (B, H, T) or (B, H, T, m) from the layer's input x (B, T, C); a KVCache or None

    def content_scorer(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: torch.Tensor | None,
                       q_pos: torch.Tensor | None = None, cache=None):
        return None  # else a function (r0, r1, seen, query positions, key positions) -> (B, H, rows, seen) scores

    def content_bias(self, layer: int, scores: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     seen: Seen) -> torch.Tensor | None:
        return None  # else (B, H, rows, keys), added to ``scores`` = q . k / sqrt(hs) (float32)

    def attention_weights(self, layer: int, scores: torch.Tensor, seen: Seen) -> torch.Tensor:
        """(B, H, rows, keys) weights from the block's scores: a softmax over the visible keys, with the
        sink logits as one more key when the layer has them (GPT-OSS: that key has no value and is dropped)."""
        scores = scores.masked_fill(~seen.visible, float("-inf"))
        if self.sink_logits is None:
            return scores.softmax(dim=-1)
        sink = self.sink_logits.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]

    def counted_positions(self, scores: torch.Tensor, seen: Seen) -> torch.Tensor | None:
        """(B, H, rows, keys) the position of each key as a query counts it from the content (CoPE), for the
        explore page to draw against plain distance; None for a method that counts none (the default)."""
        return None

    def turned_keys(self, k: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor | None:
        """(B, H, T, hs) each key k (B, H, T, hs) as the *last* query reads it, for a method that turns keys by what
        lies between (PaTH), for the explore page to set against the key itself; None for the others (the default)."""
        return None

    @property
    def reads_content(self) -> bool:
        """Whether attention must score blocks itself and hand them to the method (any content hook)."""
        base = PositionMethod
        return (type(self).token_state is not base.token_state or type(self).content_bias is not base.content_bias
                or type(self).content_scorer is not base.content_scorer
                or type(self).attention_weights is not base.attention_weights)

    @property
    def remaps_pairs(self) -> bool:
        """Whether the method attends each query-key pair at positions of its own (a RoPE remap: Self-Extend,
        ReRoPE, ...): attention then takes each block's scores from ``pair_scorer``."""
        return False

    def pair_scorer(self, layer: int, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """Optional, for a method that ``remaps_pairs``: made once per layer from the whole q (B, H, T, hs) and k
        (B, H, Tk, hs), a function (r0, r1, seen, block query positions, block key positions) -> (B, H, rows, seen)
        giving a block's scores in place of q . k / sqrt(hs). None (the default): the plain product."""
        return None

    @property
    def scores_itself(self) -> bool:
        """Whether attention scores this method's blocks itself (content hooks, sink logits, or pair remaps)."""
        return self.reads_content or self.sink_logits is not None or self.remaps_pairs

    def distance_bias(self, layer: int, q_pos: torch.Tensor, lo: int, hi: int) -> torch.Tensor | None:
        """Optional: (H, hi - lo + 1) bias at the distances lo..hi (0 <= lo <= hi) for the queries at
        ``q_pos``, equal to what ``logit_bias`` puts at those distances; None when it is no function
        of the distance alone (the default: attention then asks ``logit_bias``)."""
        return None

    def banded_bias(self, layer: int, q: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor | None:
        """Optional: (B, H, Tq, K+1) for a bias that depends on the query and a *clipped* distance: column
        d < K is the bias at distance d, column K the bias at every distance >= K (Shaw, NEZHA). Equal
        to what ``logit_bias`` puts there; None when the method has no such clip (the default)."""
        return None

    def relative_key_range(self, layer: int, q: torch.Tensor, lo: int, hi: int
                           ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Optional: for a bias ``q'_i . P_(i-j) / sqrt(hs)`` with its own key for every distance
        (Transformer-XL): (q' (B, H, Tq, hs), P (H, hi - lo + 1, hs)), the keys of distances lo..hi
        (negative distances may hold anything: attention masks them). None: not such a bias (default)."""
        return None

    @property
    def has_relative_key_range(self) -> bool:
        return type(self).relative_key_range is not PositionMethod.relative_key_range

    @property
    def has_banded_bias(self) -> bool:
        return type(self).banded_bias is not PositionMethod.banded_bias

    @property
    def has_distance_bias(self) -> bool:
        """Whether the method offers ``distance_bias`` at all."""
        return type(self).distance_bias is not PositionMethod.distance_bias

    # -- what the explore pages draw (defaults from the hooks) -------------------------------------
    @classmethod
    def draws_bias_by_distance(cls) -> bool:
        """Whether ``bias_by_distance`` gives a curve: a logit bias that does not read the query's content."""
        return cls.logit_bias is not PositionMethod.logit_bias and not cls.bias_depends_on_query

    def bias_by_distance(self, layer: int, n_keys: int) -> torch.Tensor | None:
        """(H, n) float64 on the CPU: the bias ``logit_bias`` adds for the *last* query of an n-key
        context, for keys at distance 0 .. n-1 (FIRE's also depends on where that query sits: here at
        position n-1). None when the method adds no bias, or one that reads the query's content."""
        if not self.draws_bias_by_distance():
            return None
        H = self.shape.n_head
        q_pos = torch.tensor([n_keys - 1])
        k_pos = n_keys - 1 - torch.arange(n_keys)  # the key at distance d sits at position n-1-d
        param = next(self.parameters(), None)
        q = torch.zeros(1, H, 1, self.shape.head_dim, dtype=torch.float32 if param is None else param.dtype)
        with torch.inference_mode():
            bias = self.logit_bias(layer, q, q_pos, k_pos)
            self.forget()
        if bias is None:
            return None
        return bias.expand(1, H, 1, n_keys)[0, :, 0].double().cpu()

    def added_vectors(self, pos: torch.Tensor) -> torch.Tensor | None:
        """(T, C) float64 on the CPU: what ``add_to_input`` adds to the token embeddings at positions
        ``pos`` (T,); None when the method adds nothing there."""
        if type(self).add_to_input is PositionMethod.add_to_input:
            return None
        param = next(self.parameters(), None)
        zeros = torch.zeros(1, pos.numel(), self.shape.n_embd, dtype=torch.float32 if param is None else param.dtype,
                            device=None if param is None else param.device)
        with torch.inference_mode():
            added = self.add_to_input(zeros, pos.to(zeros.device))
            self.forget()
        return added[0].double().cpu()

    def rotation_frequencies(self, seq_len: int) -> tuple[torch.Tensor, float] | None:
        """(inv_freq (pairs,), attention_factor) of a method that rotates queries and keys, for a sequence
        of ``seq_len`` positions; None when it rotates nothing (the default)."""
        return None

    def after_optimizer_step(self) -> None:
        """Called by training after every optimizer step: where a method keeps its stored parameters
        in their domain, as its reference code does (KERPLE's floor). Default: nothing."""

    # -- facts the app and the evaluators use -----------------------------------------------------
    @property
    def max_positions(self) -> int | None:
        """Largest number of positions the method can represent; None when unbounded."""
        return None

    @property
    def is_absolute(self) -> bool:
        return self.kind == "absolute"

    def is_shift_invariant(self) -> bool:
        """Whether scores depend on distances alone, so that a window of keys may start at any position
        (relative methods, the content methods, whose scores read no index at all, and NoPE; FIRE is
        relative, but past its threshold it divides each distance by a function of the query's own position).
        Asked of the method as configured: NoPE with Llama 4's temperature reads the query's position."""
        return self.kind in ("relative", "content", "none")

    def folded_scores(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: torch.Tensor | None):
        """Optional, for a method that scores from content: (q', k', scale) (B, H, T, hs') whose causal dot products
        times ``scale`` are this layer's scores, bias included, over a whole sequence with no cache, window or
        map: a bias that is a query term plus a key term folds into one more feature each, and the fused causal
        kernel takes it. None (the default): attention scores the blocks itself."""
        return None

    def shift_cached_keys(self, layer: int, k: torch.Tensor, shift: int) -> torch.Tensor | None:
        """Keys (B, H, T, hs) that ``layer`` cached at positions p, as the same ids give them at p + ``shift``,
        computed from the cached keys alone; None (the default) when the method cannot, and the ids must run
        again. StreamingLLM moves its sinks this way (``KVCache.shift_front``): it is exact only where a
        key's position enters through a rotation fixed for every length and the layers before it read
        distances alone (RoPE, p-RoPE and its static scalings, and layouts of them)."""
        return None

    def check_positions(self, pos: torch.Tensor) -> None:
        """Raise a PositionLimitError naming the position when ``pos`` is past what the method has."""

    @property
    def has_logit_bias(self) -> bool:
        """Whether ``logit_bias`` can return anything: without one, attention uses the fused causal kernel."""
        return type(self).logit_bias is not PositionMethod.logit_bias

    MEMO_ENTRIES: ClassVar[int] = 256  # one per query block of a forward pass; cleared after each pass

    def _memoized(self, q_pos: torch.Tensor, k_pos: torch.Tensor, compute, tag: tuple = ()) -> torch.Tensor:
        """Reuse a value across the layers of one forward pass (T5 and ALiBi share their bias across
        layers, RoPE its angles). Attention asks per block of queries, with position tensors that are
        the same objects in every layer.

        Keyed on the identity and version of the position tensors, which the memo keeps alive, so a
        recycled id can never return a stale value. The model calls ``forget`` after every pass.
        """
        memo = self._memo if self._memo is not None else {}
        key = (id(q_pos), id(k_pos), *tag)  # tag: what else the value depends on (a distance range)
        hit = memo.get(key)
        if hit is not None and hit[0] is q_pos and hit[1] is k_pos and \
                hit[2] == (_version(q_pos), _version(k_pos), self.training):
            return hit[3]
        value = compute()
        if len(memo) >= self.MEMO_ENTRIES:
            memo.pop(next(iter(memo)))
        memo[key] = (q_pos, k_pos, (_version(q_pos), _version(k_pos), self.training), value)
        self._memo = memo
        return value

    KEPT_ENTRIES: ClassVar[int] = 64

    def _kept(self, key: tuple, compute, params) -> torch.Tensor | None:
        """Like ``_memoized``, but kept *across* forward passes while ``params`` stay as they are (same
        tensors, same version counters, dtype and device): for the small per-distance tables that a
        decoding loop asks for with the same distances at every step. Not kept while autograd could
        need the graph (training)."""
        params = list(params)
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return compute()
        stamp = (self.training, *((id(p), _version(p), p.dtype, p.device) for p in params))
        kept = self.__dict__.setdefault("_kept_values", {})
        hit = kept.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = compute()
        if len(kept) >= self.KEPT_ENTRIES:
            kept.clear()
        kept[key] = (stamp, value)
        return value

    DISTANCE_STEP: ClassVar[int] = 256

    def _kept_distances(self, key: tuple, lo: int, hi: int, compute, params) -> torch.Tensor | None:
        """``compute(lo, top)`` (H, top - lo + 1) kept by ``_kept`` for ``top`` = ``hi`` rounded up to a
        whole number of ``DISTANCE_STEP`` distances, returned as the view of distances lo..hi.

        A decoding loop asks for one more distance at every step: kept under (lo, hi), the table was
        computed afresh for every byte (a quarter of a KERPLE step); this computes it once per 256.
        Each entry is a function of its own distance alone, so the longer table holds the same values.
        """
        top = lo + -(-(hi - lo + 1) // self.DISTANCE_STEP) * self.DISTANCE_STEP - 1
        table = self._kept((*key, lo, top), lambda: compute(lo, top), params)
        return None if table is None else table[:, :hi - lo + 1]

    def forget(self) -> None:
        """Drop what ``_memoized`` holds; the model calls it at the end of every forward pass."""
        self._memo = None

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(self.options).items())
