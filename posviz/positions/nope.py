"""NoPE: no position information at all; only the causal mask orders the tokens.

Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in Transformers",
https://arxiv.org/abs/2305.19466 . A causal decoder can still infer position (e.g. by counting how
much attention mass is spread), which is why NoPE is a real baseline and not a strawman.

Option: Llama 4's attention temperature for its NoPE layers (``Llama4TextAttention``, transformers): each
query is scaled by ``log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1``, so that attention stays
sharp as a context grows past what it was trained on. It reads the query's absolute position, so a
NoPE layer with it is no longer shift-invariant (``irope`` says so). Shapes: q, k (B, H, T, hs); pos (T,).
"""
from __future__ import annotations

import dataclasses

import torch

from posviz.config import require
from posviz.positions.base import PositionMethod


@dataclasses.dataclass
class NoPEOptions:
    temperature_floor_scale: int | None = None  # Llama 4: 8,192; None: no temperature (plain NoPE)
    temperature_attn_scale: float = 0.1  # Llama 4's attn_scale

    def __post_init__(self):
        require(self.temperature_floor_scale is None or (isinstance(self.temperature_floor_scale, int)
                                                        and self.temperature_floor_scale >= 1),
                f"temperature_floor_scale must be a positive integer or None, got {self.temperature_floor_scale!r}")


def query_temperature(pos: torch.Tensor, floor_scale: int, attn_scale: float) -> torch.Tensor:
    """(T,) Llama 4's scale of the queries at absolute positions ``pos``."""
    return torch.log1p(torch.floor((pos.float() + 1.0) / floor_scale)) * attn_scale + 1.0


class NoPE(PositionMethod):
    name = "nope"
    display_name = "NoPE"
    summary = "No position signal; order comes only from the causal mask."
    paper = "https://arxiv.org/abs/2305.19466"
    acts_on = "nothing"
    kind = "none"
    Options = NoPEOptions

    def is_shift_invariant(self) -> bool:
        return self.options.temperature_floor_scale is None  # the temperature reads the query's position

    def rotate_qk(self, q, k, pos):
        if self.options.temperature_floor_scale is None:
            return q, k
        scale = query_temperature(pos.to(q.device), self.options.temperature_floor_scale,
                                  self.options.temperature_attn_scale)
        return (q * scale[:, None].to(q.dtype)), k  # (B, H, T, hs) * (T, 1)
