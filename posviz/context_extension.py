"""The numbers behind the Context extension lab's fine-tuning section (the inference-time scalings
are in ``posviz.labs``): each fine-tuned RoPE checkpoint next to the same scaling without fine-tuning.

A fine-tuned checkpoint's metrics.json holds its bits per byte by length and, under
``before_finetuning``, the base checkpoint's at the same lengths with the same position options, so
"before" and "after" differ only by the fine-tuning. Its config.json says from what and with how many bytes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from .checkpoint import read_config, read_metrics
from .errors import PosvizError
from .palette import rope_series


def finetuned_checkpoints(folders: Mapping[str, Path]) -> dict[str, dict]:
    """{name: config.json} of the checkpoints that were fine-tuned from another (``finetuned_from``)."""
    out = {}
    for name, folder in folders.items():
        try:
            config = read_config(folder)
        except PosvizError:
            continue
        if config.get("finetuned_from"):
            out[name] = config
    return out


def before_label(config: Mapping) -> str:
    """The curve name of the same scaling without fine-tuning: "rope", "rope+linear", "rope+yarn"."""
    return rope_series(config["model"].get("position_options", {}).get("scaling", "none"))


def finetuning_rows(folders: Mapping[str, Path]) -> list[dict]:
    """Rows {curve, length, bpb, stage, of} for every fine-tuned checkpoint: "after" (its own curve) and
    "before" (the base checkpoint with the same options). ``of`` names the fine-tuned checkpoint."""
    rows = []
    for name, config in finetuned_checkpoints(folders).items():
        try:
            block = read_metrics(folders[name]).get("eval", {})
        except PosvizError:
            continue
        for stage, table, curve in (("after fine-tuning", block.get("nonoverlapping_bpb", {}), name),
                                    ("before fine-tuning", block.get("before_finetuning", {}).get("nonoverlapping_bpb", {}),
                                     before_label(config))):
            for length, bpb in table.items():
                if bpb is not None:
                    rows.append({"curve": curve, "length": int(length), "bpb": float(bpb), "stage": stage, "of": name})
    return rows


def finetuning_curves(folders: Mapping[str, Path]) -> list[dict]:
    """Rows {checkpoint, tokens, train_bpb} of each fine-tuning run's training loss at the new length:
    how fast each scaling adapts (a scaling that starts closer to the old model needs fewer bytes)."""
    rows = []
    for name in finetuned_checkpoints(folders):
        try:
            curve = read_metrics(folders[name]).get("train_curve", [])
        except PosvizError:
            continue
        rows += [{"checkpoint": name, "tokens": int(r["tokens"]), "train_bpb": float(r["train_bpb"])} for r in curve]
    return rows


def finetuning_facts(folders: Mapping[str, Path]) -> list[dict]:
    """One row per fine-tuned checkpoint: base, scaling, factor, length and byte budget."""
    rows = []
    for name, config in finetuned_checkpoints(folders).items():
        f = config["finetuned_from"]
        opts = f.get("position_options", {})
        rows.append({"checkpoint": name, "from": Path(f["checkpoint"]).name, "scaling": opts.get("scaling", "none"),
                     "factor": opts.get("factor", 1.0), "length (bytes)": f["train_length"], "bytes": f["tokens"]})
    return rows
