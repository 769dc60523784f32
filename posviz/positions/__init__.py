"""Registry of position methods, chosen by name.

Each method is one module in this package that defines a ``PositionMethod`` subclass with a
``name``; importing the package imports every module, so a new file is registered on its own and
shows up in the app and in the contract tests without touching any list.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Mapping

from posviz.errors import ConfigError
from posviz.positions.base import ModelShape, PositionMethod, relative_distance

POSITION_METHODS: dict[str, type[PositionMethod]] = {}
# A visitor's methods (the Workshop's formula): built by name like the others, but on no page, in no table of the
# literature and with no shipped checkpoint; a class says so with ``visitor = True``.
VISITOR_METHODS: dict[str, type[PositionMethod]] = {}

_SKIP = {"base", "rope_scaling"}


def _discover() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in _SKIP or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, PositionMethod) and obj is not PositionMethod and obj.name:
                (VISITOR_METHODS if getattr(obj, "visitor", False) else POSITION_METHODS)[obj.name] = obj


def build_position_method(name: str, shape: ModelShape, options: Mapping[str, Any] | None = None) -> PositionMethod:
    try:
        cls = POSITION_METHODS[name] if name in POSITION_METHODS else VISITOR_METHODS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"Unknown position method {name!r}. Known methods: {', '.join(sorted({**POSITION_METHODS, **VISITOR_METHODS}))}."
        ) from None
    return cls(shape, options)


# The order the app lists methods in: no position (NoPE, and NoPE with Canon layers' local mixing), absolute, relative
# keys, logit biases, rotary (and its 2025 variants), per-layer layouts of rotary layers, from content.
DISPLAY_ORDER = ["nope", "canon", "nope_temperature", "sinusoidal", "learned", "shaw", "nezha", "transformer_xl", "t5",
                 "alibi", "kerple", "fire", "rope", "p_rope", "fope", "pope", "irope", "local_global", "rope_sinks",
                 "gated_attention", "fox", "cope", "stick_breaking", "path"]


# What a chart of every checkpoint opens with: one of each family (none, absolute, learned table, bucketed bias,
# linear bias, learned bias function, rotary, from content). Eight lines a room can tell apart; the rest one click away.
OPENING_SET = ("nope", "sinusoidal", "learned", "t5", "alibi", "fire", "rope", "fox")


def opening_set(names) -> list[str]:
    """``names`` (in their order) that belong to ``OPENING_SET``; all of them when none does."""
    picked = [n for n in names if n in OPENING_SET]
    return picked or list(names)
def method_display_name(name: str) -> str | None:
    """What the pages call method ``name`` (its class's ``display_name``, else its id); None for no method.
    ``posviz.display.display_name`` covers every other id too (checkpoints, scalings, remaps, strategies)."""
    cls = POSITION_METHODS.get(name) or VISITOR_METHODS.get(name)
    return (cls.display_name or cls.name) if cls is not None else None


def method_names() -> list[str]:
    known = [n for n in DISPLAY_ORDER if n in POSITION_METHODS]
    return known + sorted(set(POSITION_METHODS) - set(known))


_discover()

__all__ = [
    "OPENING_SET",
    "POSITION_METHODS",
    "VISITOR_METHODS",
    "ModelShape",
    "PositionMethod",
    "build_position_method",
    "method_display_name",
    "method_names",
    "opening_set",
    "relative_distance",
]
