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


def flop_budget(device_type: str) -> float:
    """Work one forward pass of a published model may take on this device: ``$POSVIZ_CPU_FLOP_BUDGET`` (or
    ``$POSVIZ_GPU_FLOP_BUDGET``) where the deployer sets it, else the defaults above. It sets the longest
    length a published model runs at, and so what every lab asks of it."""
    name, default = ("GPU", GPU_FLOP_BUDGET) if device_type == "cuda" else ("CPU", CPU_FLOP_BUDGET)
    return float(os.environ.get(f"POSVIZ_{name}_FLOP_BUDGET") or default)


def parameters_in_words(n: int) -> str:
    """1.31 B, 135 M, 100,000: a parameter count as a person reads it."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M" if n >= 1e7 else f"{n:,}"


def max_params() -> int:
    return int(float(os.environ.get("POSVIZ_MAX_PARAMS") or DEFAULT_MAX_PARAMS))


def max_work_bytes() -> int:
    return int(float(os.environ.get("POSVIZ_MAX_WORK_BYTES") or DEFAULT_MAX_WORK_BYTES))


# The published models we propose for a hosted demo (the README's table), with the size of what picking one
# downloads (its safetensors in the dtype the hub stores, and its small files; rounded): the picker shows it.
PROPOSED_MODELS = {
    "openai-community/gpt2": "0.55 GB",
    "facebook/opt-125m": "0.25 GB",
    "EleutherAI/pythia-160m": "0.33 GB",
    "HuggingFaceTB/SmolLM2-135M": "0.27 GB",
    "Qwen/Qwen2.5-0.5B": "0.99 GB",
    "bigscience/bloom-560m": "1.1 GB",
    "tiiuae/falcon-rw-1b": "2.6 GB",
}
PROPOSED = "proposed"  # in $POSVIZ_MODELS: stands for PROPOSED_MODELS (the Docker image's default)


def deployer_models() -> list[str]:
    """$POSVIZ_MODELS: the published models (hub ids, folders, GGUF files) a deployer lists in the model picker;
    the word ``proposed`` in it stands for ``PROPOSED_MODELS``."""
    refs: list[str] = []
    for ref in (r.strip() for r in os.environ.get("POSVIZ_MODELS", "").split(",")):
        for one in (PROPOSED_MODELS if ref == PROPOSED else [ref] if ref else []):
            if one not in refs:
                refs.append(one)
    return refs


def download_size(ref: str) -> str | None:
    """What picking hub model ``ref`` downloads, where we know it (the proposed models)."""
    return PROPOSED_MODELS.get(ref)


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether huggingface.co answers a TCP connection (``make app`` lists the proposed models only then)."""
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def any_model_allowed() -> bool:
    """$POSVIZ_ALLOW_ANY_MODEL=1: a visitor may type a hub id the deployer did not list."""
    return os.environ.get("POSVIZ_ALLOW_ANY_MODEL", "") in ("1", "true", "yes")


if __name__ == "__main__":  # `make app`: the models to list when the deployer sets none
    print(PROPOSED if hub_reachable() else "")
