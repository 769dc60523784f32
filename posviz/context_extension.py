"""The numbers behind the Context extension lab: the RoPE checkpoint past its training length, scaled
at inference time and fine-tuned.

No plotting and no Streamlit here.

* Inference-time scalings (the end of this module): the rope checkpoint under every registered RoPE
  scaling (``positions.rope_scaling``) at a factor, live on a text (``rope_scaling_curves``) or as its
  metrics.json stored them (``shipped_scaling_curves``), and the wavelength each scaling gives every
  rotary pair (``rope_wavelengths``).
* Fine-tuning: each fine-tuned RoPE checkpoint next to the same scaling without fine-tuning. A
  fine-tuned checkpoint's metrics.json holds its bits per byte by length and, under
  ``before_finetuning``, the base checkpoint's at the same lengths with the same position options, so
  "before" and "after" differ only by the fine-tuning. Its config.json says from what and with how many bytes.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

from .checkpoint import read_config, read_metrics
from .errors import PosvizError
from .extrapolation import score_at_length
from .lab_inputs import Progress, _no_progress, get_model
from .palette import rope_series
from .positions import ModelShape, build_position_method
from .positions.rope_scaling import ROPE_SCALINGS


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


# -- inference-time RoPE scalings (no fine-tuning) ----------------------------------------------------
def scaling_overrides(scaling: str, factor: float) -> dict:
    """Position overrides that apply ``scaling`` at ``factor`` to the rope checkpoint."""
    if scaling not in ROPE_SCALINGS:
        raise PosvizError(f"Unknown RoPE scaling {scaling!r}. Known scalings: {', '.join(ROPE_SCALINGS)}.")
    if scaling == "none":
        return {}
    return {"scaling": scaling, "factor": float(factor)}


def extension_lengths(train_length: int, cap: int, n_bytes: int) -> list[int]:
    """train_length x 1, 2, 4, ... up to the device cap and the text."""
    out, n = [], train_length
    while n <= min(cap, n_bytes):
        out.append(n)
        n *= 2
    return out


def rope_scaling_curves(folder: str | Path, factor: float, ids, lengths: Sequence[int],
                        scalings: Sequence[str] | None = None, progress: Progress = _no_progress) -> list[dict]:
    """Rows {scaling, factor, length, bpb} for the rope checkpoint under each scaling at ``factor``."""
    scalings = list(ROPE_SCALINGS) if scalings is None else list(scalings)
    rows, total, done = [], len(scalings) * len(lengths), 0
    for scaling in scalings:
        model = get_model(folder, scaling_overrides(scaling, factor) or None)
        for n in lengths:
            score = score_at_length(model, ids, n)
            rows.append({"scaling": scaling, "factor": 1.0 if scaling == "none" else float(factor), "length": n,
                         "bpb": score.bpb})
            done += 1
            progress(done / total)
    return rows


def shipped_scaling_curves(folder: str | Path) -> list[dict]:
    """Rows {scaling, length, bpb, factor} from the rope checkpoint's metrics.json (static scalings
    were stored at factor = length / train_length, dynamic at 2)."""
    try:
        ev = read_metrics(folder).get("eval", {})
    except PosvizError:
        return []
    rows = [{"scaling": "none", "length": int(n), "bpb": v, "factor": 1.0}
            for n, v in ev.get("nonoverlapping_bpb", {}).items() if v is not None]
    for scaling, block in ev.get("rope_scalings", {}).items():
        factors = block.get("factor", {})
        for n, v in block.get("nonoverlapping_bpb", {}).items():
            if v is not None:
                rows.append({"scaling": scaling, "length": int(n), "bpb": float(v), "factor": factors.get(n)})
    return sorted(rows, key=lambda r: (r["scaling"], r["length"]))


def rope_wavelengths(folder: str | Path, factor: float, seq_len: int | None = None,
                     scalings: Sequence[str] | None = None) -> list[dict]:
    """Rows {scaling, pair, wavelength (positions per full turn = 2 pi / theta_i), attention_factor}.

    Built from the checkpoint's config through ``Rotary.frequencies``: no weights needed.
    ``seq_len`` matters only for dynamic NTK (defaults to factor x train_length).
    """
    model_cfg = read_config(folder)["model"]
    n_embd, n_head = model_cfg["n_embd"], model_cfg["n_head"]
    shape = ModelShape(model_cfg["n_layer"], n_head, n_embd // n_head, n_embd, model_cfg["train_length"])
    seq_len = seq_len or int(factor * shape.train_length)
    rows = []
    for scaling in (list(ROPE_SCALINGS) if scalings is None else scalings):
        options = {**model_cfg.get("position_options", {}), "scaling": scaling,
                   "factor": 1.0 if scaling == "none" else float(factor)}
        rotary = build_position_method("rope", shape, options)
        inv_freq, attention = rotary.frequencies(seq_len)
        for i, theta in enumerate(inv_freq.tolist()):
            rows.append({"scaling": scaling, "pair": i, "wavelength": 2 * math.pi / theta,
                         "attention_factor": float(attention)})
    return rows
