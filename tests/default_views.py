"""What every live lab shows at its default view on the shipped checkpoints, as numbers.

``fingerprint(page)`` runs the page's script (AppTest, the shipped ``models/``, the first held-out
document) and reads back what a visitor sees: every chart's data and every table, summarised per model and
chart row (``ROW_NAMES``), every metric, the generated text, the coloured text. ``entries`` flattens that into
one entry per page, chart, row and column. ``tests/test_default_views.py`` holds the pages to the record
(``tests/data/default_views.json``) overlaid with the reviewed changes (``default_views_changes.json``), so a
change that moves a number a user sees fails until its reason is written down.

``python tests/default_views.py`` adds new entries (a new model, a new chart) and lists every changed one; it
writes changed entries only with ``--why "..."``, which is kept beside them.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "data" / "default_views.json"
LABS = ("extrapolation", "kv_cache", "context_extension", "retrieval", "generation", "compare")

# What changes from run to run on the same machine (wall-clock times and what is derived from them).
TIMED = re.compile(r"(^|\W)(ms|seconds?|milliseconds?|bytes/s|speed|time)(\W|$)", re.IGNORECASE)
TIMED_TEXT = re.compile(r"\d[\d,.]*\s*(ms|s|bytes/s|tokens/s|ids/s)\b|\d[\d,.]*\s*(ms|s)/(byte|token|id)")


def _column_summary(values: pd.Series) -> dict:
    """A few numbers that change when any value of a numeric column does (position-weighted sums
    catch a reordering), or the hash of a column of strings."""
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        x = values.to_numpy(dtype=float)
        finite = np.isfinite(x)
        v = np.where(finite, x, 0.0)
        weights = np.linspace(1.0, 2.0, len(x)) if len(x) else x
        return {"n": int(len(x)), "nan": int((~finite).sum()), "sum": float(v.sum()), "abs": float(np.abs(v).sum()),
                "weighted": float((v * weights).sum()), "min": float(v.min()) if len(v) else 0.0,
                "max": float(v.max()) if len(v) else 0.0}
    text = "\x1f".join("" if pd.isna(s) else str(s) for s in values.tolist())
    return {"n": int(len(values)), "sha": hashlib.sha256(text.encode()).hexdigest()[:16]}


# Columns that name what a row belongs to (a model, a curve, a strategy): a frame is summarised per value of
# these, so that the record holds one entry per model and chart row, and a retrained model moves its own.
ROW_NAMES = ("model", "checkpoint", "series", "curve", "scaling", "strategy", "probe", "source", "kind", "stage", "of",
             "what", "head", "pass", "unit")


def _frame_summary(frame: pd.DataFrame) -> dict:
    """{columns: the frame's naming columns (or all), rows: {row group: {column: summary}}}: the frame's rows grouped by
    the values of its naming columns (``ROW_NAMES`` with text in them), one group "" when it has none."""
    frame = frame.reset_index(drop=True)
    names = [c for c in frame.columns if str(c) in ROW_NAMES and not pd.api.types.is_numeric_dtype(frame[c])]
    columns = [c for c in frame.columns if not TIMED.search(str(c)) and c not in names]
    # a frame is named by its naming columns (a column added beside them keeps every old entry's key), or by all
    # its columns when it has none (a rule, a band)
    signature = ",".join(sorted(map(str, names or frame.columns)))
    if not names:
        return {"columns": signature, "rows": {"": {str(c): _column_summary(frame[c]) for c in columns}}}
    out = {}
    for values, rows in frame.groupby(names, sort=True, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        label = ",".join(f"{n}={'' if pd.isna(v) else v}" for n, v in zip(names, values))
        rows = rows.reset_index(drop=True)
        out[label] = {str(c): _column_summary(rows[c]) for c in columns}
    return {"columns": signature, "rows": out}


HTML_TITLE = re.compile(r'title="([^"]*)"')
HTML_MARK = re.compile(r"<span[^>]*></span>")  # an empty span: a mark drawn between characters (the training length)
HTML_BREAK = re.compile(r"<br\s*/?>")
HTML_TAG = re.compile(r"<[^>]+>")


def html_text(body: str) -> str:
    """Coloured text as a visitor reads it: its characters and line breaks, with "¦" where a mark stands between
    two of them; no styles, no colours."""
    import html

    return html.unescape(HTML_TAG.sub("", HTML_BREAK.sub("\n", HTML_MARK.sub("¦", body))))


def _html_summary(body: str) -> dict:
    """Coloured text by what it shows: the hash of its text (``html_text``: the characters, their order, the
    marks) and the tooltips' numbers, not a hash of its markup. A character's colour is drawn from its number, so
    the last float32 bit of a sum on another CPU's kernels can move one colour channel by one step without a
    change a visitor could see; the numbers are rounded to 0.01 on the page, and ``test_default_views``
    compares them to that rounding."""
    titles = HTML_TITLE.findall(body)
    values = [float("nan") if t == "not scored" else float(t.split()[0]) if t[:1].isdigit() or t[:1] == "-" else t
              for t in titles]
    return {"text": hashlib.sha256(html_text(body).encode()).hexdigest()[:16], "values": values}


def _untimed(text: str) -> str:
    return TIMED_TEXT.sub("<t>", text)


# A Markdown character after a backslash: how views._page.plain quotes a model's name ("rope\-neox") in a
# caption, a metric's label or an error box, where the visitor reads "rope-neox".
MARKDOWN_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()<>#+\-.!|~:$])")


def as_shown(text: str) -> str:
    """Markdown text as a visitor reads it: its backslash escapes removed."""
    return MARKDOWN_ESCAPE.sub(r"\1", text)


def fingerprint_of(at) -> dict:
    """Everything drawn on an AppTest page that does not depend on the wall clock."""
    charts = [_frame_summary(pa.ipc.open_stream(ds.data.data).read_pandas())
              for chart in at.get("vega_lite_chart") for ds in chart.proto.datasets]
    tables, heading = [], ""
    for node in at.main:  # in page order: a table under a heading about time holds times
        kind = type(node).__name__
        if kind in ("Markdown", "Subheader", "Header"):
            heading = str(node.value)
        elif kind == "Dataframe" and not TIMED.search(heading):
            tables.append(_frame_summary(node.value))
    metrics = {as_shown(m.label): _untimed(str(m.value)) for m in at.metric if not TIMED.search(m.label)}
    code = [str(c.value) for c in at.code]
    html = [_html_summary(h.proto.body) for h in at.get("html")]
    captions = [_untimed(as_shown(str(c.value))) for c in at.caption]
    errors = [as_shown(str(e.value)) for e in at.error] + [as_shown(str(w.value)) for w in at.warning]
    return {"charts": charts, "tables": tables, "metrics": metrics, "code": code, "html": html,
            "captions": captions, "errors": errors}


# The exports in models/hf (three shipped checkpoints as GPT-2, GPT-NeoX and BLOOM folders) listed as published
# models, and each lab opened on them by its link: the same views through transformers' forward and tokenizers.
EXPORTS = ",".join(str(ROOT / "models" / "hf" / name) for name in ("learned-gpt2", "rope-neox", "alibi-bloom"))
EXPORT_LINKS = {
    "extrapolation": {"models": "rope,rope-neox,alibi-bloom,learned-gpt2"},
    "kv_cache": {"models": "rope-neox,alibi-bloom"},
    "context_extension": {"base": "rope-neox", "refs": "alibi-bloom"},
    "retrieval": {"models": "rope-neox,alibi-bloom"},
    "generation": {"models": "rope-neox,learned-gpt2"},
    "compare": {"a": "rope", "b": "rope-neox"},
}


def fingerprint(page: str, link: dict | None = None, published: str | None = None) -> dict:
    """What ``page`` shows at its defaults, or opened by a ``link`` (query parameters) with ``published``
    models listed ($POSVIZ_MODELS)."""
    import os

    from streamlit.testing.v1 import AppTest

    before = os.environ.get("POSVIZ_MODELS")
    os.environ["POSVIZ_MODELS"] = published or ""
    try:
        at = AppTest.from_file(str(ROOT / "views" / f"{page}.py"), default_timeout=300)
        for key, value in (link or {}).items():
            at.query_params[key] = value
        at.run()
    finally:
        if before is None:
            os.environ.pop("POSVIZ_MODELS", None)
        else:
            os.environ["POSVIZ_MODELS"] = before
    assert not at.exception, [e.value for e in at.exception]
    return fingerprint_of(at)


def export_fingerprint(page: str) -> dict:
    return fingerprint(page, EXPORT_LINKS[page], EXPORTS)


def default_text_sha() -> str:
    """The held-out document the labs open on: the record holds for this text only."""
    from posviz.training.data import load_corpus

    return hashlib.sha256(load_corpus().eval_documents[0]).hexdigest()[:16]


# ---------------------------------------------------------------------------------------- the record
# The record (RECORD) holds one entry per page, chart or table, row group (a model, a curve) and column, as first
# recorded. A later change to an entry is kept apart, in CHANGES: groups of {why, entries: {key: value}} in the
# order they were made, each with the reason its numbers moved (null: the entry is gone). What a page must show is
# the record overlaid with every change group. New entries go into the record freely; a changed or vanished one
# only with a reason (``python tests/default_views.py --why "..."``), and the test fails on any other.
CHANGES = ROOT / "tests" / "data" / "default_views_changes.json"


def entries(fp: dict, where: str) -> dict:
    """A fingerprint as flat entries, ``where/part/.../column`` -> value (a summary dict, a string or a list)."""
    out = {}
    for part in ("charts", "tables"):
        seen: dict = {}
        for frame in fp.get(part, []):
            k = seen[frame["columns"]] = seen.get(frame["columns"], -1) + 1  # the k-th frame of these columns
            for group, columns in frame["rows"].items():
                for column, summary in columns.items():
                    out[f"{where}/{part[:-1]}[{frame['columns']}]#{k}/{group}/{column}"] = summary
    for label, value in fp.get("metrics", {}).items():
        out[f"{where}/metric/{label}"] = value
    for part in ("code", "html", "captions", "errors"):
        for i, value in enumerate(fp.get(part, [])):
            out[f"{where}/{part}#{i}"] = value
        if not fp.get(part):
            out[f"{where}/{part}"] = []  # none shown: an error box appearing is a change
    return out


def expected_entries() -> dict:
    """The record overlaid with every change group, in order: what the pages must show now."""
    expected = dict(json.loads(RECORD.read_text())["entries"]) if RECORD.is_file() else {}
    for change in (json.loads(CHANGES.read_text()) if CHANGES.is_file() else []):
        for key, value in change["entries"].items():
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value
    return expected


def review(expected: dict, shown: dict, differ) -> tuple[dict, dict]:
    """(new entries, changed or vanished entries as {key: (expected, shown or None)}) of ``shown`` against
    ``expected``; ``differ(a, b, key)`` lists how two values differ (empty when equal within tolerance)."""
    new = {k: v for k, v in shown.items() if k not in expected}
    changed = {k: (v, shown.get(k)) for k, v in expected.items() if k not in shown or differ(v, shown[k], k)}
    return new, changed


def shown_entries() -> dict:
    out = {}
    for page in LABS:
        out.update(entries(fingerprint(page), f"pages/{page}"))
        out.update(entries(export_fingerprint(page), f"exports/{page}"))
    return out


def main(argv=None) -> int:
    """Record what the labs show: new entries are added; changed ones only with ``--why``, else listed and refused."""
    import argparse

    from test_default_views import differences

    ap = argparse.ArgumentParser(description="Re-record the labs' default views (tests/data/default_views.json).")
    ap.add_argument("--why", help="why the changed entries moved (kept beside them in default_views_changes.json)")
    args = ap.parse_args(argv)
    record = json.loads(RECORD.read_text()) if RECORD.is_file() else {"entries": {}}
    if record.get("text_sha", default_text_sha()) != default_text_sha():
        print("The record was made on another interpreter's standard library; its numbers cannot be compared.")
        return 1
    shown = shown_entries()
    new, changed = review(expected_entries(), shown, lambda a, b, k: differences(a, b, k))
    for key, (was, now) in sorted(changed.items()):
        print(f"changed: {key}\n    recorded {json.dumps(was)[:200]}\n    shown    {json.dumps(now)[:200]}")
    print(f"{len(new)} new entries, {len(changed)} changed or vanished")
    if changed and not args.why:
        print("Not written: say why these entries moved with --why \"...\" (kept in "
              f"{CHANGES.name}), or fix what changed them.")
        return 1
    record = {**record, "text_sha": default_text_sha(), "python": sys.version.split()[0],
              "entries": {**record["entries"], **new}}  # "made": how the record was first made, kept
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    if changed:
        changes = json.loads(CHANGES.read_text()) if CHANGES.is_file() else []
        changes.append({"why": args.why, "entries": {k: now for k, (was, now) in sorted(changed.items())}})
        CHANGES.write_text(json.dumps(changes, indent=1) + "\n")
    print(f"wrote {RECORD.name}" + (f" and {CHANGES.name}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    sys.exit(main())
