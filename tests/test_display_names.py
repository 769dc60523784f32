"""Every page at its default view shows display names, never the registry ids behind them (#56).

An id (``transformer_xl``, ``rope+yarn``, ``rope-yarn-ft4x``, ``shifted_cache``) stays in links and in a CSV's "(id)" columns;
what a visitor reads is ``posviz.display.display_name``. The check reads what a page draws: its prose (markdown,
captions, titles, boxes), its tables (headers and cells), its widgets' options as shown, its metrics' labels,
and the values of every chart field a legend or colour encodes (from each chart's Vega-Lite spec and
datasets). Table headers and legend titles must be words, not column names (``norm_after``).

Each page runs once, at its defaults, on the shipped checkpoints in models/ (their names are the ids most
likely to leak); the checks themselves are unit-tested below on a page that shows ids on purpose.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from default_views import as_shown

from posviz.display import display_name, known_ids

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("home", "sinusoidal_learned", "rope", "attention_biases", "content_positions", "extrapolation", "kv_cache",
         "context_extension", "retrieval", "generation", "compare", "workshop", "about", "scoreboard")

# Ids that are also English words: in prose they are words ("a linear scaling", "a string", "stop"), so only a
# cell, an option or a legend value that is exactly one of them counts there.
WORDS = {"linear", "string", "stop", "shift", "streaming", "dynamic", "none", "learned", "sinusoidal", "path"}
COLUMN_NAME = re.compile(r"^[a-z][a-z0-9]+(_[a-z][a-z0-9]+)+$")  # norm_after, first_feature: a column's name (a_d is maths)
LEGEND_CHANNELS = ("color", "fill", "stroke", "strokeDash", "shape")


def _id_pattern(ids) -> re.Pattern:
    # an id as a token of its own: not inside a longer id or word ("rope" in "rope-ft4x" is that other id's part)
    alternatives = "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True))
    return re.compile(rf"(?<![\w+\-/])({alternatives})(?![\w+\-/]|\.\w)")


CODE = re.compile(r"```.*?```|`[^`]*`", re.DOTALL)  # a command or a link to type: ids are what it takes
LONE_CODE = re.compile(r"`([^`\s]+)`")  # a code span holding one token: a name in code type ("What the `t5` checkpoint")
README = (ROOT / "README.md").read_text(encoding="utf-8")  # the About page shows it whole: a developers' document


def ids_in_text(text: str, ids: dict[str, str]) -> list[str]:
    """The ids in prose (commands in code spans aside): every id token but those that are also words, and an id
    alone in a code span (a heading's "the `t5` checkpoint" names a checkpoint in code type, not a command)."""
    shown = as_shown(str(text))
    lone = [m for m in LONE_CODE.findall(shown) if m in ids]
    return lone + _id_pattern([i for i in ids if i not in WORDS]).findall(CODE.sub("", shown))


def id_value(value, ids: dict[str, str]) -> str | None:
    """``value`` when it is an id exactly (a cell, an option, a legend's value), else an id in it as prose."""
    text = as_shown(str(value)).strip()
    if text in ids:
        return text
    found = ids_in_text(text, ids)
    return found[0] if found else None


def _legend_fields(spec: dict) -> list[tuple[str, str]]:
    """(field, legend title) of every channel a legend or colour encodes, anywhere in a (layered) spec."""
    out = []
    if isinstance(spec, dict):
        for channel, enc in (spec.get("encoding") or {}).items():
            if channel in LEGEND_CHANNELS and isinstance(enc, dict) and enc.get("field"):
                legend = enc.get("legend", {})
                # Vega-Lite titles a legend with the legend's title, else the channel's, else the field's name
                title = (None if legend is None else legend["title"] if "title" in legend
                         else enc["title"] if "title" in enc else enc["field"])
                out.append((enc["field"], title))
        for value in spec.values():
            if isinstance(value, (dict, list)):
                out += _legend_fields(value)
    elif isinstance(spec, list):
        for value in spec:
            out += _legend_fields(value)
    return out


def chart_findings(spec: dict, frames: list[pd.DataFrame], ids: dict[str, str]) -> list[str]:
    found = []
    for field, title in _legend_fields(spec):
        if isinstance(title, str) and COLUMN_NAME.match(title):
            found.append(f"legend title {title!r}")
        for frame in frames:
            if field in frame.columns:
                # a legend's value is a word or a name, not an id nor a column's name ("norm_after")
                found += [f"legend value {v!r} of {field!r}" for v in frame[field].dropna().unique()
                          if isinstance(v, str) and (id_value(v, ids) or COLUMN_NAME.match(v))]
    return found


def table_findings(frame: pd.DataFrame, ids: dict[str, str]) -> list[str]:
    found = [f"header {c!r}" for c in frame.columns if COLUMN_NAME.match(str(c)) or id_value(c, ids)]
    index = [] if isinstance(frame.index, pd.RangeIndex) else list(frame.index)
    for value in index + [v for c in frame.columns for v in frame[c].tolist()]:
        if isinstance(value, str) and id_value(value, ids):
            found.append(f"cell {value!r}")
    return found


def findings(at, ids: dict[str, str] | None = None) -> list[str]:
    """Every id an AppTest page shows where its display name belongs, as "where: what"."""
    ids = known_ids() if ids is None else ids
    out = []
    for kind in ("markdown", "caption", "title", "header", "subheader", "info", "warning", "success", "error"):
        for element in at.get(kind):
            if str(element.value).strip() == README.strip():
                continue
            out += [f"{kind}: {i!r} in {str(element.value)[:80]!r}" for i in ids_in_text(element.value, ids)]
    for kind in ("selectbox", "multiselect", "radio", "select_slider"):
        for widget in at.get(kind):
            out += [f"{kind} {widget.label!r}: option {o!r}" for o in widget.options if id_value(o, ids)]
            out += [f"{kind} label: {i!r}" for i in ids_in_text(widget.label, ids)]
    for metric in at.metric:
        out += [f"metric label {metric.label!r}" for i in ids_in_text(metric.label, ids)]
    for table in at.dataframe:
        out += [f"table: {f}" for f in table_findings(table.value, ids)]
    for table in at.table:
        out += [f"table: {f}" for f in table_findings(table.value, ids)]
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        frames = [pa.ipc.open_stream(ds.data.data).read_pandas() for ds in chart.proto.datasets]
        out += [f"chart: {f}" for f in chart_findings(spec, frames, ids)]
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------------------------------------
# the detector, on what it must and must not catch
# ------------------------------------------------------------------------------------------------
IDS = {"transformer_xl": "Transformer-XL", "rope": "RoPE", "rope+yarn": "RoPE + YaRN", "string": "STRING",
       "rope-yarn-ft4x": "RoPE + YaRN, fine-tuned at 4×", "p_rope": "p-RoPE"}


def test_the_detector_catches_column_names_as_legend_values_and_an_id_alone_in_code_type():
    spec = {"mark": "line", "encoding": {"color": {"field": "vector", "type": "nominal", "title": None}}}
    frame = pd.DataFrame({"vector": ["norm_before", "norm_after"]})
    assert chart_findings(spec, [frame], IDS) == ["legend value 'norm_before' of 'vector'", "legend value 'norm_after' of 'vector'"]
    assert not chart_findings(spec, [pd.DataFrame({"vector": ["before rotation", "after rotation"]})], IDS)
    assert ids_in_text("What the `p_rope` checkpoint learned", IDS) == ["p_rope"]
    assert ids_in_text("run `python -m posviz.train --method p_rope`", IDS) == []


def test_the_detector_catches_ids_in_prose_cells_and_legends():
    assert ids_in_text("the transformer\\_xl checkpoint beside rope\\-yarn\\-ft4x", IDS) == ["transformer_xl",
                                                                                           "rope-yarn-ft4x"]
    assert ids_in_text("RoPE + YaRN, p-RoPE and Transformer-XL; a string", IDS) == []  # names, and a word
    assert ids_in_text("open ?models=rope+yarn", IDS) == ["rope+yarn"]  # a URL in prose is prose too
    assert id_value("string", IDS) == "string" and id_value("STRING", IDS) is None
    table = pd.DataFrame({"checkpoint": ["RoPE", "p_rope"], "norm_after": [1.0, 2.0]})
    assert table_findings(table, IDS) == ["header 'norm_after'", "cell 'p_rope'"]
    spec = {"layer": [{"encoding": {"color": {"field": "model", "type": "nominal", "title": "checkpoint"},
                                    "x": {"field": "first_feature"}}},
                      {"encoding": {"strokeDash": {"field": "bidirectional_after", "type": "nominal"}}}]}
    frame = pd.DataFrame({"model": ["RoPE", "rope+yarn"], "bidirectional_after": ["a", "b"], "first_feature": [1, 2]})
    assert chart_findings(spec, [frame], IDS) == ["legend value 'rope+yarn' of 'model'",
                                                  "legend title 'bidirectional_after'"]


def test_the_registry_names_every_id_it_lists():
    ids = known_ids()
    assert {"transformer_xl", "p_rope", "self_extend", "dca", "string", "stick_breaking", "rope+yarn",
            "rope-yarn-ft4x", "shifted_cache", "reencode"} <= set(ids)
    assert display_name("rope-yarn-ft4x") == "RoPE + YaRN, fine-tuned at 4×"
    # recalibrated without the positions its base was trained with: named for what was done, not "NoPE, fine-tuned"
    assert display_name("rope-drope") == "DroPE (from RoPE)"
    assert display_name("rope+dca") == "RoPE + dual chunk attention"
    assert display_name("shift") == display_name("shifted_cache")  # one strategy, one name on both labs
    assert display_name("openai-community/gpt2") == "openai-community/gpt2"  # a published model: its hub id


# ------------------------------------------------------------------------------------------------
# every page at its default view
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ids():
    return known_ids()


@pytest.mark.parametrize("page", PAGES)
def test_page_shows_display_names(page, ids, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("POSVIZ_MODELS", "")  # the shipped checkpoints alone: the ids that could leak are ours
    assert findings(open_page(page), ids) == []


def open_page(page: str):
    """The app (menu.py, so that a page's links resolve), switched to ``page`` at its defaults."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "menu.py"), default_timeout=300)
    at.run()
    at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_a_csv_shows_display_names_and_keeps_each_id_in_a_column_beside():
    from posviz.display import for_export

    table = pd.DataFrame({"length": [256, 512], "scaling": ["none", "self_extend"], "bpb": [1.2, 1.3],
                          "series": ["rope+yarn", "HuggingFaceTB/SmolLM2-135M"], "status": ["kept", "zeroed"]})
    out = for_export(table)
    assert list(out.columns) == ["length", "scaling", "scaling (id)", "bpb", "series", "series (id)", "status"]
    assert out["scaling"].tolist() == [display_name("none"), display_name("self_extend")] == ["no scaling", "Self-Extend"]
    assert out["scaling (id)"].tolist() == ["none", "self_extend"]
    assert out["series"].tolist() == [display_name("rope+yarn"), "HuggingFaceTB/SmolLM2-135M"]  # a hub id is its own name
    assert table["scaling"].tolist() == ["none", "self_extend"]  # the page's own table is left as it was


def test_every_csv_a_page_offers_is_written_with_display_names(ids, monkeypatch):
    """Every download goes through ``views._charts.csv_bytes``; on the Context extension page (the "none" and
    "self_extend" a visitor found in its CSVs) no cell outside an "(id)" column is an id."""
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "views").rglob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1) if ".to_csv(" in line]
    assert offenders == ["views/_charts.py:" + str(next(i for i, line in enumerate(
        (ROOT / "views/_charts.py").read_text().splitlines(), 1) if ".to_csv(" in line))], offenders
    from views import _charts

    written = []
    own = _charts.csv_bytes
    monkeypatch.setattr(_charts, "csv_bytes", lambda data, index=False: written.append(own(data, index)) or written[-1])
    monkeypatch.setenv("POSVIZ_MODELS", "")
    open_page("context_extension")
    assert written, "the page wrote no CSV"
    found = []
    for csv in written:
        table = pd.read_csv(io.BytesIO(csv))
        for column in table.columns:
            if not column.endswith("(id)"):
                found += [f"{column}: {v}" for v in table[column].dropna().unique() if isinstance(v, str) and v in ids]
    assert not found, found
    assert any(b"Self-Extend" in csv or b"no scaling" in csv for csv in written)
