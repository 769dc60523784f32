"""KERPLE, logarithmic variant (Chi et al. 2022), https://arxiv.org/abs/2205.09921 (§4, eq. "log")

A bias from a conditionally positive definite kernel of the distance, learned per head and layer:

    bias(i, j) = -r1 * log(1 + r2 * (i - j)),   r1, r2 > 0

Like ALiBi it only ever lowers the logit of farther keys, but the penalty grows like a logarithm,
not linearly, so far keys are pushed down far less; and both the strength r1 and the bend r2 are
learned. Initialisation follows the authors' released code: r1 ~ U(0, 2), r2 ~ U(0, 1); like it,
the values used are at least 0.01 (see ``base.at_least``).
Shapes: r1, r2 (n_layer, H); bias (1, H, Tq, Tk).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from posviz.config import require
from posviz.positions.base import (PositionMethod, at_least, bias_from_distance_table, distance_range,
                                   relative_distance)

MIN_PARAMETER = 0.01  # r1, r2 > 0: the kernel is only conditionally positive definite for positive values


@dataclasses.dataclass
class KerpleOptions:
    r1_init_max: float = 2.0  # r1 ~ U(0, r1_init_max): the authors' code
    r2_init_max: float = 1.0  # r2 ~ U(0, r2_init_max)

    def __post_init__(self):
        for key in ("r1_init_max", "r2_init_max"):
            value = getattr(self, key)
            require(isinstance(value, (int, float)) and value > MIN_PARAMETER, f"kerple {key} must be > {MIN_PARAMETER}, got {value!r}")


def kerple_log_bias(r1: torch.Tensor, r2: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """(H, *distance.shape): -r1 log(1 + r2 d) for distances d >= 0 (negative distances count as 0)."""
    d = distance.clamp(min=0).to(r1.dtype)
    return -r1.view(-1, *([1] * d.dim())) * torch.log1p(r2.view(-1, *([1] * d.dim())) * d)


class Kerple(PositionMethod):
    name = "kerple"
    display_name = "KERPLE"
    summary = "A learned logarithmic distance penalty per head and layer: -r1 log(1 + r2 d)."
    paper = "https://arxiv.org/abs/2205.09921"
    acts_on = "logits"
    kind = "relative"
    learned = True
    Options = KerpleOptions
    explore_sections = ("kerple-formula",)

    def __init__(self, shape, options=None):
        super().__init__(shape, options)
        L, H = shape.n_layer, shape.n_head
        self.r1 = nn.Parameter(torch.rand(L, H) * self.options.r1_init_max)  # (L, H) strength
        self.r2 = nn.Parameter(torch.rand(L, H) * self.options.r2_init_max)  # (L, H) bend

    def parameters_of(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(r1, r2) of one layer, each (H,), as the forward pass uses them: at least MIN_PARAMETER."""
        return at_least(self.r1[layer], MIN_PARAMETER), at_least(self.r2[layer], MIN_PARAMETER)

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """The authors' floor: clamp the stored r1, r2 after each update, so a value pushed below it
        sits at the floor and can rise again (without this, AdamW drove two heads' stored r1 to -2
        while the forward pass used 0.01)."""
        self.r1.clamp_(min=MIN_PARAMETER)
        self.r2.clamp_(min=MIN_PARAMETER)

    def logit_bias(self, layer, q, q_pos, k_pos):
        r1, r2 = self.parameters_of(layer)
        distance = relative_distance(q_pos, k_pos).to(r1.device)  # (Tq, Tk)
        lo, hi = distance_range(q_pos, k_pos)  # without reading the positions back
        table = kerple_log_bias(r1, r2, torch.arange(lo, hi + 1, device=r1.device))  # (H, D): one value per distance
        return bias_from_distance_table(table, distance, lo).unsqueeze(0).to(q.dtype)  # (1, H, Tq, Tk)

    def distance_bias(self, layer, q_pos, lo, hi):
        def compute(lo, top):
            r1, r2 = self.parameters_of(layer)
            return kerple_log_bias(r1, r2, torch.arange(lo, top + 1, device=r1.device))  # (H, D)
        return self._kept_distances(("distance", layer), lo, hi, compute, [self.r1, self.r2])
