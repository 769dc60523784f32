"""One colour per position method, and a dash pattern per RoPE variant, for every chart of the app.

Defined once so that a method reads the same on every page (a talk's screenshots from two pages
must agree). The hues are Okabe & Ito's colour-blind-safe set, extended with Paul Tol's "muted"
scheme for the methods beyond eight. RoPE's scalings and fine-tuned variants share RoPE's blue
family and differ by dash pattern, so "a RoPE" reads at a glance and which one from the line style.
No Streamlit or Altair here: pages turn these into scales (``pages._shared.method_scale``).
"""
from __future__ import annotations

from typing import Iterable

from .positions import method_names

METHOD_COLOURS: dict[str, str] = {
    "nope": "#000000",  # Okabe-Ito black: no position at all
    "sinusoidal": "#E69F00",  # orange
    "learned": "#56B4E9",  # sky blue
    "shaw": "#009E73",  # bluish green
    "t5": "#CC79A7",  # reddish purple
    "alibi": "#D55E00",  # vermillion
    "rope": "#0072B2",  # blue
    "nezha": "#882255",  # Tol wine
    "kerple": "#999933",  # Tol olive
    "fire": "#332288",  # Tol indigo
    "transformer_xl": "#DDCC77",  # Tol sand
}
# For a method registered later that has no colour above: Tol muted hues not used above, in order.
SPARE_COLOURS = ["#44AA99", "#AA4499", "#CC6677", "#117733", "#88CCEE", "#6F4E37", "#BBBBBB"]

# RoPE variants: the rotary blue family, told apart by dash (Vega-Lite strokeDash: on, off, ...).
ROPE_VARIANTS: dict[str, tuple[str, list[int]]] = {
    "rope+linear": ("#3D8FC7", [6, 3]),
    "rope+ntk": ("#0A4F7A", [2, 2]),
    "rope+dynamic": ("#6BAED6", [8, 3, 2, 3]),
    "rope+yarn": ("#08306B", [4, 4]),
    "rope+llama3": ("#2171B5", [1, 3]),
    "rope-ft4x": ("#005A8C", [10, 4]),
    "rope-linear-ft4x": ("#4A98CF", [10, 4, 2, 4]),
    "rope-yarn-ft4x": ("#1B3F73", [12, 3, 3, 3, 3, 3]),
}
SOLID: list[int] = []
UNKNOWN_VARIANT_DASH = [3, 6]


def rope_series(scaling: str) -> str:
    """The series name of the rope checkpoint with an inference-time scaling ("none" is plain rope)."""
    return "rope" if scaling in ("none", "", None) else f"rope+{scaling}"


def _spare(name: str) -> str:
    unknown = [n for n in method_names() if n not in METHOD_COLOURS]
    if name in unknown:
        return SPARE_COLOURS[unknown.index(name) % len(SPARE_COLOURS)]
    # a checkpoint folder with a name of its own: a stable pick, so it is the same on every page
    return SPARE_COLOURS[sum(name.encode()) % len(SPARE_COLOURS)]


def colour(name: str) -> str:
    """The colour of a method, a RoPE variant ("rope+yarn", "rope-ft4x") or a checkpoint named after one."""
    if name in METHOD_COLOURS:
        return METHOD_COLOURS[name]
    if name in ROPE_VARIANTS:
        return ROPE_VARIANTS[name][0]
    if name.startswith(("rope+", "rope-")):
        return METHOD_COLOURS["rope"]
    return _spare(name)


def dash(name: str) -> list[int]:
    """Solid for a method, a dash pattern for a RoPE variant."""
    if name in ROPE_VARIANTS:
        return list(ROPE_VARIANTS[name][1])
    if name.startswith(("rope+", "rope-")):
        return list(UNKNOWN_VARIANT_DASH)
    return list(SOLID)


def ordered(names: Iterable[str]) -> list[str]:
    """``names`` in the app's order: methods first (as ``method_names``), then variants, then the rest."""
    names = list(dict.fromkeys(names))
    methods = [n for n in method_names() if n in names]
    variants = [n for n in ROPE_VARIANTS if n in names and n not in methods]
    return methods + variants + [n for n in names if n not in methods and n not in variants]


def styles(names: Iterable[str]) -> tuple[list[str], list[str], list[list[int]]]:
    """(domain, colours, dashes) for a chart whose series are ``names``, in the app's order."""
    domain = ordered(names)
    return domain, [colour(n) for n in domain], [dash(n) for n in domain]
