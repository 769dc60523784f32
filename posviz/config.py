"""Strict dataclass configs: unknown keys are an error, not silently ignored.

A typo such as ``max_distnace`` would otherwise train a different model than the one you asked for,
and nobody would notice until the numbers looked odd.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

from posviz.errors import ConfigError

T = TypeVar("T")


def strict_from_dict(cls: type[T], values: Mapping[str, Any] | None, what: str | None = None) -> T:
    """Build dataclass ``cls`` from ``values``, rejecting keys it does not declare."""
    values = dict(values or {})
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        label = what or cls.__name__
        raise ConfigError(
            f"{label}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed keys are {', '.join(sorted(fields)) or '(none)'}."
        )
    try:
        return cls(**values)
    except TypeError as exc:  # wrong types surface from __post_init__ checks or the constructor
        raise ConfigError(f"{what or cls.__name__}: {exc}") from exc


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclasses.dataclass
class ModelConfig:
    """Shape of the byte-level GPT-2-style decoder. Identical for every position method."""

    vocab_size: int = 256  # bytes: no tokenizer, so every method sees exactly the same symbols
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    train_length: int = 256  # context length seen in training; absolute methods are sized by it
    dropout: float = 0.0  # tiny models on a few million bytes underfit; dropout only slows them
    position: str = "nope"  # name in posviz.positions.POSITION_METHODS
    position_options: dict = dataclasses.field(default_factory=dict)  # that method's own options

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "train_length"):
            value = getattr(self, name)
            require(isinstance(value, int) and value > 0, f"ModelConfig.{name} must be a positive integer, got {value!r}.")
        require(self.n_embd % self.n_head == 0, f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}).")
        require(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout!r}.")
        require(isinstance(self.position_options, dict), "position_options must be a mapping.")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
        return strict_from_dict(cls, values, "model config")
