"""The numbers behind the About page: how the shipped checkpoints were trained.

Per-checkpoint facts (from config.json and metrics.json dicts), the one training recipe every
checkpoint shares (``train.TrainConfig``'s defaults) and the training curves. Pure functions, no
plotting, no Streamlit; rows and "column -> array" dicts go straight into ``pandas.DataFrame``. The
method labels the page shares with the Home page's table (``ACTS_ON_LABEL``) are in ``posviz.explore.home``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from posviz.display import display_name

# metrics.json's val_bpb_at_train_length: the training run's score on the validation split, not the evaluation's
# "bits/byte @ 1×" on the long held-out documents that Home and the Scoreboard show (views/_checkpoints.py says more).
VAL_BPB = "final bits/byte (first 64 KiB held out)"  # metrics.json's val_bpb_at_train_length
Columns = dict[str, np.ndarray]
NOT_SET = "not set"  # a recipe setting left at None (no fine-tuning source, no fixed first byte): words, not "None"
MISSING = "—"  # a fact a checkpoint's files do not hold (an older run's time or device), explained under the table


def checkpoint_rows(configs: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, Mapping[str, Any]]) -> list[dict]:
    """Per-checkpoint facts for the About page from config.json and metrics.json dicts."""
    rows = []
    for name, config in configs.items():
        m = metrics.get(name) or {}
        trained = config.get("trained_on") or {}
        model = config.get("model") or {}
        rows.append({
            "checkpoint": display_name(name),
            "parameters": m.get("parameters"),
            "training tokens (bytes)": m.get("tokens"),
            "steps": m.get("steps"),
            "train length": model.get("train_length"),
            "training time (min)": None if trained.get("seconds") is None else round(trained["seconds"] / 60, 1),
            "device": " · ".join(str(x) for x in (trained.get("device"), trained.get("processor")) if x),
            VAL_BPB: m.get("val_bpb_at_train_length"),
        })
    return rows


# How the About page's checkpoint table writes each number; every cell is text, so a missing fact reads MISSING
# (a grid draws None and nan as they are)
FORMATS = {"parameters": "{:,}", "training tokens (bytes)": "{:,}", "steps": "{:,}", "train length": "{:,}",
           "training time (min)": "{:g}", VAL_BPB: "{:.3f}"}


def shown_checkpoint_rows(rows: list[dict]) -> list[dict]:
    """``checkpoint_rows`` as the page shows them: numbers written out, ``MISSING`` for a fact not recorded."""
    def cell(column: str, value) -> str:
        if value is None or value == "" or (isinstance(value, float) and np.isnan(value)):
            return MISSING
        return FORMATS.get(column, "{}").format(value)

    return [{k: cell(k, v) for k, v in row.items()} for row in rows]


def recipe_rows() -> list[dict]:
    """The shared training recipe: every TrainConfig field with its default (the shipped set's value)."""
    from posviz.training.train import TrainConfig

    recipe = TrainConfig()
    rows = []
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("method", "position_options"):
            continue  # the one thing that differs between checkpoints
        value = getattr(recipe, f.name)
        rows.append({"setting": f.name, "value": "(standard library of this Python)" if value is None and f.name == "corpus"
                     else NOT_SET if value is None else str(value)})
    rows.insert(0, {"setting": "steps", "value": str(recipe.steps)})
    return rows


def train_curve_rows(metrics_by_name: Mapping[str, Mapping[str, Any]]) -> Columns:
    """Long-format training curves: checkpoint (its display name), tokens, train_bpb (from each metrics.json's train_curve)."""
    out: dict[str, list] = {"checkpoint": [], "tokens": [], "train_bpb": []}
    for name, metrics in metrics_by_name.items():
        for point in metrics.get("train_curve") or []:
            out["checkpoint"].append(display_name(name))
            out["tokens"].append(point.get("tokens"))
            out["train_bpb"].append(point.get("train_bpb"))
    return {k: np.asarray(v) for k, v in out.items()}
