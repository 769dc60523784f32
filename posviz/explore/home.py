"""The numbers behind the Home page: the method comparison table and the headline bits/byte-vs-length chart.

Pure functions over the shipped checkpoints' metrics.json dicts and the method registry's ClassVars;
no plotting, no Streamlit. "Extrapolates" compares bits/byte at 16x the training length with 1x
(``extrapolation``). Every function returns plain rows, numbers or "column -> array" dicts that
``pandas.DataFrame`` takes as they are (long format, one row per plotted point).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from posviz.positions import POSITION_METHODS, ModelShape, build_position_method, method_names

Columns = dict[str, np.ndarray]


# Short: a cell of Home's table shows about 24 characters at 1366 px ("hidden states (short convolution)" was cut);
# the column's help says the rest.
ACTS_ON_LABEL = {
    "input": "input (added)",
    "q/k": "queries & keys (rotated)",
    "logits": "logits (bias)",
    "weights": "weights (no softmax)",
    "nothing": "nowhere",
    "hidden": "hidden states (conv.)",
    "recurrence": "recurrent layers",
}
KV_CACHE_REASON = {  # why a method works with a KV cache: shown as help next to the table
    "input": "the position is baked into each cached key and value",
    "q/k": "keys are cached already rotated to their own positions",
    "logits": "the bias is recomputed from the cached keys' positions",
    "nothing": "there is no position to keep",
    "hidden": "no position is kept; the cache keeps the last few bytes' hidden states for the convolution",
    "recurrence": "no position is kept; the recurrent layers keep their state, which follows the text",
}
EXTRAPOLATION_MULTIPLE = 16  # "extrapolates": bits/byte at 16x the training length against 1x
EXTRAPOLATES_WITHIN_BPB = 0.05  # at most this much worse: "yes"
DEGRADES_WITHIN_BPB = 0.5  # at most this much worse: "partly"; worse still: "no"


def train_length_of(metrics: Mapping[str, Any]) -> int | None:
    """The training length of a checkpoint, read from its eval block (the length at multiple 1)."""
    ratios = (metrics.get("eval") or {}).get("lengths_x_train") or {}
    ones = [int(n) for n, r in ratios.items() if r == 1]
    return ones[0] if ones else None


def bpb_by_length(metrics: Mapping[str, Any]) -> dict[int, float | None]:
    """{evaluation length: bits/byte or None (cannot run)} from a metrics.json dict."""
    table = (metrics.get("eval") or {}).get("nonoverlapping_bpb") or {}
    return {int(n): (None if v is None else float(v)) for n, v in sorted(table.items(), key=lambda kv: int(kv[0]))}


def extrapolation(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    """bits/byte at 1x and at 16x (or the longest evaluated multiple) the training length, and a verdict.

    Keys: bpb_1x, bpb_long, long_multiple, verdict ("yes", "partly", "no" or "unknown"), reason.
    """
    if not metrics:
        return {"bpb_1x": None, "bpb_long": None, "long_multiple": None, "verdict": "unknown", "reason": "no checkpoint"}
    train = train_length_of(metrics)
    table = bpb_by_length(metrics)
    if train is None or train not in table or table[train] is None:
        return {"bpb_1x": None, "bpb_long": None, "long_multiple": None, "verdict": "unknown",
                "reason": "not evaluated yet"}
    longer = [n for n in table if n > train]
    target = train * EXTRAPOLATION_MULTIPLE
    long = target if target in table else (max(longer) if longer else None)
    if long is None:
        return {"bpb_1x": table[train], "bpb_long": None, "long_multiple": None, "verdict": "unknown",
                "reason": "not evaluated past the training length"}
    multiple = long / train
    if table[long] is None:
        return {"bpb_1x": table[train], "bpb_long": None, "long_multiple": multiple, "verdict": "no",
                "reason": f"cannot run past {train:,} positions"}
    worse = table[long] - table[train]
    verdict = "yes" if worse <= EXTRAPOLATES_WITHIN_BPB else "partly" if worse <= DEGRADES_WITHIN_BPB else "no"
    return {"bpb_1x": table[train], "bpb_long": table[long], "long_multiple": multiple, "verdict": verdict,
            "reason": f"{worse:+.2f} bits/byte at {multiple:g}x"}


def extrapolation_label(ext: Mapping[str, Any]) -> str:
    """The verdict, plus why when the numbers beside it do not say it (no run, or a shorter multiple)."""
    if ext["bpb_long"] is None:
        # the bits/byte column beside it already says "cannot run"
        return "no" if ext["verdict"] == "no" else f"{ext['verdict']} ({ext['reason']})"
    if ext["long_multiple"] != EXTRAPOLATION_MULTIPLE:
        return f"{ext['verdict']} ({ext['reason']})"
    return ext["verdict"]


def method_rows(metrics_by_name: Mapping[str, Mapping[str, Any] | None], train_length: int | None = None) -> list[dict]:
    """One row per registered method (display order) for the home page's comparison table.

    Built from each method's ClassVars; "extrapolates" from the shipped metrics (``extrapolation``).
    Position limits use each checkpoint's training length, else ``train_length``, else the recipe's.
    """
    from posviz.training.train import TrainConfig

    rows = []
    for name in method_names():
        cls = POSITION_METHODS[name]
        metrics = metrics_by_name.get(name)
        length = (metrics and train_length_of(metrics)) or train_length or TrainConfig().train_length
        method = build_position_method(name, ModelShape(1, 1, 2, 2, length))
        limit = method.max_positions
        cache = "yes" if limit is None else f"yes (≤ {limit:,})"  # positions: the table has that many rows
        ext = extrapolation(metrics_by_name.get(name))
        rows.append({
            "method": name,
            "summary": cls.summary,
            "absolute / relative": cls.kind if cls.kind != "none" else "neither",
            "fixed / learned": "learned" if cls.learned else "fixed",
            "acts on": ACTS_ON_LABEL.get(cls.acts_on, cls.acts_on),
            "KV-cacheable": cache,
            "bits/byte @ 1×": ext["bpb_1x"],
            f"bits/byte @ {EXTRAPOLATION_MULTIPLE}×": ext["bpb_long"],
            "extrapolates": extrapolation_label(ext),
            "paper": cls.paper,
        })
    return rows


def bpb_vs_length_rows(metrics_by_name: Mapping[str, Mapping[str, Any]]) -> Columns:
    """Long-format rows of the headline chart: checkpoint, length, multiple, bpb (runs that exist)."""
    out: dict[str, list] = {"checkpoint": [], "length": [], "multiple": [], "bpb": []}
    for name, metrics in metrics_by_name.items():
        train = train_length_of(metrics)
        for n, bpb in bpb_by_length(metrics).items():
            if bpb is None:
                continue
            out["checkpoint"].append(name)
            out["length"].append(n)
            out["multiple"].append(n / train if train else float("nan"))
            out["bpb"].append(bpb)
    return {k: np.asarray(v) for k, v in out.items()}
