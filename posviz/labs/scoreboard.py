"""The scoreboard: one row per shipped checkpoint and per scaling or remap of the rope checkpoint, every number read
from metrics.json (``python -m posviz.evaluate_all`` writes them), never typed.

Columns: bits per byte at 1x, 4x and 16x the trained context (non-overlapping windows of the evaluation text, with
the 95 % bootstrap interval of each where the windows were stored), the far-copy ratio (the repeat probe's second
copy against the same bytes without a first one, at a gap of 4x the context: 1.00 is no copying at all), the
effective context length (``labs.key_value.effective_length``) and the KV cache verdict for a sliding window cache.
No plotting and no Streamlit here.
"""
from __future__ import annotations

import math
from typing import Mapping

from posviz.display import display_name
from posviz.labs import extrapolation
from posviz.labs.kv_cache import strategy_verdict
from posviz.models.interface import LabModel

MULTIPLES = (1, 4, 16)
# One mark for every number the table lacks, explained once under it (a grid drew None, nan or an empty cell):
# a length the model cannot run (the learned table past its rows), or a number the evaluation does not store
# (a scaling's or a remap's copy probe and intervals).
MISSING = "—"
NUMBER_FORMATS = {**{f"bpb {m}×": "{:.3f}" for m in MULTIPLES}, "copy ratio": "{:.2f}", "seeds": "{:.0f}"}
COPY_GAP_MULTIPLE = 4  # the far-copy ratio's gap, in trained contexts


def _bpb(table: Mapping, length: int) -> float | None:
    value = table.get(str(length))
    return None if value is None else float(value)


def _copy_ratio(ev: Mapping, gap: int) -> float | None:
    for row in ev.get("retrieval", {}).get("repeat", []):
        if row.get("gap") == gap and row.get("control_bits"):
            return round(float(row["second_bits"]) / float(row["control_bits"]), 3)
    return None


def _effective(block: Mapping | None) -> tuple[str, str]:
    if not block:
        return MISSING, "not stored: run python -m posviz.evaluate_all --effective-only"
    multiple = block.get("multiple")
    return ("not measurable" if multiple is None else f"{multiple:g}×"), block.get("reason", "")


def _seed_range(band: dict, lengths: list[int]) -> str:
    """"1×: low–high · 16×: low–high (k seeds)": the stored bits per byte over the recipe's training seeds at the
    table's lengths (``band``: {length: (lowest, highest, seeds)}); "one run" where no other seed was trained."""
    cells = [f"{n // lengths[0]}×: {band[n][0]:.3f}–{band[n][1]:.3f}" for n in lengths if n in band]
    return "one run" if not cells else " · ".join(cells) + f" ({max(v[2] for v in band.values())} seeds)"


def _verdict(model: LabModel) -> str:
    """The sliding-window cache verdict's first word (Correct, Runs, Differs, Cannot run, Broken)."""
    words = strategy_verdict(model, "cached_window").split(":")[0].split(",")[0]
    return words if words.startswith("Cannot") else words.split(" with ")[0]


def scoreboard_rows(models: Mapping[str, LabModel]) -> list[dict]:
    """Rows of the scoreboard for ``models`` (name -> model, the shipped checkpoints): each as trained, and the
    rope checkpoint under every scaling and remap its metrics.json stored."""
    rows = []
    for name, model in models.items():
        metrics = model.stored_metrics()
        ev = metrics.get("eval", {})
        if not ev:
            continue
        L = model.train_length
        base = L if not model.finetuned_from() else min(int(n) for n in ev.get("nonoverlapping_bpb", {"0": 0}))
        noise = extrapolation.shipped_bpb_intervals(model)
        effective = ev.get("effective_length", {})
        # the id for the CSV and links, the display name for the page (posviz.display)
        row = {"id": name, "checkpoint": display_name(name), "kind": "checkpoint", "method": model.method}
        for m in MULTIPLES:
            row[f"bpb {m}×"] = _bpb(ev.get("nonoverlapping_bpb", {}), m * base)
            row[f"{m}× interval"] = noise.get(m * base)
        band = {n: (low, high, k) for n, low, high, k in extrapolation.seed_band(model)}  # seeds.json read once
        row["training seeds"] = _seed_range(band, [m * base for m in MULTIPLES])
        row["seeds"] = max([k for *_, k in band.values()], default=1)  # runs of this recipe
        row["copy ratio"] = _copy_ratio(ev, COPY_GAP_MULTIPLE * base)
        row["effective length"], row["why"] = _effective(effective.get("as_trained"))
        row["KV cache (sliding window)"] = _verdict(model)
        rows.append(row)
        for group, kind in (("rope_scalings", "scaling"), ("rope_remaps", "remap")):
            for variant, block in ev.get(group, {}).items():
                table = dict(block.get("nonoverlapping_bpb", {}))
                if group == "rope_scalings":  # stored past the trained context only: at 1x a scaling is the plain model
                    table[str(base)] = ev.get("nonoverlapping_bpb", {}).get(str(base))
                scaled = {"id": f"{name}+{variant}", "checkpoint": display_name(f"{name}+{variant}"), "kind": kind,
                          "method": model.method}
                for m in MULTIPLES:
                    scaled[f"bpb {m}×"] = _bpb(table, m * base)
                    scaled[f"{m}× interval"] = None
                scaled["copy ratio"] = scaled["training seeds"] = scaled["seeds"] = None
                scaled["effective length"], scaled["why"] = _effective(effective.get(variant))
                if kind == "remap":
                    scaled["KV cache (sliding window)"] = _verdict(model.with_position_options({"remap": variant}))
                else:
                    scaled["KV cache (sliding window)"] = row["KV cache (sliding window)"]
                rows.append(scaled)
    return rows


PUBLISHED = "published"  # the kind of a published model's rows
NOT_MEASURED = "not measured"  # a published model's cell with no stored number (``posviz_tools.measure_published``)


def published_rows(refs, open_model) -> list[dict]:
    """Rows of the published models ``refs`` ($POSVIZ_MODELS), from their stored results (``labs.published_results``):
    each plain, and under each scaling and remap it has stored, at the same multiples of its own trained context (in
    its own tokens); a number it has not stored is None, shown as ``NOT_MEASURED``. A model that cannot be opened is
    left out (the labs say why)."""
    from posviz.errors import PosvizError
    from posviz.labs.published_results import read_results, result_file

    rows = []
    for ref in refs:
        try:
            model = open_model(ref)
        except PosvizError:
            continue
        record = read_results(ref)
        ev, L = record.get("eval", {}), model.train_length
        stored = f"stored in results/published/{result_file(ref).name}" if record else (
            "nothing stored: run python -m posviz_tools.measure_published --model " + ref)
        variants = [(None, None, ev)] + [(kind, name, block) for group, kind in (("rope_scalings", "scaling"),
                                                                                 ("rope_remaps", "remap"))
                                         for name, block in ev.get(group, {}).items()]
        for kind, name, block in variants:
            table = dict(block.get("nonoverlapping_bpb", {}))
            label = model.name if name is None else f"{model.name} + {display_name(name)}"
            row = {"id": ref if name is None else f"{ref}+{name}", "checkpoint": label, "kind": PUBLISHED,
                   "method": model.method}
            for m in MULTIPLES:
                row[f"bpb {m}×"] = _bpb(table, m * L)
                row[f"{m}× interval"] = None
            row["copy ratio"] = None
            effective = ev.get("effective_length", {}).get(name or "as_trained")
            row["effective length"], why = _effective(effective) if effective else (NOT_MEASURED, "")
            extra = sorted((int(n), v) for n, v in table.items() if v is not None and int(n) not in {m * L for m in MULTIPLES})
            others = ", ".join(f"{n / L:g}×: {v:.3f}" for n, v in extra)  # lengths the columns do not show (2×)
            row["why"] = "; ".join(w for w in (why, f"bits per byte also at {others}" if others else "", stored) if w)
            variant = model if name is None else model.with_position_options(
                {"remap": name} if kind == "remap" else {"scaling": name, "factor": 2.0})
            row["KV cache (sliding window)"] = _verdict(variant)
            rows.append(row)
    return rows


def shown_cell(column: str, value, missing: str = MISSING) -> str:
    """A cell as the page shows it: a number to its column's precision, ``missing`` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    fmt = NUMBER_FORMATS.get(column)
    return fmt.format(value) if fmt and isinstance(value, (int, float)) else str(value)


def shown_rows(rows: list[dict]) -> list[dict]:
    """``scoreboard_rows`` as the page's table shows them: every cell text, no None or nan."""
    return [{k: shown_cell(k, v, NOT_MEASURED if row.get("kind") == PUBLISHED else MISSING) for k, v in row.items()}
            for row in rows]


def extremes_by(rows, group: str, value: str):
    """The rows of ``rows`` (a DataFrame) with the lowest and the highest ``value`` in each ``group``: the points a
    slide names when naming every one would overlap."""
    import pandas as pd

    rows = rows[pd.to_numeric(rows[value], errors="coerce").notna()]
    if rows.empty:
        return rows
    picks = [i for _, part in rows.groupby(group, sort=False) for i in {part[value].idxmin(), part[value].idxmax()}]
    return rows.loc[sorted(set(picks))]
