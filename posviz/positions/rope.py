"""Rotary position embedding, RoPE (Su et al. 2021), GPT-NeoX half-split convention.

"RoFormer: Enhanced Transformer with Rotary Position Embedding", https://arxiv.org/abs/2104.09864

The first ``rot_dim`` features of each query and key are split in halves (x1, x2); pair i = (x1[i],
x2[i]) is rotated by angle p * theta_i at position p. Then q_m . k_n depends only on m - n. The rest
of the head (when rotary_fraction < 1) passes through unrotated. The rotation speeds come from a
scaling function chosen by name (``rope_scaling.ROPE_SCALINGS``), which is how context-extension
methods are applied at inference without retraining.
Shapes: q, k (B, H, T, hs); pos (T,); cos, sin (T, rot_dim).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from posviz.config import require
from posviz.positions.base import PositionMethod, position_range
from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.positions.rope_scaling import ROPE_SCALINGS


@dataclasses.dataclass
class RopeOptions:
    base: float = 10000.0
    rotary_fraction: float = 1.0  # share of each head that is rotated (GPT-NeoX used 0.25)
    scaling: str = "none"  # a name in ROPE_SCALINGS
    factor: float = 1.0  # context-extension factor s for the scalings
    original_length: int | None = None  # the length trained on; None means the model's train_length
    beta_fast: float = 32.0  # yarn: pairs turning more than this many times keep their speed
    beta_slow: float = 1.0  # yarn: pairs turning fewer times are fully interpolated
    attention_factor: float | None = None  # yarn: None means 0.1 ln(factor) + 1
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    long_factor: list | None = None  # longrope: each pair's rescale past original_length (None: YaRN's ratios)
    short_factor: list | None = None  # longrope: each pair's rescale up to original_length (None: all 1)
    # a training-free position remap (``rope_remaps.ROPE_REMAPS``): which positions each query-key pair is
    # attended at; its options' missing values are filled in to cover factor x original_length
    remap: str = "none"
    remap_options: dict | None = None

    def __post_init__(self):
        require(self.scaling in ROPE_SCALINGS,
                f"Unknown RoPE scaling {self.scaling!r}. Known scalings: {', '.join(ROPE_SCALINGS)}.")
        require(self.base > 1, f"rope base must be > 1, got {self.base}")
        require(0 < self.rotary_fraction <= 1, f"rotary_fraction must be in (0, 1], got {self.rotary_fraction}")
        require(self.factor >= 1, f"rope factor must be >= 1, got {self.factor}")
        require(self.high_freq_factor > self.low_freq_factor > 0,
                "llama3 needs high_freq_factor > low_freq_factor > 0")
        require(self.original_length is None or (isinstance(self.original_length, int) and self.original_length >= 1),
                f"rope original_length must be a positive integer or None, got {self.original_length!r}")
        require(self.beta_fast > self.beta_slow > 0, "yarn needs beta_fast > beta_slow > 0")
        for name in ("long_factor", "short_factor"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, list) and all(isinstance(v, (int, float)) and v > 0 for v in value)),
                    f"longrope's {name} must be a list of positive numbers (one per rotary pair), got {value!r}")
        require(self.remap == "none" or self.remap in ROPE_REMAPS,
                f"Unknown RoPE remap {self.remap!r}. Known remaps: {', '.join(ROPE_REMAPS)}.")
        require(self.remap_options is None or isinstance(self.remap_options, dict),
                f"rope remap_options must be a mapping, got {self.remap_options!r}")
        require(self.remap == "none" or not ROPE_SCALINGS[self.scaling].reads_length,
                f"the {self.remap} remap needs speeds fixed for every length; {self.scaling} changes them with the length")
        require(self.attention_factor is None or self.attention_factor > 0,
                f"rope attention_factor must be positive or None, got {self.attention_factor!r}")


def rotary_dim(head_dim: int, fraction: float) -> int:
    return max(2, int(head_dim * fraction) // 2 * 2)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0,
                 dtype: torch.dtype = torch.float32):
    """cos, sin of shape (T, rot_dim) for positions ``pos`` (T,) and speeds ``inv_freq`` (rot_dim/2,).

    Computed in float64; ``dtype=torch.float64`` keeps that precision (identity checks in the app)."""
    angles = pos.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]  # (T, rot/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, rot): the same angle for x1[i] and x2[i]
    return (torch.cos(angles) * attention_factor).to(dtype), (torch.sin(angles) * attention_factor).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] features of x (..., T, hs); the rest pass through."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


class Rotary(PositionMethod):
    name = "rope"
    display_name = "RoPE"
    summary = "Rotates each query/key pair of features by position x frequency; scores depend on m - n."
    paper = "https://arxiv.org/abs/2104.09864"
    acts_on = "q/k"
    kind = "relative"
    Options = RopeOptions
    takes_remaps = True

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        if self.options.original_length is None:
            self.options.original_length = shape.train_length
        self.rot_dim = rotary_dim(shape.head_dim, self.options.rotary_fraction)
        self.scale_fn = ROPE_SCALINGS[self.options.scaling]
        self.remap, self.remap_options = None, None
        if self.options.remap != "none":
            self.remap = ROPE_REMAPS[self.options.remap]
            original = self.options.original_length
            self.remap_options = self.remap.build(self.options.remap_options, original,
                                                  round(self.options.factor * original))
            self.options.remap_options = dataclasses.asdict(self.remap_options)  # pinned: every value written out
            # each pair is rotated at attention time, at the positions the remap gives it: keys are cached as
            # they are, and the cache's own positions decide (a KV cache lab's verdicts read this)
            self.acts_on = "pairs"
        self._device_freqs: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # see _on_device

    def frequencies(self, seq_len: int) -> tuple[torch.Tensor, float]:
        """(inv_freq (rot_dim/2,), attention_factor) for a sequence of ``seq_len`` positions."""
        return self.scale_fn(self.rot_dim, self.options, seq_len)

    def _on_device(self, inv_freq: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``inv_freq`` (computed on the CPU by the scaling functions) on ``device``, copied only when it
        changed: a copy from the CPU to a GPU waits for everything queued on the GPU, which would be once
        per decoding step. Comparing the two CPU tensors waits for nothing (dynamic NTK changes them)."""
        if inv_freq.device == device:
            return inv_freq
        held = self._device_freqs.get(device)
        if held is None or held[0].shape != inv_freq.shape or not torch.equal(held[0], inv_freq):
            held = self._device_freqs[device] = (inv_freq, inv_freq.to(device))
        return held[1]

    def rotation_frequencies(self, seq_len: int) -> tuple[torch.Tensor, float]:
        return self.frequencies(seq_len)

    @property
    def remaps_pairs(self) -> bool:
        return self.remap is not None

    def is_shift_invariant(self) -> bool:
        return self.remap is None or self.remap.shift_invariant(self.remap_options)

    def rotate_qk(self, q, k, pos):  # q, k (B, H, T, hs); pos (T,)
        if self.remap is not None:  # rotated per pair map in ``pair_scorer``; a KV cache keeps them unrotated
            return q, k

        def compute():
            inv_freq, attention = self.frequencies(position_range(pos)[1] + 1 if pos.numel() else 1)
            # on the positions' own device: a round trip through the CPU would wait for the GPU
            cos, sin = rope_cos_sin(pos, self._on_device(inv_freq, pos.device), attention)
            return cos.to(q.device), sin.to(q.device)

        def signed():
            cos, sin = self._memoized(pos, pos, compute)
            half = sin.shape[-1] // 2
            return cos.to(q.dtype), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).to(q.dtype)

        cos, signed_sin = self._memoized(pos, pos, signed, ("signed",))  # once per pass, shared by the layers
        return _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)


    def pair_scorer(self, layer: int, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """Under a remap: the (unrotated) queries (B, H, T, hs) and keys (B, H, Tk, hs) rotated once per map at that
        map's positions, and a function of a block (r0, r1, seen, the block's query and key positions) that gives
        its scores q . k / sqrt(hs), each pair from the map the remap chose for it. None without a remap."""
        if self.remap is None:
            return None
        L, opts = self.options.original_length, self.remap_options

        def rotations():  # once per forward pass: every layer rotates at the same positions
            inv_freq, attention = self.frequencies(L)  # static speeds (the options refuse a scaling reading the length)
            inv_freq = self._on_device(inv_freq, q_pos.device)
            # A map's query positions depend on i alone and its key positions on j alone (the remaps' contract,
            # tested), so each side is read against one position of the other, not the whole (T, Tk) choice.
            by_query, by_key = self.remap.maps(q_pos, k_pos[:1], opts, L), self.remap.maps(q_pos[:1], k_pos, opts, L)
            factor = attention * by_query.attention_factor
            # in float64, as the positions (a leaky stretch makes them fractions); each layer casts to its own dtype
            angles = [[rope_cos_sin(p.to(q_pos.device), inv_freq, factor, torch.float64) for p in side]
                      for side in (by_query.q_positions, by_key.k_positions)]
            return angles[0], angles[1], by_query.q_scale

        q_angles, k_angles, q_scale = self._memoized(q_pos, k_pos, rotations, ("remap",))
        if q_scale is not None:
            q = q * q_scale.to(device=q.device, dtype=q.dtype)[:, None]  # (T, 1): each query's own scale
        qs = [apply_rotary(q, cos, sin) for cos, sin in q_angles]  # per map (B, H, T, hs)
        ks = [apply_rotary(k, cos, sin) for cos, sin in k_angles]  # per map (B, H, Tk, hs)
        scale = 1.0 / math.sqrt(q.shape[-1])

        def block_scores(r0: int, r1: int, seen: int, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
            choice = self._memoized(qp, kp, lambda: self.remap.maps(qp, kp, opts, L).choice.to(qp.device), ("choice",))
            scores = None
            for m, (qm, km) in enumerate(zip(qs, ks)):
                picked = choice == m
                if scores is not None and not bool(picked.any()):
                    continue  # no pair of this block is scored with map m
                s = torch.matmul(qm[:, :, r0:r1], km[:, :, :seen].transpose(-2, -1)) * scale  # (B, H, rows, seen)
                scores = s if scores is None else torch.where(picked, s, scores)
            return scores

        return block_scores

    def shift_cached_keys(self, layer: int, k: torch.Tensor, shift: int) -> torch.Tensor | None:
        """Keys rotated at positions p (B, H, T, hs), as ``rotate_qk`` gives them at p + ``shift``: one more turn
        by ``shift`` x each pair's speed, since R(p + s) = R(s) R(p) and the attention factor is already in them.
        Only where the speeds do not depend on the sequence length (not dynamic NTK, not LongRoPE's switch)."""
        if self.scale_fn.reads_length or self.remap is not None:
            return None
        key = (shift, k.device, k.dtype)
        held = getattr(self, "_turn", None)  # StreamingLLM turns every layer's sinks by the same shift each step
        if held is None or held[0] != key:
            inv_freq = getattr(self, "_turn_freq", None)
            if inv_freq is None or inv_freq.device != k.device:  # static speeds: worked out once
                inv_freq = self._turn_freq = self._on_device(self.frequencies(self.shape.train_length)[0], k.device)
            cos, sin = rope_cos_sin(torch.tensor([shift], device=k.device), inv_freq)
            half = sin.shape[-1] // 2
            held = self._turn = (key, cos.to(k.dtype), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).to(k.dtype))
        return _rotate(k, held[1], held[2])


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary`` in four operations: rotate_half(x) * sin = roll(x, half) * (-sin, sin), exactly.

    A cached decoding step runs this twice per layer on one byte, where each operation costs more
    than its arithmetic; ``apply_rotary`` (the reference, checked against Hugging Face) takes ten."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + x.roll(rot // 2, dims=-1) * signed_sin
    x_rot = x[..., :rot]
    return torch.cat((x_rot * cos + x_rot.roll(rot // 2, dims=-1) * signed_sin, x[..., rot:]), dim=-1)
