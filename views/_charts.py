"""Charts: every chart gets its data as CSV; Altair's own menu (…) saves PNG and SVG. Also the pieces
the pages build charts from (method colours and dashes, legends, axis titles) and rows of metrics.
"""
from __future__ import annotations

import copy
import time
from typing import Sequence

import altair as alt
import pandas as pd
import streamlit as st

from posviz.display import for_export
from views import _slide as slide
from views._serving import shared


def csv_file(data: pd.DataFrame, index: bool = False):
    """The CSV of ``data``, written when the visitor clicks its download button, not on every run:
    a 4,096-byte page's tables took 0.8 s a run to write out as CSV that nobody had asked for."""
    return lambda: csv_bytes(data, index)


def csv_bytes(data: pd.DataFrame, index: bool = False) -> bytes:
    """Every CSV a page offers: ids shown by their display names, each id column kept beside (``for_export``)."""
    return for_export(data).to_csv(index=index).encode()


def show_chart(chart: alt.Chart, data: pd.DataFrame, name: str, caption: str | None = None,
               says: str | None = None) -> None:
    """``chart`` with its data as CSV and a Slide button; on a slide (``views._slide``) the chart alone, large.
    ``says``: one sentence, from the data, of what the chart shows (a slide's line under it; else ``caption``), or a
    function that writes it: called only when the chart is a slide's, not on every visitor's run."""
    # Streamlit stretches every view of a vertically concatenated chart to the column's width and then
    # adds its axis and legend, so the chart spills past the column's right edge and its legend is cut
    # off. Each view is drawn as a chart of its own instead, one under the other; a y-axis of a fixed
    # minimum width keeps their x-axes aligned.
    parts = chart.vconcat if isinstance(chart, alt.VConcatChart) else [chart]
    if slide.claims(name):
        specs = [_spec_and_data(part.configure_axisY(minExtent=48) if len(parts) > 1 else part, None)[0]
                 for part in parts]
        _draw_slide(specs, name, says, caption)
        return
    for part in parts:
        st.altair_chart(part.configure_axisY(minExtent=48) if len(parts) > 1 else part, width="stretch")
    _chart_row(csv_file(data), name, caption)


def _chart_row(csv, name: str, caption: str | None) -> None:
    # A row that wraps (not fixed columns): in a narrow column a fifth of the width cut the button's label.
    row = st.container(horizontal=True, vertical_alignment="center")
    row.download_button("Data (CSV)", csv, file_name=f"{name}.csv",
                        mime="text/csv", key=f"csv-{name}", width="content", on_click="ignore")
    row.button("Slide", key=f"to-slide-{name}", on_click=slide.enter, args=(name,), type="tertiary",
               help="This chart alone, large, as a slide for a talk (presentation mode), with its PNG at "
                    "1920×1080 and 1280×720.")
    row.caption((caption + "  ·  " if caption else "") + "Save the chart as PNG or SVG from its ⋯ menu.")


def _draw_slide(specs: list[dict], name: str, says, caption: str | None, width: str = "stretch") -> None:
    """The slide's chart: its views large with fonts a hall can read, the sentence under it, and the slide's PNG
    buttons in the slide's head. ``says``: the sentence, or the function that writes it; else the ``caption``."""
    from views._quote import plain

    sentence = (says() if callable(says) else says) or caption
    with st.container(key=slide.container_key(name)):
        for spec in specs:
            draw_spec(slide.slide_spec(spec, len(specs)), width)
        if sentence:
            st.markdown(plain(sentence))
    slide.offer_png(specs, name, sentence)


def show_cached_chart(key: tuple, build, name: str, caption: str | None = None, width: str = "stretch",
                      says: str | None = None) -> None:
    """``show_chart`` of the (chart, data) that ``build()`` makes, built once per server for ``key``.

    ``key`` must hold everything the chart depends on. Building an Altair chart and writing its
    Vega-Lite spec (with the schema checks Altair runs) took 0.1–0.4 s a chart on every run, for
    every visitor; the spec is kept with its datasets already in Arrow, as Streamlit sends them.
    A vertically concatenated chart is kept as its views, drawn one under the other (see ``show_chart``).
    Its data is kept as the CSV the download button offers (a plain value the result files can hold).
    """
    specs, csv = shared("chart", key, lambda: _specs_of(*build()))
    show_specs(specs, csv, name, caption, width, says)


def show_specs(specs: list[dict], csv, name: str, caption: str | None = None, width: str = "stretch",
               says: str | None = None) -> None:
    """Vega-Lite specs drawn one under the other with their CSV (bytes, or a function that writes it) and a Slide
    button; on a slide, drawn large alone (see ``show_chart``)."""
    if slide.claims(name):
        _draw_slide(specs, name, says, caption, width)
        return
    for spec in specs:
        draw_spec(spec, width)
    _chart_row(csv, name, caption)


def _specs_of(chart: alt.TopLevelMixin, data: pd.DataFrame) -> tuple[list[dict], bytes]:
    parts = chart.vconcat if isinstance(chart, alt.VConcatChart) else [chart]
    return [_spec_and_data(part.configure_axisY(minExtent=48) if len(parts) > 1 else part, None)[0]
            for part in parts], csv_bytes(data)


def draw_spec(spec: dict, width: str = "stretch") -> None:
    """A stored Vega-Lite spec on the page (Streamlit moves the datasets out of the spec it is given,
    so it gets a copy); ``width="content"`` keeps a chart of fixed size (a square) as it is."""
    st.vega_lite_chart(spec={**copy.deepcopy({k: v for k, v in spec.items() if k != "datasets"}),
                             "datasets": dict(spec.get("datasets", {}))}, width=width)


def cached_spec(key: tuple, build) -> dict:
    """The Vega-Lite spec of the chart ``build()`` makes, built once per server for ``key``."""
    return shared("chart", key, lambda: _spec_and_data(build(), None))[0]


def _spec_and_data(chart: alt.TopLevelMixin, data: pd.DataFrame | None) -> tuple[dict, pd.DataFrame | None]:
    import pyarrow as pa

    with alt.data_transformers.enable("default", max_rows=None):
        spec = chart.to_dict(validate=False)
    datasets = {}
    for name, records in spec.get("datasets", {}).items():
        table = pa.Table.from_pandas(pd.DataFrame.from_records(records), preserve_index=False)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        datasets[name] = sink.getvalue().to_pybytes()
    if datasets:
        spec["datasets"] = datasets
    return spec, data


def metric_cells(n: int, per_row: int = 4) -> list:
    """``n`` empty cells for metrics, at most ``per_row`` to a row and rows of even length (eleven at
    most 5 a row: 4, 4, 3): eleven in one row cut their labels and values to "2.0…" at 1366 px. A page
    that streams its results fills each cell as its number arrives."""
    rows = max(1, -(-n // per_row))
    per_row = max(1, -(-n // rows))
    cells = []
    for start in range(0, n, per_row):
        cells += st.columns(per_row)[: min(per_row, n - start)]
    return cells


def metric_rows(items: Sequence[dict], per_row: int = 4) -> None:
    """``st.metric`` for each dict of its arguments, in the rows of ``metric_cells``."""
    for cell, item in zip(metric_cells(len(items), per_row), items):
        cell.metric(**item)


# A legend of line samples, for lines told apart by dash: the default symbol of a line with points is a
# circle, which draws the dash pattern as a blob.
# While live results arrive one by one, a page redraws its chart with those so far at most once a REDRAW_S: each
# redraw builds the whole chart (about 0.15 s on 2 cores), which after every result was a third of a first visit.
REDRAW_S = 1.0


class RedrawClock:
    """When a chart that fills as live results arrive may be drawn again: at most once a ``REDRAW_S``."""

    def __init__(self):
        self._last = time.perf_counter()

    def due(self) -> bool:
        now = time.perf_counter()
        if now - self._last <= REDRAW_S:
            return False
        self._last = now
        return True

# A key of lines long enough to show a dash pattern (YaRN's short dashes drew a smudge in the default 100-px² symbol).
DASHED_LEGEND = alt.Legend(symbolType="stroke", symbolStrokeWidth=2.5, symbolSize=500)


def legend_for(n_series: int, **options) -> alt.Legend:
    """A legend beside the chart that lists every series: past 8 entries in two columns and past 16 in three,
    since a column of more than about 9 (30 px each) is taller than a 280-300 px chart and Vega cuts the rest off.
    Labels up to 260 px: Vega's 160 cut a display name ("RoPE + dual chunk attent…")."""
    # past 16 entries (three columns) labels up to 150 px: three columns of 260 ran past the right edge at 1366 px
    return alt.Legend(**{"columns": 1 if n_series <= 8 else 2 if n_series <= 16 else 3,
                         "labelLimit": 260 if n_series <= 16 else 150, **options})


def split_title(title: str, width: int = 32) -> str | list[str]:
    """An axis title on two lines when it is longer than ``width`` characters (a y title longer than
    its chart is cut at both ends)."""
    if len(title) <= width:
        return title
    middle = len(title) // 2
    spaces = [i for i, c in enumerate(title) if c == " "]
    if not spaces:
        return title
    cut = min(spaces, key=lambda i: abs(i - middle))
    return [title[:cut], title[cut + 1:]]


def named(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """``df`` with the ids in ``columns`` (methods, checkpoints, scalings, remaps, strategies) as their display names
    (``posviz.display``): what a legend, a table or a tooltip shows. A published model's hub id stays as it is."""
    from posviz.display import display_names

    # each distinct id looked up once (a checkpoint's name reads its config's stamp), not once per row
    shown = {}
    for c in columns:
        if c in df.columns:
            names = display_names(map(str, df[c].unique()))
            shown[c] = df[c].map(lambda v, names=names: names[str(v)])
    return df.assign(**shown)


def method_scales(names: Sequence[str], aliases: dict[str, str] | None = None) -> tuple[alt.Scale, alt.Scale]:
    """(colour, dash) scales for series named after methods, from ``posviz.palette`` (one colour per
    method on every page). ``aliases``: {shown label: palette name}, e.g. {"linear": "rope+linear"}; a display name
    (``posviz.display``: "RoPE + YaRN") finds its id's colour without one."""
    from posviz import palette
    from posviz.display import ids_by_name

    aliases = {**ids_by_name(), **(aliases or {})}
    shown = list(dict.fromkeys(names))
    by_palette = {aliases.get(n, n): n for n in shown}
    order = [by_palette[n] for n in palette.ordered(by_palette)]
    colours = [palette.colour(aliases.get(n, n)) for n in order]
    dashes = [palette.dash(aliases.get(n, n)) for n in order]
    return alt.Scale(domain=order, range=colours), alt.Scale(domain=order, range=dashes)
