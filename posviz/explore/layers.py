"""The numbers behind the Layers section of the RoPE page: which layers of a model rotate, with which θ, through
which window, with sink logits, for checkpoints and published models alike (``LabModel.layer_layout``), and
the sink logits a checkpoint learned. No Streamlit here.
"""
from __future__ import annotations

import math

from posviz.models.interface import LabModel
from posviz.display import display_name


def _short(x: float) -> str:
    """10000 -> "10k", 1000000 -> "1M", 150000 -> "150k"."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if x >= size:
            value = x / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{x:g}"


def layout_rows(models: dict[str, LabModel]) -> list[dict]:
    """One row per (model, layer): the layout's facts and a label for its cell ("θ 10k · W 64 · sinks")."""
    rows = []
    for name, model in models.items():
        for r in model.layer_layout():
            parts = [display_name(r["position"])]  # the cell says the method's name, as every page does
            if r["base"] is not None:
                parts.append(f"θ {_short(r['base'])}")
            if r["rotary share"] and r["rotary share"] < 1:
                parts.append(f"{r['rotary share']:.0%} turns")
            parts.append(f"chunks of {r['chunk']}" if r.get("chunk") else "full" if r["window"] is None else f"W {r['window']}")
            if r["sinks"]:
                parts.append("sinks")
            rows.append({"model": name, **r, "window": r["window"] if r["window"] is not None else math.nan,
                         "label": " · ".join(parts)})
    return rows


def sink_logit_rows(name: str, model: LabModel) -> list[dict]:
    """{model, layer, head, sink logit, share at even scores} for every layer whose method learned sink logits;
    ``share at even scores``: the weight the sink takes from a row of 64 keys that all score 0 (e^s / (64 + e^s))."""
    at_layer = getattr(model.position, "at_layer", None)  # a published model's weights hold its own (not read here)
    rows = []
    for layer in range(model.n_layer if at_layer else 0):
        sinks = at_layer(layer).sink_logits
        if sinks is None:
            continue
        for head, s in enumerate(sinks.detach().float().cpu().tolist()):
            rows.append({"model": name, "layer": layer, "head": head, "sink logit": s,
                         "share at even scores": math.exp(s) / (64 + math.exp(s))})
    return rows
