"""The results write-up, docs/results.md, kept in step with the shipped metrics by the project's own code.

``python -m posviz_tools.report`` draws ``docs/bpb_vs_length.svg`` and ``docs/rope_scalings_vs_length.svg``
(dependency-free SVG line charts), prints the write-up's tables (quality, when copying formed, bits per
byte vs evaluation length, fine-tuning, far-context retrieval) for the shipped checkpoints and rewrites
them in docs/results.md (``--results``), each found by its header row, and every number of its prose written
as a value span (``fill_values``). ``--check`` writes nothing and fails when a table or a number there differs
from the metrics; a test holds docs/results.md to them the same way.
"""
from __future__ import annotations

import argparse
import html
import math
import re
import sys
from pathlib import Path

import numpy as np

from posviz.models.checkpoint_files import extends_context, read_config, read_metrics, shipped_checkpoints
from posviz.errors import PosvizError
from posviz.labs.retrieval import COPY_TARGET, induction_rows, induction_table
from posviz.labs import intervals

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results.md"
COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]


def _is_finetuned(folder: Path) -> bool:
    """Fine-tuned for context (``extends_context``): a DroPE recalibration counts with the pre-trained ones."""
    try:
        return extends_context(read_config(folder).get("finetuned_from"))
    except PosvizError:
        return False


def pretrained(models=None) -> dict[str, Path]:
    """{name: folder} of the shipped checkpoints that were trained from scratch (not fine-tuned)."""
    return {n: f for n, f in shipped_checkpoints(models).items() if not _is_finetuned(f)}


def finetuned(models=None) -> dict[str, Path]:
    """{name: folder} of the shipped checkpoints fine-tuned from another one."""
    return {n: f for n, f in shipped_checkpoints(models).items() if _is_finetuned(f)}


def curves(models=None) -> tuple[dict[str, dict[int, float | None]], int]:
    """{checkpoint (and rope scaling) name: {length: bpb}} of the pre-trained checkpoints, and the training length."""
    out, train_length = {}, None
    for name, folder in pretrained(models).items():
        metrics, config = read_metrics(folder), read_config(folder)
        train_length = config["model"]["train_length"]
        ev = metrics.get("eval", {})
        out[name] = {int(k): v for k, v in ev.get("nonoverlapping_bpb", {}).items()}
        for scaling, block in ev.get("rope_scalings", {}).items():
            row = {int(k): v for k, v in block["nonoverlapping_bpb"].items()}
            base = out[name].get(train_length)
            out[f"{name}+{scaling}"] = {train_length: base, **row} if base is not None else row
    return out, train_length or 0


def markdown_table(data: dict[str, dict[int, float | None]], train_length: int) -> str:
    lengths = sorted({n for row in data.values() for n in row})
    head = "| checkpoint | " + " | ".join(f"{n:,} ({n // train_length}×)" for n in lengths) + " |"
    sep = "|---|" + "---:|" * len(lengths)
    rows = []
    for name, row in data.items():
        cells = []
        for n in lengths:
            v = row.get(n, "")
            cells.append("—" if v == "" else _cell(v, 3))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *rows])


def _cell(value: float | None, digits: int) -> str:
    return "cannot run" if value is None else f"{value:.{digits}f}"


def quality_table(models=None) -> str:
    """Bits per byte at the training length: on the whole validation split and on the first 64 KiB of
    the long validation documents (what training logs as ``val_bpb_at_train_length``)."""
    rows = ["| checkpoint | whole validation split | first 64 KiB of the long validation documents |", "|---|---:|---:|"]
    for name, folder in pretrained(models).items():
        metrics = read_metrics(folder)
        whole = metrics["eval"].get("validation_split_bpb")  # absent when evaluated without the split
        rows.append(f"| {name} | {'—' if whole is None else f'{whole:.3f}'} | {metrics['val_bpb_at_train_length']:.3f} |")
    return "\n".join(rows)


def windows(models=None) -> tuple[dict[str, dict[int, list[float]]], int]:
    """{pre-trained checkpoint: {length: bits per byte of each evaluation window}} (``eval.nonoverlapping_window_bpb``;
    a checkpoint evaluated before windows were kept has none), and the training length."""
    out, L = {}, 0
    for name, folder in pretrained(models).items():
        L = read_config(folder)["model"]["train_length"]
        stored = read_metrics(folder).get("eval", {}).get("nonoverlapping_window_bpb", {})
        # up to 16x: 32x has 15 windows, too few to resample, and only checkpoints evaluated in full store them
        out[name] = {int(n): w for n, w in stored.items() if len(w) >= 2 and int(n) <= 16 * L}
    return out, L


def noise_table(models=None) -> str:
    """± the larger side of each score's 95 % bootstrap interval over its evaluation windows, per length."""
    data, L = windows(models)
    lengths = sorted({n for row in data.values() for n in row})
    if not lengths:
        return ""
    rows = ["| checkpoint | " + " | ".join(f"± at {n:,} ({n // L}×, {len(next(r[n] for r in data.values() if n in r))} "
                                            "windows)" for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for name, row in data.items():
        rows.append(f"| {name} | " + " | ".join("—" if n not in row else f"{intervals.half_width(row[n]):.3f}"
                                               for n in lengths) + " |")
    return "\n".join(rows)


# The differences the write-up reads as findings (a checkpoint against another, at a multiple of the training
# length): each with its paired 95 % interval over the same windows.
COMPARISONS = [("fox", "alibi", 1), ("fox", "alibi", 4), ("fox", "alibi", 16), ("transformer_xl", "alibi", 16),
               ("kerple", "alibi", 16), ("local_global", "rope", 1), ("irope", "rope", 1), ("p_rope", "rope", 1),
               ("local_global", "nezha", 1), ("fire", "alibi", 1), ("fire", "nezha", 1), ("nezha", "shaw", 1), ("cope", "alibi", 4), ("stick_breaking", "fox", 1),
               ("stick_breaking", "fox", 16), ("stick_breaking", "alibi", 16), ("canon", "local_global", 1),
               ("canon", "alibi", 16), ("canon", "rope", 1), ("path", "rope", 1), ("path", "rope", 16),
               ("path", "alibi", 16), ("path", "fope", 16),
               ("pope", "rope", 1), ("pope", "fope", 16), ("fope", "rope", 1), ("fope", "rope", 16), ("fope", "alibi", 16),
               ("hybrid_deltanet", "rope", 1), ("hybrid_deltanet", "rope", 16), ("hybrid_deltanet", "nope", 16),
               ("hybrid_deltanet", "alibi", 16), ("gated_attention", "rope", 1), ("gated_attention", "rope", 16),
               ("rope", "sinusoidal", 2), ("alibi", "rope", 4), ("alibi", "rope", 16)]


def seed_values(folder: Path, length: int) -> list[float]:
    """The stored bits per byte at ``length`` of each training seed of ``folder``'s recipe (its own run first)."""
    from posviz.training.seeds import seed_records

    values = [r.get("eval", {}).get("nonoverlapping_bpb", {}).get(str(length)) for r in seed_records(folder)]
    return [float(v) for v in values if v is not None]


def across_seeds(a: list[float], b: list[float], verdict: str) -> str:
    """Whether a paired verdict on one run of each holds across their training seeds: every seed of one below every
    seed of the other, or their ranges overlapping (a difference one training's luck could make); then, of every
    pair of a seed of each, how many lie the verdict's way (the more common way where the verdict is neither)."""
    if len(a) < 2 or len(b) < 2:
        return "one run each" if len(a) < 2 and len(b) < 2 else "one run of one of them"
    pairs = len(a) * len(b)
    lower = sum(x < y for x in a for y in b)
    higher = sum(x > y for x in a for y in b)
    if pairs in (lower, higher):  # every seed of one below every seed of the other
        direction = "lower" if lower == pairs else "higher"
        return f"{direction} in every seed ({len(a)} and {len(b)})" + ("" if direction == verdict else ": not as read")
    way = verdict if verdict in ("lower", "higher") else "lower" if lower >= higher else "higher"
    return (f"within one training's spread ({len(a)} and {len(b)} seeds; {way} in "
            f"{lower if way == 'lower' else higher} of {pairs} pairs)")


def differences_table(models=None) -> str:
    """Each of ``COMPARISONS`` whose windows are stored: the difference of bits per byte and its paired interval,
    and whether it holds across the training seeds where more than one was trained (``across_seeds``)."""
    data, L = windows(models)
    folders = pretrained(models)
    rows = ["| checkpoint | against | length | difference (bits per byte) | 95 % interval, paired windows | reads as | "
            "across training seeds |", "|---|---|---:|---:|---|---|---|"]
    for a, b, multiple in COMPARISONS:
        n = multiple * L
        if n not in data.get(a, {}) or n not in data.get(b, {}):
            continue
        diff = float(np.mean(data[a][n]) - np.mean(data[b][n]))
        low, high = intervals.difference_interval(data[a][n], data[b][n])
        verdict = "lower" if high < 0 else "higher" if low > 0 else "within the noise"
        seeds = across_seeds(seed_values(folders[a], n), seed_values(folders[b], n), verdict)
        rows.append(f"| {a} | {b} | {n:,} ({multiple}×) | {diff:+.3f} | {low:+.3f} to {high:+.3f} | {verdict} | {seeds} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def seeds_table(models=None) -> str:
    """Each checkpoint with more than one training seed recorded (``posviz.training.seeds``): the mean and the
    lowest–highest over its seeds of bits per byte at 1×, 4× and 16×, the copy ratio, and each seed's bytes seen when
    its copy ratio first reached the target (as ``copy_formation_table``) and its effective length; and, where every
    seed kept its sink block, the spread of its first-byte share and of what StreamingLLM's sinks save."""
    from posviz.training.seeds import seed_records

    rows = ["| checkpoint | seeds | 1× | 4× | 16× | copy ratio | copy ratio first ≤ 0.5 at (M bytes) | effective length "
            "| first-byte share | sinks save |", "|---|---:|---|---|---|---|---|---|---|---|"]

    def spread(values, digits=3, unit=""):
        values = [v for v in values if v is not None]
        if not values:
            return "—"
        return f"{np.mean(values):.{digits}f}{unit} ({min(values):.{digits}f}–{max(values):.{digits}f}{unit})"

    for name, folder in pretrained(models).items():
        records = seed_records(folder)
        if len(records) < 2:
            continue
        L = read_config(folder)["model"]["train_length"]
        cells = [spread([r.get("eval", {}).get("nonoverlapping_bpb", {}).get(str(m * L)) for r in records])
                 for m in (1, 4, 16)]
        cells.append(spread([(r.get("copy_curve") or [{}])[-1].get("ratio") for r in records], 2))
        firsts = [next((p for p in r.get("copy_curve") or [] if p.get("ratio") is not None and p["ratio"] <= COPY_TARGET),
                       None) for r in records]
        cells.append(", ".join("not reached" if f is None else f"{f['tokens'] / 1e6:.1f}" if "tokens" in f else "?"
                               for f in firsts))
        lengths = [((r.get("eval", {}).get("effective_length") or {}).get("as_trained") or {}).get("multiple", "?")
                   for r in records]
        cells.append(", ".join("not measurable" if v is None else f"{v:g}×" if isinstance(v, (int, float)) else str(v)
                               for v in lengths))
        # the sink block, as ``sinks_table`` reads it, where every seed kept one (seeds recorded before 2026-12-06
        # kept none: a spread over some of the seeds would read as one over all)
        sinks = [r.get("eval", {}).get("sinks") for r in records]
        if all(sinks):
            shares = [100 * _sink_reading(b)[0] for b in sinks]
            cells += [spread(shares, 1, "%"),
                      spread([b["streaming"]["sinks_save_bpb"] for b in sinks])]
        else:
            cells += ["—", "—"]
        rows.append(f"| {name} | {len(records)} | " + " | ".join(cells) + " |")
    return "\n".join(rows) if len(rows) > 2 else ""


SCALING_LABELS = {"none": "none", "linear": "linear (PI)", "yarn": "YaRN"}  # as the papers name them


def finetuning_table(models=None) -> str:
    """Each fine-tuned checkpoint at its fine-tuning length before and after, and after at 1/4, 2 and 4 times it."""
    folders = finetuned(models)
    if not folders:
        return ""
    L = read_config(next(iter(folders.values())))["model"]["train_length"]
    lengths = (L // 4, 2 * L, 4 * L)
    rows = [f"| scaling | {L:,} before | {L:,} after | " + " | ".join(f"{n:,} after" for n in lengths) + " |",
            "|---|" + "---:|" * (2 + len(lengths))]
    for name, folder in folders.items():
        config, block = read_config(folder), read_metrics(folder)["eval"]
        scaling = config["finetuned_from"]["position_options"].get("scaling", "none")
        after, before = block["nonoverlapping_bpb"], block["before_finetuning"]["nonoverlapping_bpb"]
        cells = [_cell(before[str(L)], 3), f"**{_cell(after[str(L)], 3)}**", *(_cell(after[str(n)], 3) for n in lengths)]
        rows.append(f"| {SCALING_LABELS.get(scaling, scaling)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def retrieval_table(models=None) -> str:
    """The far-context probes of every pre-trained checkpoint: the repeat probe's second-copy over
    first-copy loss at gap 0 (``ratio``, the set's copying target), its loss over the no-copy control
    (``gain``) at gap 0 and at 1, 4 and 16 times the training length; the key-value probe's
    recalled over first-sight loss at gap 0 and 1x; the induction score of the strongest head at gap 0
    and of that same head at 4x (``retrieval.induction_rows``)."""
    folders = pretrained(models)
    L = read_config(next(iter(folders.values())))["model"]["train_length"]
    rows = [f"| checkpoint | second / first copy, gap 0 | second / control, gap 0 | {L:,} (1×) | {4 * L:,} (4×) "
            f"| {16 * L:,} (16×) | key–value, gap 0 | {L:,} | induction, gap 0 | {4 * L:,} |", "|---|" + "---:|" * 9]
    metrics = {name: read_metrics(folder) for name, folder in folders.items()}
    best = {}
    for row in induction_rows(induction_table(metrics)):
        if row["best"]:
            best[(row["model"], row["gap"])] = row["score"]
    for name, m in metrics.items():
        block = m["eval"]["retrieval"]
        repeat = {r["gap"]: r["gain"] for r in block["repeat"]}
        first_copy = next(r["ratio"] for r in block["repeat"] if r["gap"] == 0)
        recall = {r["gap"]: r["ratio"] for r in block["key_value"]}
        cells = [_cell(first_copy, 2), *(_cell(repeat.get(g), 2) for g in (0, L, 4 * L, 16 * L)),
                 *(_cell(recall.get(g), 2) for g in (0, L)), *(_cell(best.get((name, g)), 2) for g in (0, 4 * L))]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _ratio_at(curve: list[dict], limit: float) -> float | None:
    """The copy ratio of the last saved state at or before ``limit`` bytes (within a step of it)."""
    seen = [p for p in curve if p["tokens"] <= limit * 1.001]
    return seen[-1]["ratio"] if seen else None


def copy_formation_table(models=None) -> str:
    """When copying formed: each checkpoint's ``copy_curve`` (the repeat probe at gap 0 that training
    runs at every saved state) read at each quarter of training, and the bytes seen when the ratio
    first reached the target. Empty when no checkpoint has a curve (a set trained before the check)."""
    curves = {n: read_metrics(f).get("copy_curve") for n, f in pretrained(models).items()}
    curves = {n: c for n, c in curves.items() if c}
    if not curves:
        return ""
    total = max(p["tokens"] for c in curves.values() for p in c)
    quarters = [total * q / 4 for q in (1, 2, 3, 4)]
    rows = ["| checkpoint | " + " | ".join(f"{q / 1e6:.0f} M bytes" for q in quarters)
            + f" | first ≤ {COPY_TARGET} at |", "|---|" + "---:|" * 5]
    for name, curve in curves.items():
        first = next((p["tokens"] for p in curve if p["ratio"] is not None and p["ratio"] <= COPY_TARGET), None)
        cells = [_cell(_ratio_at(curve, q), 2) for q in quarters]
        cells.append("not reached" if first is None else f"{first / 1e6:.1f} M bytes")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _sink_reading(block: dict) -> tuple[float, tuple[int, int, float]]:
    """A sink block's mean share of attention on the first byte over its attention layers' heads (a recurrent layer's
    entry is None: ``sinks_block``), and its strongest head (layer, head, share)."""
    layers = [i for i, heads in enumerate(block["first_byte_share"]) if heads is not None]
    share = np.array([block["first_byte_share"][i] for i in layers])
    row, head = np.unravel_index(int(share.argmax()), share.shape)
    return float(share.mean()), (layers[row], int(head), float(share.max()))


def sinks_table(models=None) -> str:
    """Attention sinks of every pre-trained checkpoint (``eval.sinks``, ``training.evaluate.sinks_block``): the mean
    and the strongest head's share of attention on a document's first byte, the weight rows leave unspent, and
    cached decoding through a window of 128 bytes without and with 4 StreamingLLM sinks. Empty without any block."""
    blocks = {n: read_metrics(f)["eval"].get("sinks") for n, f in pretrained(models).items()}
    blocks = {n: b for n, b in blocks.items() if b}
    if not blocks:
        return ""
    first = next(iter(blocks.values()))
    rows = [f"| checkpoint | share on the first byte (even: {first['uniform_share']:.1%}) | strongest head "
            f"| weight left unspent | after eviction, W = {first['streaming']['window']} | with "
            f"{first['streaming']['sinks']} sinks | sinks save |", "|---|---:|---|---:|---:|---:|---:|"]
    for name, b in blocks.items():
        mean_share, (layer, head, strongest) = _sink_reading(b)
        left = [v for v in b["weight_left_by_layer"] if v is not None]
        stream = b["streaming"]
        without, with_ = stream["without"]["bpb_after_eviction"], stream["with_sinks"]["bpb_after_eviction"]
        rows.append(f"| {name} | {mean_share:.1%} | layer {layer}, head {head}: {strongest:.1%} | "
                    f"{np.mean(left):.1%} (most {max(left):.1%}) | {_cell(without, 3)} | {_cell(with_, 3)} | "
                    f"{_cell(stream['sinks_save_bpb'], 3)} |")
    return "\n".join(rows)


def _extrapolation_table(models=None) -> str:
    return markdown_table(*curves(models))


TABLES = {"quality": quality_table, "extrapolation": _extrapolation_table, "fine-tuning": finetuning_table,
          "retrieval": retrieval_table, "copy formation": copy_formation_table, "sinks": sinks_table,
          "noise": noise_table, "differences": differences_table, "seeds": seeds_table}


def results_tables(models=None, only: str | None = None) -> dict[str, str]:
    """Every table of the results write-up (docs/results.md), from the shipped metrics (a test holds the file to
    them); ``only``: just that one."""
    return {title: make(models) for title, make in TABLES.items() if only in (None, title)}


# ------------------------------------------------------------------------------ numbers in the prose
# A number in the write-up's prose is a span ``<!--v NAME-->shown<!--/v-->`` (the comments do not render), and
# ``fill_values`` writes ``shown`` from the data. NAME is ``checkpoint:path.in.metrics.json|format`` (in a list
# of rows, ``field=value`` picks the row: ``eval.retrieval.repeat.gap=256.gain``; ``max`` is a list's largest
# number: ``eval.retrieval.induction.0.max``, the strongest head), or
# ``@count:set|format`` for a count of checkpoints, ``@range:set:path|format`` for "lowest–highest" of a
# path over a set (``set!a,b``: without checkpoints a and b; or checkpoints named ``a,b,c``; ``@median:``
# for their median),
# ``@ratio:a:path / b:path|format`` for one value over another (``@diff:a:path - b:path``: minus it), ``@table:title;row;column|format`` for a cell of one of the write-up's tables (the column
# named by its header; a row named by its first cell, or by its first cells joined with "&": "path&rope&256 (1×)"). A path that starts with ``config.`` reads config.json instead of metrics.json, and one
# that ends ``/N`` divides by N (``parameters/1e6``). Formats: a Python format spec (".3f", ".2f", ".1%", ","),
# "words" or "Words" (a count as a word: "eighteen", "Eighteen"), "x" (a multiple: 1.07x is "1.07×") or "num"
# (a cell's leading number: "6.6" of "6.6 M bytes") or "pct0"/"pct1" (a share as "26 %", "26.5 %").
VALUE_SPAN = re.compile(r"<!--v ([^>]*?)-->(.*?)<!--/v-->", re.S)
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
# a count in words, up to ninety-nine (the shipped set passed twenty-five)
WORDS = _UNITS + [tens + (f"-{_UNITS[unit]}" if unit else "") for tens in ("twenty thirty forty fifty sixty seventy eighty ninety").split()
                  for unit in range(10)]


def _format(value, spec: str) -> str:
    if spec in ("pct0", "pct1"):  # a share as a percentage with a space: "26 %"
        return f"{100 * value:.{spec[-1]}f} %"
    if spec == "num":
        return re.match(r"[\d,.]+", str(value)).group(0)
    if spec == "multiple":  # an effective length: "2×", or the words for a model that does not recall within its context
        return "not measurable" if value is None else f"{value:g}×"
    if isinstance(value, str):
        return value
    if spec in ("words", "Words"):
        word = WORDS[int(value)] if int(value) < len(WORDS) else f"{int(value):,}"
        return word.capitalize() if spec == "Words" else word
    if spec == "x":
        return f"{value:.2f}×"
    return format(value, spec)


def _sets(models=None) -> dict[str, dict[str, Path]]:
    return {"shipped": shipped_checkpoints(models), "pretrained": pretrained(models), "finetuned": finetuned(models)}


def _read(name: str, folder: Path, path: str):
    """The value at ``path`` (dotted; see ``VALUE_SPAN``) of one checkpoint's metrics.json, or its config.json."""
    path, _, divisor = path.partition("/")
    config = path.startswith("config.")
    value = read_config(folder) if config else read_metrics(folder)
    for key in (path.split(".")[1:] if config else path.split(".")):
        if isinstance(value, list) and "=" in key:  # the row whose field equals this: repeat.gap=256.gain
            field, _, wanted = key.partition("=")
            rows = [r for r in value if isinstance(r, dict) and str(r.get(field)) == wanted]
            if len(rows) != 1:
                raise PosvizError(f"value {name!r}: {len(rows)} rows of {folder.name}'s {path!r} have {key}")
            value = rows[0]
        elif isinstance(value, list) and key in ("max", "mean"):  # of a (nested) list: the best head, the average
            value = float(getattr(np, key)(np.asarray(value, dtype=float)))
        elif isinstance(value, list):
            value = value[int(key)]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            raise PosvizError(f"value {name!r}: {folder.name}'s {'config' if config else 'metrics'}.json has no "
                              f"{key!r} along {path!r}")
    return value / float(divisor) if divisor and value is not None else value


def _table_cell(name: str, where: str, tables: dict[str, str], models=None) -> str:
    title, row, column = (part.strip() for part in where.split(";"))
    if title not in TABLES:
        raise PosvizError(f"value {name!r}: no table {title!r} (one of {', '.join(TABLES)})")
    if title not in tables:
        tables.update(results_tables(models, only=title))
    lines = [[c.strip() for c in line.strip().strip("|").split("|")] for line in tables[title].split("\n") if line]
    header, body = lines[0], lines[2:]
    if column not in header:
        raise PosvizError(f"value {name!r}: the {title} table has no column {column!r} ({header})")
    keys = [k.strip() for k in row.split("&")]  # "a&b&c": the row whose first cells are a, b and c
    rows = [r for r in body if r[:len(keys)] == keys]
    if len(rows) != 1:
        raise PosvizError(f"value {name!r}: the {title} table has {len(rows)} rows named {row!r}")
    return rows[0][header.index(column)]


def value_of(name: str, models=None, tables: dict[str, str] | None = None) -> str:
    """The text of the span named ``name`` (see ``VALUE_SPAN``), read from the shipped checkpoints' files
    (``tables``: the write-up's tables a caller keeps across spans; each is made when a span first needs it)."""
    what, _, spec = name.partition("|")
    source, _, path = what.partition(":")
    if source == "@count":
        sets = _sets(models)
        if path not in sets:
            raise PosvizError(f"value {name!r}: no set {path!r} to count (one of {', '.join(sets)})")
        return _format(len(sets[path]), spec or "d")
    if source in ("@range", "@median"):
        which, _, path = path.partition(":")
        which, _, left_out = which.partition("!")  # pretrained!fox,cope: the set without those
        sets, folders = _sets(models), shipped_checkpoints(models)
        members = sets[which] if which in sets else {n: folders[n] for n in which.split(",")}  # or named: a,b,c
        values = [v for n, f in members.items()
                  if n not in left_out.split(",") and (v := _read(name, f, path)) is not None]
        if source == "@median":
            return _format(float(np.median(values)), spec or "")
        low, high = _format(min(values), spec or ""), _format(max(values), spec or "")
        return low if low == high else f"{low}–{high}"
    if source in ("@ratio", "@diff"):  # @ratio:a:path / b:path, @diff:a:path - b:path
        folders, both = shipped_checkpoints(models), []
        for part in path.split(" / " if source == "@ratio" else " - "):
            checkpoint, _, inner = part.partition(":")
            both.append(_read(name, folders[checkpoint], inner))
        return _format(both[0] / both[1] if source == "@ratio" else both[0] - both[1], spec or ".2f")
    if source == "@table":
        return _format(_table_cell(name, path, tables if tables is not None else {}, models), spec)
    folders = shipped_checkpoints(models)
    if source not in folders:
        raise PosvizError(f"value {name!r}: no shipped checkpoint {source!r}")
    value = _read(name, folders[source], path)
    if value is None and spec != "multiple":  # an effective length's None is its own words (``_format``)
        return "cannot run"
    return _format(value, spec or "")


def fill_values(text: str, models=None) -> tuple[str, list[str]]:
    """``text`` with every value span rewritten from the data, and the spans whose text changed ("name: was -> now")."""
    changed, tables = [], {}  # the tables a span reads, each made once

    def fill(match):
        now = value_of(match.group(1), models, tables)
        if now != match.group(2):
            changed.append(f"{match.group(1)}: {match.group(2)} -> {now}")
        return f"<!--v {match.group(1)}-->{now}<!--/v-->"

    return VALUE_SPAN.sub(fill, text), changed


def update_tables(text: str, tables: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` (Markdown) with every table whose header row is a new table's header replaced by that
    table; returns the new text and the titles of the tables it found no place for."""
    lines, missing = text.split("\n"), []
    for title, table in tables.items():
        if not table:
            continue
        new = table.split("\n")
        try:
            start = lines.index(new[0])
        except ValueError:
            missing.append(title)
            continue
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[start:end] = new
    return "\n".join(lines), missing



def stale_lines(text: str, tables: dict[str, str]) -> dict[str, list[str]]:
    """{title: the rows of its table that are not a line of ``text``}, for every table with any."""
    have = set(text.split("\n"))
    stale = {title: [line for line in table.split("\n") if line not in have] for title, table in tables.items() if table}
    return {title: lines for title, lines in stale.items() if lines}

def svg_chart(data: dict[str, dict[int, float | None]], train_length: int, width: int = 760, height: int = 420,
              title: str = "Bits per byte vs evaluation length (non-overlapping windows)") -> str:
    pad_l, pad_r, pad_t, pad_b = 60, 170, 40, 50
    points = [(n, v) for row in data.values() for n, v in row.items() if v is not None]
    xs = [math.log2(n) for n, _ in points]
    x0, x1 = min(xs), max(xs)
    ys = sorted(v for _, v in points)
    y0 = math.floor(ys[0] * 10) / 10
    y1 = min(ys[-1], ys[0] + 3.0)  # clip exploding curves so the interesting band stays readable
    y1 = math.ceil(y1 * 10) / 10
    X = lambda n: pad_l + (math.log2(n) - x0) / max(1e-9, x1 - x0) * (width - pad_l - pad_r)
    Y = lambda v: pad_t + (1 - (min(v, y1) - y0) / max(1e-9, y1 - y0)) * (height - pad_t - pad_b)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{html.escape(title)}</text>']
    for e in range(int(x0), int(x1) + 1):
        n = 2 ** e
        parts.append(f'<line x1="{X(n):.1f}" x2="{X(n):.1f}" y1="{pad_t}" y2="{height - pad_b}" stroke="#eee"/>')
        parts.append(f'<text x="{X(n):.1f}" y="{height - pad_b + 16}" text-anchor="middle">{n:,}</text>')
    steps = max(1, round((y1 - y0) / 0.5 * 2)) if y1 - y0 > 1 else 5
    for i in range(steps + 1):
        v = y0 + (y1 - y0) * i / steps
        parts.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{pad_l - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    parts.append(f'<line x1="{X(train_length):.1f}" x2="{X(train_length):.1f}" y1="{pad_t}" y2="{height - pad_b}" '
                 f'stroke="#333" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{X(train_length) + 4:.1f}" y="{pad_t + 12}">training length {train_length}</text>')
    parts.append(f'<text x="{(pad_l + width - pad_r) / 2}" y="{height - 12}" text-anchor="middle">evaluation length (bytes, log scale)</text>')
    parts.append(f'<text transform="translate(16 {height / 2}) rotate(-90)" text-anchor="middle">bits per byte (lower is better)</text>')
    for i, (name, row) in enumerate(data.items()):
        colour = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="5 3"' if "+" in name else ""
        pts = [(X(n), Y(v)) for n, v in sorted(row.items()) if v is not None]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for x, y in pts:
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>')
        ly = pad_t + 10 + i * 18
        parts.append(f'<line x1="{width - pad_r + 12}" x2="{width - pad_r + 36}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{width - pad_r + 42}" y="{ly + 4}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Draw the results charts and rewrite the tables of docs/results.md "
                                             "from the shipped metrics.")
    ap.add_argument("--out", default="docs/bpb_vs_length.svg")
    ap.add_argument("--with-scalings", action="store_true", help="also draw the rope checkpoint under each scaling")
    ap.add_argument("--results", default=str(RESULTS), help="the Markdown file whose tables are rewritten in place, "
                    "each one found by its header row (default: docs/results.md; '' to only print them)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a table of --results differs "
                    "from the shipped metrics")
    args = ap.parse_args(argv)
    tables = results_tables()
    if args.check:
        text = Path(args.results).read_text()
        stale = stale_lines(text, tables)
        for title, lines in stale.items():
            print(f"{args.results}: the {title} table differs from the shipped metrics; not found there:\n  "
                  + "\n  ".join(lines))
        _, moved = fill_values(text)
        for line in moved:
            print(f"{args.results}: a number in the prose differs from the shipped metrics: {line}")
        print(f"{args.results}: " + ("stale; run python -m posviz_tools.report to rewrite its tables and numbers"
                                      if stale or moved else "every table and number is the shipped metrics"))
        return 1 if stale or moved else 0
    data, L = curves()
    base = {k: v for k, v in data.items() if "+" not in k}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(svg_chart(data if args.with_scalings else base, L))
    scal = Path(args.out).with_name("rope_scalings_vs_length.svg")
    scal.write_text(svg_chart({k: v for k, v in data.items() if k.startswith("rope") or k in ("alibi", "t5")}, L,
                              title="RoPE context extension vs ALiBi and T5"))
    for title, table in tables.items():
        print(f"{title}:\n\n{table}\n")
    if args.results:
        text, missing = update_tables(Path(args.results).read_text(), tables)
        text, moved = fill_values(text)
        Path(args.results).write_text(text)
        for line in moved:
            print(f"number rewritten: {line}")
        print(f"updated the tables of {args.results}" + (f"; no table there for: {', '.join(missing)} "
                                                          "(paste them where they belong)" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
