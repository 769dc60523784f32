"""What the Workshop page draws and reads, without Streamlit: the starting examples, the parameters a visitor types,
and a formula's bias per head against distance and as a matrix, at the shipped shape.

The method drawn is the very ``FormulaBias`` a run would train (``posviz.positions.formula``), built with the
parameters' initial values (a range is drawn with seed 0, as noted on the page).
"""
from __future__ import annotations

import ast
import dataclasses

import numpy as np
import pandas as pd
import torch

from posviz.errors import ConfigError
from posviz.positions import ModelShape, build_position_method
from posviz.positions.formula_language import parse_formula


@dataclasses.dataclass(frozen=True)
class Example:
    formula: str
    parameters: dict  # name -> {"init": ..., "floor": ...}
    why: str


EXAMPLES = {
    "ALiBi": Example("-(2**(-8*(h+1)/H))*d", {}, "ALiBi's fixed slopes, 2^(-8(h+1)/H) per head: a linear penalty."),
    "KERPLE-log": Example("-a[layer, h] * log(1 + b[layer, h] * d)",
                          {"a": {"init": [0.0, 2.0], "floor": 0.01}, "b": {"init": [0.0, 1.0], "floor": 0.01}},
                          "KERPLE's logarithmic kernel, learned per layer and head, drawn as its authors' code draws it."),
    "Gaussian window": Example("-(d / w[h])**2 / 2", {"w": {"init": [16.0, 128.0], "floor": 1.0}},
                               "A learned width per head: keys further than a few widths back all but vanish."),
    "Hard cut at 64": Example("where(d < 64, 0, -inf)", {},
                              "Every key within 64 positions counts equally and none further back does: a sliding window."),
    "T5-like log buckets": Example(
        "-s[h] * min(where(d < 8, d, 8 + floor(8 * log(max(d, 8) / 8) / log(16))), 15)", {"s": {"init": [0.0, 0.5]}},
        "T5's buckets: exact up to 8, then logarithmic up to 128, one bucket beyond; a learned strength per head "
        "(T5 learns a value per bucket, which this language cannot write)."),
    "None (NoPE)": Example("0", {}, "No bias at all: positions only through the causal mask."),
}

MAX_VALUE_CHARACTERS = 40  # an initial value or a floor: a number or two, never more than this


def _typed_value(text: str, name: str, what: str, example: str) -> str:
    """``text`` stripped, refused with words past ``MAX_VALUE_CHARACTERS``: nothing longer is ever parsed."""
    text = (text or "").strip()
    if len(text) > MAX_VALUE_CHARACTERS:
        raise ConfigError(f"parameter {name}: its {what} has {len(text):,} characters; at most "
                          f"{MAX_VALUE_CHARACTERS} are allowed ({example}).")
    return text


def parse_init(text: str, name: str):
    """A parameter's initial value as typed: a number ("1.5") or a uniform range ("0:2" or "0..2").

    Split with ``str.partition`` and read with ``float``, both linear in the text: a regular expression for the
    range took seconds to refuse a long run of dots."""
    text = _typed_value(text, name, "initial value", "a number like 1.5 or a range like 0:2")
    low, sep, high = text.partition(":")
    if not sep:
        low, sep, high = text.partition("..")
    try:
        return [float(low), float(high)] if sep else float(text)
    except ValueError:
        raise ConfigError(f"parameter {name}: write its initial value as a number (1.5) or a range (0:2), "
                          f"not {text!r}") from None


def parse_floor(text: str, name: str):
    text = _typed_value(text, name, "floor", "a number like 0.01, or empty")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"parameter {name}: its floor is a number (0.01) or empty, not {text!r}") from None


def spec_text(spec: dict) -> tuple[str, str]:
    """(init, floor) as the page's inputs show them."""
    init = spec.get("init", 1.0)
    shown = f"{init[0]:g}:{init[1]:g}" if isinstance(init, (list, tuple)) else f"{init:g}"
    return shown, "" if spec.get("floor") is None else f"{spec['floor']:g}"


def method_options(formula: str, typed: dict[str, tuple[str, str]]) -> dict:
    """The formula method's options from the page's inputs: {name: (init text, floor text)} per learned parameter."""
    parsed = parse_formula(formula)
    parameters = {}
    for name in sorted(parsed.parameters):
        init, floor = typed.get(name, ("1", ""))
        parameters[name] = {"init": parse_init(init, name), "floor": parse_floor(floor, name)}
    return {"formula": formula, "parameters": parameters}


def drawn_method(options: dict, shape: ModelShape):
    """The method as a run would start: its initial values (a range drawn with seed 0)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build_position_method("formula", shape, options)


def curves(method, layer: int, n_keys: int) -> pd.DataFrame:
    """Long table: the bias of each head for the last query of an ``n_keys`` context, at distances 0..n_keys-1."""
    bias = method.bias_by_distance(layer, n_keys).numpy()  # (H, n)
    rows = []
    for h in range(bias.shape[0]):
        rows.append(pd.DataFrame({"head": f"head {h}", "distance": np.arange(n_keys), "bias": bias[h]}))
    df = pd.concat(rows, ignore_index=True)
    df["bias"] = df["bias"].where(np.isfinite(df["bias"]))  # -inf (a cut key) as a gap in the line
    return df


def heads_alike(curves: pd.DataFrame) -> bool:
    """Whether every head's curve is the same (a formula that does not read h): the chart's lines overlap."""
    table = curves.pivot(index="distance", columns="head", values="bias")
    return bool(table.apply(lambda col: col.equals(table.iloc[:, 0])).all())


def matrix(method, layer: int, head: int, n: int) -> np.ndarray:
    """(n, n) the bias of one head for queries and keys 0..n-1; NaN above the diagonal (masked keys)."""
    with torch.no_grad():
        pos = torch.arange(n)
        bias = method.logit_bias(layer, torch.zeros(1, method.shape.n_head, n, 1), pos, pos)
        method.forget()
    out = bias.expand(1, method.shape.n_head, n, n)[0, head].double().numpy().copy()
    out[np.triu_indices(n, 1)] = np.nan
    out[np.isneginf(out)] = np.nan
    return out


LABEL_CHARACTERS = 24  # a label's length before "…": the labs' pickers and the results table show it whole
LABEL_PUNCTUATION = frozenset(".+-/^·()<>=!;…")  # "…": a truncated label is safe as it is


def safe_label(text: str) -> str:
    """``text`` in the alphabet a run's label may use: letters, digits, single spaces and ``.+-/^·()<>=!;…``.

    A label is a model's name in every lab, and there it goes into a link's comma-separated ``models=`` and into
    Markdown: so no comma (";" instead), no square bracket ("a[layer, h]" is "a(layer; h)"), ``**`` as "^" and
    ``*`` as "·", any run of white space as one space, and every other character (Markdown's other marks among
    them: underscores, backquotes, #, |, ~, backslashes, $) dropped."""
    text = str(text).replace("**", "^").replace("*", "·").replace(",", ";").replace("[", "(").replace("]", ")")
    kept = "".join(c if c.isalnum() or c in LABEL_PUNCTUATION else " " if c.isspace() else "" for c in text)
    return " ".join(kept.split())


def label_for(formula: str, taken: set[str], example: str | None = None) -> str:
    """A short name for a run, unique in the session: the example's name, else the formula's start.

    The formula as its parsed tree writes it back (``ast.unparse``): spacing made regular and any ``# comment``
    gone, so a label can only hold the formula itself, never text a visitor hid after it; then ``safe_label``."""
    text = safe_label(example if example else ast.unparse(parse_formula(formula).tree))
    base = text if len(text) <= LABEL_CHARACTERS else text[:LABEL_CHARACTERS - 1] + "…"
    label, k = base, 2
    while label in taken:
        label, k = f"{base} ({k})", k + 1
    return label


LAB_LINK_MODELS = ("alibi", "rope", "nope")  # beside a run in the Extrapolation lab: the quick baselines' methods


def lab_link_models(label: str) -> str:
    """The ``models=`` of the link that opens a run in the Extrapolation lab: comma-separated, which is why a
    label never holds a comma (``safe_label``)."""
    return ",".join([*LAB_LINK_MODELS, f"yours: {label}"])


def against_seeds(value: float | None, seed_values: list[float | None]) -> str:
    """Where a visitor's bits per byte lies against a baseline's over its training seeds (lower is better): inside
    their range, a difference one training's luck could make, or outside it, by how much past the nearest seed."""
    values = [v for v in seed_values if v is not None]
    if value is None or not values:
        return "—"
    low, high = min(values), max(values)
    if len(values) == 1:
        return f"{value - low:+.3f} (one seed: no range to compare with)"
    if low <= value <= high:
        return f"within the baseline's seed range ({low:.3f}–{high:.3f}, {len(values)} seeds)"
    if value < low:
        return f"outside it: better than all {len(values)} seeds by {low - value:.3f}"
    return f"outside it: worse than all {len(values)} seeds by {value - high:.3f}"


def seed_spread(seed_values: list[float | None]) -> str:
    """A baseline's lowest–highest bits per byte over its training seeds, as the results table shows it."""
    values = [v for v in seed_values if v is not None]
    return "—" if not values else f"{min(values):.3f}–{max(values):.3f} ({len(values)} seed{'s' * (len(values) > 1)})"
