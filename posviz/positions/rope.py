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

import torch

from posviz.config import require
from posviz.positions.base import PositionMethod, position_range
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
    summary = "Rotates each query/key pair of features by position x frequency; scores depend on m - n."
    paper = "https://arxiv.org/abs/2104.09864"
    acts_on = "q/k"
    kind = "relative"
    Options = RopeOptions

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        if self.options.original_length is None:
            self.options.original_length = shape.train_length
        self.rot_dim = rotary_dim(shape.head_dim, self.options.rotary_fraction)
        self.scale_fn = ROPE_SCALINGS[self.options.scaling]
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

    def rotate_qk(self, q, k, pos):  # q, k (B, H, T, hs); pos (T,)
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


    def shift_cached_keys(self, layer: int, k: torch.Tensor, shift: int) -> torch.Tensor | None:
        """Keys rotated at positions p (B, H, T, hs), as ``rotate_qk`` gives them at p + ``shift``: one more turn
        by ``shift`` x each pair's speed, since R(p + s) = R(s) R(p) and the attention factor is already in them.
        Only where the speeds do not depend on the sequence length (not dynamic NTK, not LongRoPE's switch)."""
        if self.scale_fn.reads_length:
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
