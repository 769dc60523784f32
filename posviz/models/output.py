"""What every model's forward pass returns, whatever its kind: part of the lab interface
(``posviz.models.interface``), in a module of its own so that the networks that build it (the byte GPT,
transformers' models) depend on nothing above them."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """What every model's forward pass returns, whatever its kind."""

    logits: torch.Tensor  # (B, T, V)
    attention: torch.Tensor | None = None  # (B, H, T, Tk) or (B, T, Tk) for one head; only when asked
