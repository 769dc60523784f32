"""What the Workshop page draws and reads, without Streamlit: the starting examples, the parameters a visitor types,
and a formula's bias per head against distance and as a matrix, at the shipped shape.

The method drawn is the very ``FormulaBias`` a run would train (``posviz.positions.formula``), built with the
parameters' initial values (a range is drawn with seed 0, as noted on the page).
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
import torch

from posviz.errors import ConfigError
from posviz.positions import ModelShape, build_position_method
from posviz.workshop.formula import FormulaError, parse_formula


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

_RANGE = re.compile(r"^\s*(-?[\d.eE+-]+)\s*(?::|\.\.)\s*(-?[\d.eE+-]+)\s*$")


def parse_init(text: str, name: str):
    """A parameter's initial value as typed: a number ("1.5") or a uniform range ("0:2")."""
    text = (text or "").strip()
    match = _RANGE.match(text)
    try:
        return [float(match.group(1)), float(match.group(2))] if match else float(text)
    except ValueError:
        raise ConfigError(f"parameter {name}: write its initial value as a number (1.5) or a range (0:2), "
                          f"not {text[:40]!r}") from None


def parse_floor(text: str, name: str):
    text = (text or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"parameter {name}: its floor is a number (0.01) or empty, not {text[:40]!r}") from None


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


def describe_error(exc: Exception) -> str:
    return str(exc) if isinstance(exc, (FormulaError, ConfigError)) else f"{type(exc).__name__}: {exc}"


def label_for(formula: str, taken: set[str], example: str | None = None) -> str:
    """A short name for a run, unique in the session: the example's name, else the formula's start."""
    base = example or (formula if len(formula) <= 24 else formula[:23] + "…")
    label, k = base, 2
    while label in taken:
        label, k = f"{base} ({k})", k + 1
    return label
