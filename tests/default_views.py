"""What every live lab shows at its default view on the shipped checkpoints, as numbers.

``fingerprint(page)`` runs the page's script (AppTest, the shipped ``models/``, the first held-out
document) and reads back what a visitor sees: every chart's data, every table, every metric, the
generated text, the coloured text. ``tests/test_default_views.py`` holds these to a record made before
the labs were moved onto the model interface (``tests/data/default_views.json``), so a refactor that
changes a number a user sees fails.

Run ``python tests/default_views.py`` to write the record again (only when a change is *meant* to
change what the labs show, and say so in the commit).
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


def _frame_summary(frame: pd.DataFrame) -> dict:
    frame = frame.reset_index(drop=True)
    return {str(c): _column_summary(frame[c]) for c in frame.columns if not TIMED.search(str(c))}


HTML_TITLE = re.compile(r'title="([^"]*)"')


def _html_summary(body: str) -> dict:
    """Coloured text: the hash of its markup with every tooltip blanked (the characters, their order, the
    marks), and the tooltips' numbers. The numbers are rounded to 0.01 on the page, so the last bit of a
    float that lands on x.xx5 flips one; ``test_default_views`` compares them to that rounding."""
    titles = HTML_TITLE.findall(body)
    values = [float("nan") if t == "not scored" else float(t.split()[0]) if t[:1].isdigit() or t[:1] == "-" else t
              for t in titles]
    return {"markup": hashlib.sha256(HTML_TITLE.sub('title=""', body).encode()).hexdigest()[:16], "values": values}


def _untimed(text: str) -> str:
    return TIMED_TEXT.sub("<t>", text)


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
    metrics = {m.label: _untimed(str(m.value)) for m in at.metric if not TIMED.search(m.label)}
    code = [str(c.value) for c in at.code]
    html = [_html_summary(h.proto.body) for h in at.get("html")]
    captions = [_untimed(str(c.value)) for c in at.caption]
    errors = [str(e.value) for e in at.error] + [str(w.value) for w in at.warning]
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


def record() -> dict:
    return {"text_sha": default_text_sha(), "python": sys.version.split()[0],
            "pages": {page: fingerprint(page) for page in LABS},
            "exports": {page: export_fingerprint(page) for page in LABS}}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD.relative_to(ROOT)}")
