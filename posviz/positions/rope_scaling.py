"""Inference-time RoPE scalings: a registry of small functions with one signature.

Each function takes the rotary dimension, the model's RoPE options and the current sequence length
and returns ``(inv_freq, attention_factor)``: the rotation speed of each of the rot_dim/2 pairs and
a factor that multiplies cos and sin (so the logits scale by its square). A new scaling is one
function registered by name; the model never branches on which one it has.

References:
* linear (position interpolation): Chen et al. 2023, https://arxiv.org/abs/2306.15595
* ntk (NTK-aware base change): bloc97 2023, https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/
* dynamic (dynamic NTK): emozilla 2023, https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/
* yarn: Peng et al. 2023, https://arxiv.org/abs/2309.00071
* llama3: Meta 2024, "The Llama 3 Herd of Models", https://arxiv.org/abs/2407.21783
* longrope: Ding et al. 2024, "LongRoPE", https://arxiv.org/abs/2402.13753 (Phi-3's rope_type "longrope")
"""
from __future__ import annotations

import math
from typing import Callable

import torch

RopeScaling = Callable[[int, "object", int], tuple[torch.Tensor, float]]
ROPE_SCALINGS: dict[str, RopeScaling] = {}


def register(name: str, display_name: str, reads_length: bool = False):
    """``display_name``: what the pages show ("dynamic NTK"); ``name`` is the id URLs and configs use.
    ``reads_length``: the speeds depend on the sequence length (dynamic NTK, LongRoPE's switch), so a key
    cached at one length cannot be turned to another position by a rotation alone."""
    def wrap(fn: RopeScaling) -> RopeScaling:
        fn.reads_length = reads_length
        fn.display_name = display_name
        ROPE_SCALINGS[name] = fn
        return fn

    return wrap


def base_inv_freq(rot_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/rot_dim), i = 0 .. rot_dim/2 - 1: pair i turns theta_i radians per position."""
    return 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))


@register("none", "no scaling")
def no_scaling(rot_dim, opts, seq_len):
    return base_inv_freq(rot_dim, opts.base), 1.0


@register("linear", "linear")
def position_interpolation(rot_dim, opts, seq_len):
    # Squeeze positions: position p is rotated as if it were p / factor, so L*factor fits in L.
    return base_inv_freq(rot_dim, opts.base) / opts.factor, 1.0


def _ntk_base(base: float, rot_dim: int, ratio: float) -> float:
    # Raising the base by ratio^(d/(d-2)) slows the slowest pair by exactly `ratio` and leaves the
    # fastest almost untouched: interpolate low frequencies, extrapolate high ones.
    return base * ratio ** (rot_dim / (rot_dim - 2))


@register("ntk", "NTK")
def ntk_aware(rot_dim, opts, seq_len):
    return base_inv_freq(rot_dim, _ntk_base(opts.base, rot_dim, opts.factor)), 1.0


@register("dynamic", "dynamic NTK", reads_length=True)
def dynamic_ntk(rot_dim, opts, seq_len):
    # Unchanged up to the original length; past it the NTK ratio grows with the sequence seen so far.
    seq_len = max(seq_len, opts.original_length)
    ratio = opts.factor * seq_len / opts.original_length - (opts.factor - 1)
    return base_inv_freq(rot_dim, _ntk_base(opts.base, rot_dim, ratio)), 1.0


def yarn_attention_factor(factor: float) -> float:
    """YaRN's sqrt(1/t) = 0.1 ln(s) + 1: sharpens attention that interpolation made flatter."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


@register("yarn", "YaRN")
def yarn(rot_dim, opts, seq_len):
    base, factor, original = opts.base, opts.factor, opts.original_length

    def pair_index_with_rotations(rotations: float) -> float:
        # Pair index whose wavelength fits `rotations` full turns in the original context.
        return rot_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index_with_rotations(opts.beta_fast)), 0)
    high = min(math.ceil(pair_index_with_rotations(opts.beta_slow)), rot_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    # ramp 0: fast pairs that turn many times in the original context keep their frequency;
    # ramp 1: slow pairs are interpolated like position interpolation; in between, a blend.
    theta = base_inv_freq(rot_dim, base)
    inv_freq = theta * (1 - ramp) + (theta / factor) * ramp
    attention = opts.attention_factor if opts.attention_factor is not None else yarn_attention_factor(factor)
    return inv_freq, attention


@register("llama3", "Llama 3")
def llama3(rot_dim, opts, seq_len):
    theta = base_inv_freq(rot_dim, opts.base)
    wavelength = 2 * math.pi / theta
    original = opts.original_length
    long_wave = original / opts.low_freq_factor  # longer than this: fully interpolated
    short_wave = original / opts.high_freq_factor  # shorter than this: untouched
    smooth = (original / wavelength - opts.low_freq_factor) / (opts.high_freq_factor - opts.low_freq_factor)
    blended = (1 - smooth) * theta / opts.factor + smooth * theta
    inv_freq = torch.where(wavelength > long_wave, theta / opts.factor, theta)
    middle = (wavelength >= short_wave) & (wavelength <= long_wave)
    return torch.where(middle, blended, inv_freq), 1.0


@register("longrope", "LongRoPE", reads_length=True)
def longrope(rot_dim, opts, seq_len):
    # One rescale factor per pair, pair i turning at theta_i / lambda_i: "short" factors up to the original
    # length, "long" ones past it (Phi-3 switches on the sequence length). LongRoPE *searches* its factors;
    # without searched ones posviz takes YaRN's per-pair ratios (1 for fast pairs, the factor for slow ones),
    # and a published model's own (Phi-3, Phi-4-mini) are used as given. The attention factor is the paper's
    # sqrt(1 + ln s / ln L), s the extension factor and L the original length.
    theta = base_inv_freq(rot_dim, opts.base)
    original = opts.original_length
    if seq_len > original:
        ext = (torch.tensor(opts.long_factor, dtype=torch.float64) if opts.long_factor is not None
               else theta / yarn(rot_dim, opts, seq_len)[0])
    else:
        ext = torch.tensor(opts.short_factor, dtype=torch.float64) if opts.short_factor is not None else torch.ones_like(theta)
    if ext.numel() != theta.numel():
        raise ValueError(f"longrope needs one factor per rotary pair ({theta.numel()}), got {ext.numel()}")
    attention = opts.attention_factor if opts.attention_factor is not None else (
        1.0 if opts.factor <= 1 else math.sqrt(1 + math.log(opts.factor) / math.log(original)))
    return theta / ext, attention
