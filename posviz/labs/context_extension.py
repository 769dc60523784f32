"""The numbers behind the Context extension lab: the RoPE checkpoint past its training length, scaled
at inference time and fine-tuned.

No plotting and no Streamlit here.

* Inference-time scalings (the end of this module): the rope checkpoint under every registered RoPE
  scaling (``positions.rope_scaling``) or training-free remap (``positions.rope_remaps``) at a factor, live on a text (``rope_scaling_curves``) or as its
  metrics.json stored them (``shipped_scaling_curves``), and the wavelength each scaling gives every
  rotary pair (``rope_wavelengths``).
* Fine-tuning: each fine-tuned RoPE checkpoint next to the same scaling without fine-tuning. A
  fine-tuned checkpoint's metrics.json holds its bits per byte by length and, under
  ``before_finetuning``, the base checkpoint's at the same lengths with the same position options, so
  "before" and "after" differ only by the fine-tuning. Its config.json says from what and with how many bytes.
* A recalibration without positions (DroPE): RoPE as trained, its weights with the rotation dropped before any
  step, and after recalibration at the training length (``recalibration_rows``).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from posviz.errors import PositionLimitError, PosvizError
from posviz.labs.extrapolation import LengthScore, _length_score, _predicted_bytes, mixed_contexts, score_at_length, windows_for
from posviz.labs.inputs import LN2, Progress, _no_progress
from posviz.positions import method_display_name
from posviz.models.checkpoint_files import extends_context
from posviz.models.interface import LabModel
from posviz.palette import rope_series
from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.positions.rope_scaling import ROPE_SCALINGS


def finetuned_models(models: Mapping[str, LabModel]) -> dict[str, LabModel]:
    """{name: model} of the models fine-tuned from another for context (``extends_context``: not a DroPE
    recalibration, which is a model of the training length)."""
    return {name: model for name, model in models.items() if extends_context(model.finetuned_from())}


def before_label(model: LabModel) -> str:
    """The curve name of the same scaling without fine-tuning: "rope", "rope+linear", "rope+yarn"."""
    return rope_series(model.position_options.get("scaling", "none"))


def finetuning_rows(models: Mapping[str, LabModel]) -> list[dict]:
    """Rows {curve, length, bpb, stage, of} for every fine-tuned checkpoint: "after" (its own curve) and
    "before" (the base checkpoint with the same options). ``of`` names the fine-tuned checkpoint."""
    rows = []
    for name, model in finetuned_models(models).items():
        block = model.stored_metrics().get("eval", {})
        for stage, table, curve in (("after fine-tuning", block.get("nonoverlapping_bpb", {}), name),
                                    ("before fine-tuning", block.get("before_finetuning", {}).get("nonoverlapping_bpb", {}),
                                     before_label(model))):
            for length, bpb in table.items():
                if bpb is not None:
                    rows.append({"curve": curve, "length": int(length), "bpb": float(bpb), "stage": stage, "of": name})
    return rows


def finetuning_curves(models: Mapping[str, LabModel]) -> list[dict]:
    """Rows {checkpoint, tokens, train_bpb} of each fine-tuning run's training loss at the new length:
    how fast each scaling adapts (a scaling that starts closer to the old model needs fewer bytes)."""
    rows = []
    for name, model in finetuned_models(models).items():
        curve = model.stored_metrics().get("train_curve", [])
        rows += [{"checkpoint": name, "tokens": int(r["tokens"]), "train_bpb": float(r["train_bpb"])} for r in curve]
    return rows


def finetuning_facts(models: Mapping[str, LabModel]) -> list[dict]:
    """One row per fine-tuned checkpoint: base, scaling, factor, length and byte budget."""
    rows = []
    for name, model in finetuned_models(models).items():
        f = model.finetuned_from()
        opts = f.get("position_options", {})
        rows.append({"checkpoint": name, "from": Path(f["checkpoint"]).name, "scaling": opts.get("scaling", "none"),
                     "factor": opts.get("factor", 1.0), "length (bytes)": f["train_length"], "bytes": f["tokens"]})
    return rows


# -- a recalibration without positions (DroPE) -------------------------------------------------------
RECALIBRATION_STAGES = ("as trained", "positions dropped, not recalibrated", "recalibrated")


def recalibration_rows(models: Mapping[str, LabModel]) -> list[dict]:
    """Rows {of, stage, length, bpb} for every checkpoint recalibrated without its base's positions (DroPE: its
    config's ``finetuned_from.dropped_positions``), at the lengths its metrics.json stores: its base as trained
    (``before_finetuning``), the base's weights with the positions dropped before any step (``before_recalibration``)
    and after recalibration (its own table). ``of`` names the recalibrated checkpoint."""
    rows = []
    for name, model in models.items():
        tuned = model.finetuned_from() or {}
        if not tuned.get("dropped_positions"):
            continue
        block = model.stored_metrics().get("eval", {})
        tables = (block.get("before_finetuning", {}).get("nonoverlapping_bpb", {}),
                  block.get("before_recalibration", {}).get("nonoverlapping_bpb", {}), block.get("nonoverlapping_bpb", {}))
        for stage, table in zip(RECALIBRATION_STAGES, tables):
            rows += [{"of": name, "stage": stage, "length": int(n), "bpb": float(v)} for n, v in table.items()
                     if v is not None]
    return rows


# -- inference-time RoPE scalings (no fine-tuning) ----------------------------------------------------
def scaling_overrides(scaling: str, factor: float) -> dict:
    """Position overrides that apply ``scaling`` at ``factor`` to the rope checkpoint: a frequency scaling
    (``rope_scaling``) stretched by ``factor``, or a training-free remap (``rope_remaps``) whose defaults cover
    ``factor`` x the training length."""
    if scaling in ROPE_REMAPS:
        return {"remap": scaling, "factor": float(factor)}
    if scaling not in ROPE_SCALINGS:
        raise PosvizError(f"Unknown RoPE scaling {scaling!r}. Known scalings: {', '.join(ROPE_SCALINGS)}; "
                          f"remaps: {', '.join(ROPE_REMAPS)}.")
    if scaling == "none":
        return {}
    return {"scaling": scaling, "factor": float(factor)}


def extensions(model: LabModel) -> list[str]:
    """What the lab can apply to ``model``: every frequency scaling, then the remaps it takes (a checkpoint's RoPE;
    a published model rotates inside transformers' attention, where no remap reaches)."""
    return list(ROPE_SCALINGS) + list(model.remaps)


def remap_settings(model: LabModel, factor: float, names: Sequence[str]) -> list[dict]:
    """Rows {remap, parameters} of the remaps among ``names`` as they run at ``factor``: each one's defaults filled
    in for factor x the training length (``rope_remaps``), what the page states beside the curves."""
    rows = []
    for name in names:
        if name in ROPE_REMAPS:
            opts = ROPE_REMAPS[name].settings(None, model.train_length, round(max(1.0, factor) * model.train_length))
            rows.append({"remap": name, "parameters": ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in opts.items())})
    return rows


def layers_touched(model: LabModel) -> str | None:
    """Which layers a scaling or remap moves, where some layers do not rotate (a hybrid's recurrent layers, NoPE
    layers between rotary ones): one sentence from the model's layer layout; None where every layer rotates."""
    rows = model.layer_layout()
    turning = [r["layer"] for r in rows if r["position"] == "rope"]
    others = [r for r in rows if r["position"] != "rope"]
    if not others or not turning:
        return None
    kinds = ", ".join(dict.fromkeys(method_display_name(r["position"]) or r["position"] for r in others))
    one = len(others) == 1
    return (f"Only its rotary layers move ({len(turning)} of {len(rows)}: {_spans(turning)}); "
            f"{'layer' if one else 'layers'} {_spans([r['layer'] for r in others])} ({kinds}) "
            f"{'keeps what it computes' if one else 'keep what they compute'}.")


def _spans(layers: Sequence[int]) -> str:
    out, start = [], None
    for i, layer in enumerate(layers):
        start = layer if start is None else start
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            out.append(str(start) if start == layer else f"{start}–{layer}")
            start = None
    return ", ".join(out)


def extension_lengths(train_length: int, cap: int, n_bytes: int) -> list[int]:
    """train_length x 1, 2, 4, ... up to the device cap and the text."""
    out, n = [], train_length
    while n <= min(cap, n_bytes):
        out.append(n)
        n *= 2
    return out


def reference_lengths(base: LabModel, lengths: Sequence[int], model: LabModel, n_ids: int) -> list[int]:
    """The lengths a reference model runs at beside ``base`` at ``lengths``: the same ones when the two share
    unit and trained context (or are both byte-level checkpoints); else the same multiples of its own trained context, within its device cap
    and a text of ``n_ids`` of its ids (a byte-level checkpoint next to a published model)."""
    if not mixed_contexts([base, model]):
        return list(lengths)
    out = [round(n / base.train_length * model.train_length) for n in lengths]
    return [n for n in out if 2 <= n <= min(model.length_cap, n_ids - 1)]


def prefixes_hold(model: LabModel, lengths: Sequence[int]) -> bool:
    """Whether the first L positions of a longer window compute what a window of L computes, for every
    L in ``lengths``: true of a causal model whose positions mean the same in every window. Not of a
    RoPE scaling whose frequencies follow the window's length (dynamic NTK); the other methods' biases
    depend on positions and distances only (tests check every registered method)."""
    if model.frequencies(min(lengths)) is None:
        return True
    inv_freq, attention = model.frequencies(min(lengths))
    return all(torch.equal(inv_freq, f) and attention == a for f, a in (model.frequencies(n) for n in lengths))


@torch.inference_mode()
def length_scores(model: LabModel, ids, lengths: Sequence[int], progress: Progress = _no_progress) -> dict[int, LengthScore]:
    """``score_at_length`` at each of ``lengths``, the same windows and numbers, from fewer positions.

    A window of L at byte b is the first L positions of the longer windows that start at b (when
    ``prefixes_hold``), so only the longest window at each start runs: for train_length x 1, 2, ...,
    16 over 4,096 bytes, 12,288 positions instead of 20,480, and the shortest lengths ride free.
    ``seconds`` of a length: the passes whose windows are that long.
    """
    ids = model.ids_on_device(ids)
    lengths = [model.checked(n, ids.numel()) for n in sorted(set(lengths))]  # each once, for every step below
    if not prefixes_hold(model, lengths):
        scores = {}
        for i, n in enumerate(lengths):
            scores[n] = score_at_length(model, ids, n)
            progress((i + 1) / len(lengths))
        return scores
    budget = model.length_cap
    windows = {n: windows_for(n, ids.numel() - 1, budget) for n in lengths}
    longest: dict[int, int] = {}  # start byte -> the longest window any length needs there
    for n in lengths:
        for w in range(windows[n]):
            longest[w * n] = max(longest.get(w * n, 0), n)
    bits_at, seconds, done, total = {}, {}, 0, sum(longest.values())
    for n in lengths:
        starts = [b for b, m in longest.items() if m == n]
        start_time = time.perf_counter()
        per_batch = max(1, (1 << 15) // n)  # as evaluate.position_losses
        for k in range(0, len(starts), per_batch):
            first = torch.tensor(starts[k : k + per_batch], device=ids.device)[:, None]
            rows = first + torch.arange(n, device=ids.device)  # (b, n) byte indices of each window
            logits = model(ids[rows]).logits.float()  # (b, n, V)
            lost = F.cross_entropy(logits.transpose(1, 2), ids[rows + 1], reduction="none").cpu() / LN2  # (b, n)
            bits_at.update(zip(starts[k : k + per_batch], lost))
            done += n * len(starts[k : k + per_batch])
            progress(done / total)
        seconds[n] = time.perf_counter() - start_time
    # bits per byte: the bytes the predicted ids cover (a tokenized model's ids cover several each)
    return {n: _length_score(torch.stack([bits_at[w * n][:n] for w in range(windows[n])]).numpy(), n, seconds[n],
                             _predicted_bytes(model, ids, windows[n] * n))
            for n in lengths}


def rope_scaling_curves(model: LabModel, factor: float, ids, lengths: Sequence[int],
                        scalings: Sequence[str] | None = None, progress: Progress = _no_progress) -> list[dict]:
    """Rows {scaling, factor, length, bpb} for the rope checkpoint under each scaling at ``factor``."""
    scalings = list(ROPE_SCALINGS) if scalings is None else list(scalings)
    rows = []
    for i, scaling in enumerate(scalings):
        scaled = model.with_position_options(scaling_overrides(scaling, factor))
        scores = length_scores(scaled, ids, lengths, lambda f: progress((i + f) / len(scalings)))
        rows += [{"scaling": scaling, "factor": 1.0 if scaling == "none" else float(factor), "length": n,
                  "bpb": scores[n].bpb} for n in lengths]
    return rows


def reference_curve(model: LabModel, ids, lengths: Sequence[int], progress: Progress = _no_progress) -> list[dict]:
    """Rows {length, bpb} of a model that needs no scaling; a length its method cannot represent (a
    learned table past its rows) has no row."""
    try:
        scores = length_scores(model, ids, lengths, progress)
    except PositionLimitError:  # some length is past what the method represents: each length on its own
        scores = {}
        for i, n in enumerate(lengths):
            try:
                scores[n] = score_at_length(model, ids, n)
            except PosvizError:
                pass
            progress((i + 1) / len(lengths))
    return [{"length": n, "bpb": scores[n].bpb} for n in lengths if n in scores]


def shipped_scaling_curves(model: LabModel) -> list[dict]:
    """Rows {scaling, length, bpb, factor} from the rope model's stored evaluation (static scalings
    were stored at factor = length / train_length, dynamic at 2)."""
    ev = model.stored_metrics().get("eval", {})
    rows = [{"scaling": "none", "length": int(n), "bpb": v, "factor": 1.0}
            for n, v in ev.get("nonoverlapping_bpb", {}).items() if v is not None]
    for scaling, block in ev.get("rope_scalings", {}).items():
        factors = block.get("factor", {})
        for n, v in block.get("nonoverlapping_bpb", {}).items():
            if v is not None:
                rows.append({"scaling": scaling, "length": int(n), "bpb": float(v), "factor": factors.get(n)})
    for remap, block in ev.get("rope_remaps", {}).items():  # each length with the defaults that cover it
        for n, v in block.get("nonoverlapping_bpb", {}).items():
            if v is not None:
                rows.append({"scaling": remap, "length": int(n), "bpb": float(v),
                             "factor": max(1.0, int(n) / model.train_length)})
    return sorted(rows, key=lambda r: (r["scaling"], r["length"]))


def rope_wavelengths(model: LabModel, factor: float, seq_len: int | None = None,
                     scalings: Sequence[str] | None = None) -> list[dict]:
    """Rows {scaling, pair, wavelength (positions per full turn = 2 pi / theta_i), attention_factor}.

    From the rotary model's frequencies under each scaling (``LabModel.frequencies``): no weights needed.
    ``seq_len`` matters only for dynamic NTK (defaults to factor x train_length).
    """
    seq_len = seq_len or int(factor * model.train_length)
    rows = []
    for scaling in (list(ROPE_SCALINGS) if scalings is None else [s for s in scalings if s in ROPE_SCALINGS]):
        # (a remap keeps every pair's speed: it changes which positions a pair is seen at, not the wavelengths)
        scaled = model.with_position_options({"scaling": scaling, "factor": 1.0 if scaling == "none" else float(factor)})
        inv_freq, attention = scaled.frequencies(seq_len)
        for i, theta in enumerate(inv_freq.tolist()):
            rows.append({"scaling": scaling, "pair": i, "wavelength": 2 * math.pi / theta,
                         "attention_factor": float(attention)})
    return rows


def wavelength_sentence(rows, train_length: int, factor: float) -> str | None:
    """What the wavelength chart shows, in one sentence from its rows (``rope_wavelengths``): for each scaling, how
    many pairs turn slower than the training length allows, at the stretched length s × L."""
    by = {}
    for r in rows:
        by.setdefault(r["scaling"], []).append(r["wavelength"])
    if not by:
        return None
    from posviz.display import display_name

    said = ", ".join(f"{sum(w > train_length for w in waves)} with "
                     f"{'no scaling' if name == 'none' else display_name(name)}" for name, waves in by.items())
    pairs = len(next(iter(by.values())))
    return (f"At s = {factor:g}, of the {pairs} rotary pairs, those slower than one turn per training length "
            f"({train_length:,} positions), never seen whole in training: {said}.")
