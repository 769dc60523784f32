"""NEZHA's functional relative positions (Wei et al. 2019), https://arxiv.org/abs/1909.00204 (§3.2)

Shaw et al.'s relative keys, but *fixed* instead of learned: the key of (clipped) distance d is a
sinusoid of d, exactly as the sinusoidal absolute encoding is of a position,

    a_d[2i] = sin(d / base^(2i/hs)),  a_d[2i+1] = cos(d / base^(2i/hs)),   d = min(i - j, k)

and the bias is q_i . a_d / sqrt(hs), as in Shaw. One table serves every head and layer, and the
method has no parameters. The paper writes the distance as j - i; a causal model only sees keys at
or before the query, so we use d = i - j >= 0 (the sign only flips the sine half, which the
learned query can absorb). The paper also adds relative vectors to the values; like our Shaw, this
is the key side only, so the two differ only in learned vs fixed keys.
Shapes: q (B, H, Tq, hs), table (k+1, hs), bias (B, H, Tq, Tk).
"""
from __future__ import annotations

import dataclasses

from posviz.config import require
from posviz.positions.shaw import RelativeKeys
from posviz.positions.sinusoidal import sinusoidal_table


@dataclasses.dataclass
class NezhaOptions:
    max_distance: int = 64  # k, as our Shaw: the two then differ only in fixed vs learned keys
    base: float = 10000.0  # wavelengths 2*pi .. base*2*pi, as the sinusoidal absolute encoding

    def __post_init__(self):
        require(isinstance(self.max_distance, int) and self.max_distance >= 1, "nezha max_distance must be an integer >= 1")
        require(isinstance(self.base, (int, float)) and self.base > 1, f"nezha base must be > 1, got {self.base!r}")


class Nezha(RelativeKeys):
    name = "nezha"
    display_name = "NEZHA"
    summary = "Fixed sinusoidal relative key vectors per clipped distance (Shaw's form, no parameters)."
    paper = "https://arxiv.org/abs/1909.00204"
    Options = NezhaOptions
    explore_sections = ("nezha-keys",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        require(shape.head_dim % 2 == 0, f"nezha needs an even head size, got {shape.head_dim}")
        table = sinusoidal_table(self.options.max_distance + 1, shape.head_dim, self.options.base)  # (k+1, hs)
        self.register_buffer("rel_keys", table, persistent=False)  # a function of the options: never saved

    def relative_keys(self, layer, q_pos, k_pos):
        return self.rel_keys  # (k+1, hs), the same in every layer
