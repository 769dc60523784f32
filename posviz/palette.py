"""One colour per position method, and a dash pattern per RoPE variant, for every chart of the app.

Defined once so that a method reads the same on every page (a talk's screenshots from two pages
must agree). The hues are Okabe & Ito's colour-blind-safe set, extended with Paul Tol's "muted"
scheme for the methods beyond eight. RoPE's scalings and fine-tuned variants are dashed (plain RoPE
is solid), each with its own hue and its own dash pattern, so which one reads from either.
No Streamlit or Altair here: pages turn these into scales (``views._charts.method_scales``).
"""
from __future__ import annotations

from typing import Iterable

from posviz.positions import method_names

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
    # the methods that took the spare hues in turn, pinned to them so that a method added later moves none of them
    "p_rope": "#CC6677", "irope": "#88CCEE", "rope_sinks": "#AAAA00", "fox": "#FFAABB", "stick_breaking": "#BBBBBB",
    # moved (issue #72) where two methods drawn together could not be told apart (CIE76 ΔE under 12: ALiBi's
    # vermillion and an orange, Transformer-XL's sand and a sand, a sky blue and a cyan): see MIN_DELTA_E
    "local_global": "#276419",  # dark green
    "cope": "#A50026",  # dark red
    # the methods of 2025 (Tol's high- and medium-contrast hues used nowhere else here)
    "canon": "#555555",  # dark grey: NoPE's family (no position in attention)
    "fope": "#004488",  # dark blue: RoPE's family, darker than RoPE
    "pope": "#997700",  # dark yellow
    "path": "#E7298A",  # magenta (was a cyan: RoPE, FoPE and PaTH read as three blues)
    # the methods of 2026's open models (ColorBrewer's BrBG ends, ΔE at least 27 from every hue above)
    "nope_temperature": "#7F3B08",  # dark brown: NoPE with a temperature
    "gated_attention": "#01665E",  # dark teal: RoPE's blue turned green by its gate
    "hybrid_deltanet": "#7FBC41",  # leaf green (PiYG): the recurrent hybrid, apart from every hue above
    "mla_rope": "#8073AC",  # lavender (PuOr): RoPE's family, its rotated part shared
}
# The least CIE76 colour difference between any two methods' colours (what tests/test_display_names holds them to):
# 14 keeps every pair apart at a glance on a projector (2.3 is "just noticeable").
MIN_DELTA_E = 14.0


def delta_e(a: str, b: str) -> float:
    """CIE76 ΔE between two "#rrggbb" colours (sRGB, D65), the distance in CIELAB."""
    def lab(colour: str) -> tuple[float, float, float]:
        def linear(c: float) -> float:
            return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

        r, g, b = (linear(int(colour[i:i + 2], 16) / 255) for i in (1, 3, 5))
        x, y, z = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b, \
            (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

        def f(t: float) -> float:
            return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

        return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))

    return sum((p - q) ** 2 for p, q in zip(lab(a), lab(b))) ** 0.5


# For a method registered later that has no colour above: Tol hues used nowhere else here, in order.
SPARE_COLOURS = ["#CC6677", "#88CCEE", "#EE7733", "#AAAA00", "#FFAABB", "#EEDD88", "#BBBBBB"]

# RoPE variants: each its own hue (six near-identical blues could not be told apart, least of all in
# greyscale) AND its own dash (Vega-Lite strokeDash: on, off, ...), so a variant reads by either.
# Tol's "vibrant", "muted" and "light" hues not taken by a method above, at least 10 degrees of hue
# from each other and from RoPE's blue.
ROPE_VARIANTS: dict[str, tuple[str, list[int]]] = {
    "rope+linear": ("#AA4499", [6, 3]),  # purple
    "rope+ntk": ("#009988", [2, 2]),  # teal
    "rope+dynamic": ("#EE3377", [8, 3, 2, 3]),  # magenta
    "rope+yarn": ("#117733", [4, 4]),  # green
    "rope+llama3": ("#6F4E37", [1, 3]),  # brown
    "rope+longrope": ("#CC3311", [2, 4, 6, 4]),  # Tol vibrant red
    "rope-ft4x": ("#DDAA33", [10, 4]),  # yellow
    "rope-linear-ft4x": ("#BBCC33", [10, 4, 2, 4]),  # pear
    "rope-yarn-ft4x": ("#44BB99", [12, 3, 3, 3, 3, 3]),  # mint
    # the training-free remaps (positions.rope_remaps), in the hues left between the ones above
    "rope+self_extend": ("#7733EE", [5, 2]),  # violet
    "rope+rerope": ("#3355DD", [3, 3, 1, 3]),  # ultramarine
    "rope+leaky_rerope": ("#BB44DD", [7, 2, 1, 2]),  # orchid
    "rope+dca": ("#77AA11", [1, 1]),  # lime
    "rope+string": ("#229911", [9, 2]),  # leaf
}
# NoPE's inference-time switch (the shipped nope checkpoint run with nope_temperature's query temperature): the
# trained method's hue, dashed, so the switch and the model trained with it read as one family.
INFERENCE_VARIANTS: dict[str, tuple[str, list[int]]] = {
    "nope+temperature": (METHOD_COLOURS["nope_temperature"], [4, 4]),
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
    if name in INFERENCE_VARIANTS:
        return INFERENCE_VARIANTS[name][0]
    if name.startswith(("rope+", "rope-")):
        return METHOD_COLOURS["rope"]
    return _spare(name)


def dash(name: str) -> list[int]:
    """Solid for a method, a dash pattern for a RoPE variant."""
    if name in ROPE_VARIANTS:
        return list(ROPE_VARIANTS[name][1])
    if name in INFERENCE_VARIANTS:
        return list(INFERENCE_VARIANTS[name][1])
    if name.startswith(("rope+", "rope-")):
        return list(UNKNOWN_VARIANT_DASH)
    return list(SOLID)


def ordered(names: Iterable[str]) -> list[str]:
    """``names`` in the app's order: methods first (as ``method_names``), then variants, then the rest."""
    names = list(dict.fromkeys(names))
    methods = [n for n in method_names() if n in names]
    variants = [n for n in [*ROPE_VARIANTS, *INFERENCE_VARIANTS] if n in names and n not in methods]
    return methods + variants + [n for n in names if n not in methods and n not in variants]


def styles(names: Iterable[str]) -> tuple[list[str], list[str], list[list[int]]]:
    """(domain, colours, dashes) for a chart whose series are ``names``, in the app's order."""
    domain = ordered(names)
    return domain, [colour(n) for n in domain], [dash(n) for n in domain]
