"""What a deployer sets for published models (``$POSVIZ_MODELS``, ``$POSVIZ_ALLOW_ANY_MODEL``), and the caps that keep
one visitor's published model from exhausting a shared server: its parameters, one pass's work, its temporaries.
"""
from __future__ import annotations

import math
import os

DEFAULT_MAX_PARAMS = 2_000_000_000  # Falcon-RW-1B (1.3 B) fits; a 7 B model does not, on a shared demo
# Work one forward pass may take (multiply-adds x 2) on a CPU: ~20 s for GPT-2 small on 2 cores. It caps
# a published model's length on a CPU below 16 x its context (GPT-2 small: 8,192 tokens, not 16,384).
CPU_FLOP_BUDGET = 2e12
GPU_FLOP_BUDGET = 5e14
DEFAULT_MAX_WORK_BYTES = 6 * 2**30  # a forward pass's biggest temporaries (attention maps, ALiBi biases)


def forward_flops(tokens: int, n_params: int, n_layer: int, hidden: int) -> float:
    """Floating-point operations of one causal forward pass: 2 per weight per token, plus attention's
    q.k and weighted sum over half a T x T square per layer (2 x 2 x hidden per query-key pair)."""
    return 2 * n_params * tokens + 2 * n_layer * hidden * tokens * tokens


def tokens_within(budget: float, n_params: int, n_layer: int, hidden: int) -> int:
    """The longest pass whose ``forward_flops`` fit in ``budget`` (the positive root of the quadratic)."""
    a, b = 2 * n_layer * hidden, 2 * n_params
    return int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a))


def max_params() -> int:
    return int(float(os.environ.get("POSVIZ_MAX_PARAMS") or DEFAULT_MAX_PARAMS))


def max_work_bytes() -> int:
    return int(float(os.environ.get("POSVIZ_MAX_WORK_BYTES") or DEFAULT_MAX_WORK_BYTES))


def deployer_models() -> list[str]:
    """$POSVIZ_MODELS: the published models (hub ids or folders) a deployer lists in the model picker."""
    return [ref.strip() for ref in os.environ.get("POSVIZ_MODELS", "").split(",") if ref.strip()]


def any_model_allowed() -> bool:
    """$POSVIZ_ALLOW_ANY_MODEL=1: a visitor may type a hub id the deployer did not list."""
    return os.environ.get("POSVIZ_ALLOW_ANY_MODEL", "") in ("1", "true", "yes")
