"""UI helpers shared by the page scripts: sidebar, URL state, chart export, matrix display.

No maths here: numbers come from ``posviz``. Everything a user types is shown as text, never as HTML.
"""
from __future__ import annotations

import copy
import io
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from posviz.checkpoint import read_metrics, shipped_checkpoints
from posviz.errors import PosvizError
from posviz.limits import CACHE_ENTRIES, device_label

# Larger prose in the main area only (st.markdown's paragraphs and lists): enlarging every text also
# cut the sidebar's menu entries, widget options and metric labels in their columns.
PRESENTATION_CSS = """
<style>
[data-testid="stMain"] [data-testid="stMarkdown"] p,
[data-testid="stMain"] [data-testid="stMarkdown"] li { font-size: 1.25rem !important; }
[data-testid="stMain"] h1 { font-size: 3rem !important; } [data-testid="stMain"] h2 { font-size: 2.2rem !important; }
[data-testid="stToolbar"], [data-testid="stDecoration"], footer { display: none !important; }
</style>
"""


# ---------------------------------------------------------------------------------------------
# URL query-string state: every widget reads its default from the URL and writes its value back,
# so a link reproduces the view. Junk values fall back to the default with a notice.
# ---------------------------------------------------------------------------------------------
def _notice_junk(key: str, raw: str, default) -> None:
    # The value sits in a code span, so a link's text can never become Markdown (images, links, colours).
    shown = repr(raw[:40]).replace("`", "'")
    message = f"Ignored URL parameter {key}=`{shown}`; using the default `{default!r}`."
    slot = st.session_state.get("_url_notice_slot")
    if slot is None:  # before page_header has drawn the title: shown by page_header
        st.session_state.setdefault("_url_notices", []).append(message)
    else:  # parameters read by the page body: shown right under the title, in this same run
        slot.warning(message, icon="⚠️")


def qp_int(key: str, default: int, lo: int, hi: int) -> int:
    raw = st.query_params.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        _notice_junk(key, raw, default)
        return default
    if not lo <= value <= hi:
        _notice_junk(key, raw, default)
        return default
    return value


def qp_float(key: str, default: float, lo: float, hi: float) -> float:
    raw = st.query_params.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        _notice_junk(key, raw, default)
        return default
    if not (lo <= value <= hi) or value != value:
        _notice_junk(key, raw, default)
        return default
    return value


def qp_choice(key: str, default: str, options: Sequence[str]) -> str:
    raw = st.query_params.get(key)
    if raw is None:
        return default
    if raw not in options:
        _notice_junk(key, raw, default)
        return default
    return raw


def qp_multi(key: str, default: Sequence[str], options: Sequence[str]) -> list[str]:
    raw = st.query_params.get_all(key)
    if not raw:
        return list(default)
    values = [r for part in raw for r in part.split(",") if r]
    good = [v for v in values if v in options]
    if len(good) != len(values) or not good:
        _notice_junk(key, ",".join(values), list(default))
        return list(default) if not good else good
    return good


def qp_bool(key: str, default: bool) -> bool:
    raw = st.query_params.get(key)
    if raw is None:
        return default
    if raw not in ("0", "1", "true", "false"):
        _notice_junk(key, raw, default)
        return default
    return raw in ("1", "true")


def sync_url(**values) -> None:
    """Write the current widget values to the URL (lists comma-joined, booleans as 0/1)."""
    for key, value in values.items():
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        text = str(value)
        if st.query_params.get(key) != text:
            st.query_params[key] = text


def show_url_notices() -> None:
    """Notices so far, and a slot under the title for those of the parameters the page reads later."""
    slot = st.container()
    for message in st.session_state.pop("_url_notices", []):
        slot.warning(message, icon="⚠️")
    st.session_state["_url_notice_slot"] = slot


# ---------------------------------------------------------------------------------------------
# Page frame
# ---------------------------------------------------------------------------------------------
@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
def _checkpoint_summary(folders: tuple[tuple[str, str], ...], stamps: tuple) -> pd.DataFrame:
    rows = []
    for name, folder in folders:
        try:
            m = read_metrics(folder)
            rows.append({"checkpoint": name, "val bits/byte @ train length": m.get("val_bpb_at_train_length"),
                         "parameters": m.get("parameters")})
        except PosvizError as exc:
            rows.append({"checkpoint": name, "val bits/byte @ train length": None, "parameters": None,
                         "problem": str(exc)})
    return pd.DataFrame(rows)


def checkpoint_summary() -> pd.DataFrame:
    """Validation bpb and size of every shipped checkpoint; recomputed when the models folder
    (``$POSVIZ_MODELS``) or any of its files change."""
    folders = tuple((name, str(folder)) for name, folder in shipped_checkpoints().items())
    return _checkpoint_summary(folders, tuple(folder_stamp(folder) for _, folder in folders))


def page_header(title: str, intro: str) -> None:
    """Title, intro, the shared sidebar, presentation mode and any URL notices."""
    st.session_state.pop("_url_notice_slot", None)  # the previous run's slot is gone
    presentation = st.sidebar.toggle("Presentation mode", value=qp_bool("present", False),
                                     help="Larger fonts and less chrome, for screenshots and talks.")
    sync_url(present=presentation)
    if presentation:
        st.html(PRESENTATION_CSS)  # our own constant stylesheet, never user text
    st.sidebar.markdown(f"**Device:** {device_label()}")
    summary = checkpoint_summary()
    if summary.empty:
        st.sidebar.warning("No checkpoints found in models/. Run `make checkpoints` to train them.")
    else:
        st.sidebar.markdown("**Shipped checkpoints**")
        # Short header: the sidebar's default width cut the full one to "val bits/byte @ train lengt".
        st.sidebar.dataframe(summary[["checkpoint", "val bits/byte @ train length"]], hide_index=True, width="stretch", height="content",
                             column_config={"val bits/byte @ train length": st.column_config.NumberColumn(
                                 "val bits/byte", format="%.3f",
                                 help="Validation bits per byte at the training length (lower is better).")})
    st.title(title)
    if not presentation:
        st.caption(intro)
    show_url_notices()


# ---------------------------------------------------------------------------------------------
# Charts: every chart gets its data as CSV; Altair's own menu (…) saves PNG and SVG.
# ---------------------------------------------------------------------------------------------
def csv_file(data: pd.DataFrame, index: bool = False):
    """The CSV of ``data``, written when the visitor clicks its download button, not on every run:
    a 4,096-byte page's tables took 0.8 s a run to write out as CSV that nobody had asked for."""
    return lambda: data.to_csv(index=index).encode()


def show_chart(chart: alt.Chart, data: pd.DataFrame, name: str, caption: str | None = None) -> None:
    # Streamlit stretches every view of a vertically concatenated chart to the column's width and then
    # adds its axis and legend, so the chart spills past the column's right edge and its legend is cut
    # off. Each view is drawn as a chart of its own instead, one under the other; a y-axis of a fixed
    # minimum width keeps their x-axes aligned.
    parts = chart.vconcat if isinstance(chart, alt.VConcatChart) else [chart]
    for part in parts:
        st.altair_chart(part.configure_axisY(minExtent=48) if len(parts) > 1 else part, width="stretch")
    # A row that wraps (not fixed columns): in a narrow column a fifth of the width cut the button's label.
    row = st.container(horizontal=True, vertical_alignment="center")
    row.download_button("Data (CSV)", csv_file(data), file_name=f"{name}.csv",
                        mime="text/csv", key=f"csv-{name}", width="content", on_click="ignore")
    row.caption((caption + "  ·  " if caption else "") + "Save the chart as PNG or SVG from its ⋯ menu.")


def show_cached_chart(key: tuple, build, name: str, caption: str | None = None) -> None:
    """``show_chart`` of the (chart, data) that ``build()`` makes, built once per server for ``key``.

    ``key`` must hold everything the chart depends on. Building an Altair chart and writing its
    Vega-Lite spec (with the schema checks Altair runs) took 0.1–0.4 s a chart on every run, for
    every visitor; the spec is kept with its datasets already in Arrow, as Streamlit sends them.
    """
    spec, data = shared("chart", key, lambda: _spec_and_data(*build()))
    draw_spec(spec)
    row = st.container(horizontal=True, vertical_alignment="center")
    row.download_button("Data (CSV)", csv_file(data), file_name=f"{name}.csv",
                        mime="text/csv", key=f"csv-{name}", width="content", on_click="ignore")
    row.caption((caption + "  ·  " if caption else "") + "Save the chart as PNG or SVG from its ⋯ menu.")


def draw_spec(spec: dict) -> None:
    """A stored Vega-Lite spec on the page (Streamlit moves the datasets out of the spec it is given,
    so it gets a copy)."""
    st.vega_lite_chart(spec={**copy.deepcopy({k: v for k, v in spec.items() if k != "datasets"}),
                             "datasets": dict(spec.get("datasets", {}))}, width="stretch")


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
DASHED_LEGEND = alt.Legend(symbolType="stroke", symbolStrokeWidth=2.5)


def legend_for(n_series: int, **options) -> alt.Legend:
    """A legend beside the chart that lists every series: past 8 entries in two columns, since one
    column of 14 (30 px each) is taller than a 300 px chart and Vega cuts the rest off."""
    return alt.Legend(columns=2 if n_series > 8 else 1, **options)


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


def method_scales(names: Sequence[str], aliases: dict[str, str] | None = None) -> tuple[alt.Scale, alt.Scale]:
    """(colour, dash) scales for series named after methods, from ``posviz.palette`` (one colour per
    method on every page). ``aliases``: {shown label: palette name}, e.g. {"linear": "rope+linear"}."""
    from posviz import palette

    aliases = aliases or {}
    shown = list(dict.fromkeys(names))
    by_palette = {aliases.get(n, n): n for n in shown}
    order = [by_palette[n] for n in palette.ordered(by_palette)]
    colours = [palette.colour(aliases.get(n, n)) for n in order]
    dashes = [palette.dash(aliases.get(n, n)) for n in order]
    return alt.Scale(domain=order, range=colours), alt.Scale(domain=order, range=dashes)


ALTAIR_MAX_CELLS = 256 * 256


def _colour_legend(scheme: str, lo: float, hi: float) -> str:
    """How a PNG map's colours read, for its caption (``_colorize`` draws red-blue centred on 0)."""
    if scheme == "viridis":
        return f"from {lo:.3g} (dark) to {hi:.3g} (bright)"
    return f"blue below 0, white at 0, red above (range {lo:.3g} to {hi:.3g})"


def _colorize(matrix: np.ndarray, scheme: str = "viridis") -> np.ndarray:
    """(h, w) floats to (h, w, 3) uint8 with a perceptual colour ramp; NaN (masked) is light grey."""
    ramps = {
        "viridis": [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)],
        "redblue": [(33, 102, 172), (146, 197, 222), (247, 247, 247), (244, 165, 130), (178, 24, 43)],
    }
    stops = np.array(ramps[scheme], dtype=float)
    finite = np.isfinite(matrix)
    lo, hi = (np.nanmin(matrix[finite]), np.nanmax(matrix[finite])) if finite.any() else (0.0, 1.0)
    if scheme == "redblue":  # diverging: white is 0, so the sign of a difference or weight reads at a glance
        lo, hi = -max(abs(lo), abs(hi)), max(abs(lo), abs(hi))
    t = np.zeros_like(matrix, dtype=float) if hi == lo else (np.nan_to_num(matrix, nan=lo) - lo) / (hi - lo)
    x = t * (len(stops) - 1)
    i = np.clip(x.astype(int), 0, len(stops) - 2)
    frac = (x - i)[..., None]
    rgb = stops[i] * (1 - frac) + stops[i + 1] * frac
    rgb[~finite] = (230, 230, 230)
    return rgb.astype(np.uint8)


def downsample(matrix: np.ndarray, max_side: int) -> tuple[np.ndarray, int]:
    """Block-mean down to at most ``max_side`` per side; returns the matrix and the block size."""
    h, w = matrix.shape
    block = max(1, int(np.ceil(max(h, w) / max_side)))
    if block == 1:
        return matrix, 1
    H, W = -(-h // block) * block, -(-w // block) * block
    padded = np.full((H, W), np.nan)
    padded[:h, :w] = matrix
    with np.errstate(all="ignore"):
        out = np.nanmean(padded.reshape(H // block, block, W // block, block), axis=(1, 3))
    return out, block


def show_matrix(matrix: np.ndarray, name: str, x_title: str, y_title: str, value_title: str,
                scheme: str = "viridis", marks: Sequence[int] = (), mark_label: str = "") -> None:
    """A matrix as an Altair heatmap with tooltips when small, else as a downsampled image.

    Altair in the browser takes minutes at 2048² and fails at 4096², so large matrices are
    block-averaged to at most 512 px a side and drawn as a PNG with the axes stated in the caption.
    ``marks``: rows/columns to outline (e.g. the training length).
    """
    matrix = np.asarray(matrix, dtype=float)
    h, w = matrix.shape
    if h * w <= ALTAIR_MAX_CELLS:
        df = pd.DataFrame({"row": np.repeat(np.arange(h), w), "col": np.tile(np.arange(w), h), "value": matrix.ravel()})
        plot = df.dropna()
        chart = alt.Chart(plot).mark_rect().encode(
            x=alt.X("col:O", title=x_title, axis=alt.Axis(labelOverlap=True, values=list(range(0, w, max(1, w // 16))))),
            y=alt.Y("row:O", title=y_title, axis=alt.Axis(labelOverlap=True, values=list(range(0, h, max(1, h // 16))))),
            color=alt.Color("value:Q", title=value_title,
                            scale=alt.Scale(scheme="redblue", reverse=True, domainMid=0) if scheme == "redblue"
                            else alt.Scale(scheme="viridis")),
            tooltip=[alt.Tooltip("row:O", title=y_title), alt.Tooltip("col:O", title=x_title),
                     alt.Tooltip("value:Q", title=value_title, format=".4g")],
        ).properties(height=min(520, max(220, 6 * h)))
        show_chart(chart, df, name)
        return
    small, block = downsample(matrix, 512)
    rgb = _colorize(small, scheme)
    from PIL import Image, ImageDraw

    image = Image.fromarray(rgb).resize((rgb.shape[1] * max(1, 512 // rgb.shape[1]),
                                         rgb.shape[0] * max(1, 512 // rgb.shape[0])), Image.NEAREST)
    draw = ImageDraw.Draw(image)
    sx, sy = image.width / w, image.height / h
    for m in marks:
        if 0 <= m < max(h, w):
            draw.line([(m * sx, 0), (m * sx, image.height)], fill=(255, 255, 255), width=2)
            draw.line([(0, m * sy), (image.width, m * sy)], fill=(255, 255, 255), width=2)
    lo, hi = np.nanmin(matrix), np.nanmax(matrix)
    st.image(image, caption=(f"{y_title} (rows, 0–{h - 1}, top to bottom) × {x_title} (columns, 0–{w - 1}, left to "
                             f"right); colour = {value_title} {_colour_legend(scheme, lo, hi)}; "
                             f"each pixel averages {block}×{block} cells"
                             + (f"; white lines mark {mark_label}" if marks else "") + "."))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    row = st.container(horizontal=True)
    row.download_button("Image (PNG)", buf.getvalue(), file_name=f"{name}.png", mime="image/png", key=f"png-{name}",
                        width="content", on_click="ignore")
    row.download_button("Data (CSV, downsampled)", csv_file(pd.DataFrame(small), index=True),
                        file_name=f"{name}.csv", mime="text/csv", key=f"csv-{name}", width="content", on_click="ignore")


NO_CHECKPOINTS = "No checkpoints found in models/. Run `make checkpoints` to train the shipped set, then reload."
REBUILD = "Rebuild it with `make checkpoints`; the other checkpoints keep working."


def usable_checkpoints(read) -> tuple[dict, dict]:
    """({name: folder}, {name: read(folder)}) for every shipped checkpoint ``read`` can open.

    Each one it cannot open gets an error box naming it and what to do; the page goes on with the
    rest, and stops with a notice when there is none at all.
    """
    checkpoints, facts = shipped_checkpoints(), {}
    if not checkpoints:
        st.warning(NO_CHECKPOINTS)
        st.stop()
    for name, folder in checkpoints.items():
        try:
            facts[name] = read(folder)
        except (PosvizError, KeyError) as exc:
            error_box(PosvizError(f"Checkpoint {name!r} cannot be loaded: {exc}"), REBUILD)
    if not facts:
        st.stop()
    return checkpoints, facts


def error_box(exc: Exception, what_next: str | None = None) -> None:
    """A bad-input message on the page; the app keeps running."""
    st.error(f"{exc}" + (f"\n\n{what_next}" if what_next else ""), icon="🚫")


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# Shipped checkpoints, read once per change on disk (training may rewrite them while the app runs)
# ---------------------------------------------------------------------------------------------
def folder_stamp(folder: str | Path) -> tuple:
    """(name, size, mtime) of each file in a checkpoint folder: a cache key that changes on rewrite."""
    folder = Path(folder)
    if not folder.is_dir():
        return ()
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file())


@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
def _checkpoint_json(folder: str, stamp: tuple) -> tuple[dict | None, dict | None, str | None]:
    from posviz.checkpoint import read_config

    try:
        return read_config(folder), read_metrics(folder), None
    except PosvizError as exc:
        return None, None, str(exc)


def shipped_checkpoint_json() -> dict[str, tuple[dict | None, dict | None, str | None]]:
    """{name: (config.json, metrics.json, problem)} of every shipped checkpoint, in display order.

    A missing or corrupt file gives (None, None, message) for that checkpoint; the others still load.
    """
    return {name: _checkpoint_json(str(folder), folder_stamp(folder)) for name, folder in shipped_checkpoints().items()}


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner="Loading checkpoint…")
def _cached_checkpoint(folder: str, stamp: tuple):
    from posviz.checkpoint import load_checkpoint

    return load_checkpoint(folder)


def shipped_model(name: str):
    """(model, None) for the shipped checkpoint ``name``, or (None, message saying what to do)."""
    folder = shipped_checkpoints().get(name)
    if folder is None:
        from posviz.checkpoint import models_dir

        return None, (f"No '{name}' checkpoint in {models_dir()}. "
                      "Run `make checkpoints` to train the shipped set.")
    try:
        return _cached_checkpoint(str(folder), folder_stamp(folder)), None
    except PosvizError as exc:
        return None, f"{exc} Run `make checkpoints` (or `python -m posviz.train --method {name}`) to rebuild it."


# ---------------------------------------------------------------------------------------------
# Live labs: choosing a text, drawing pooled attention maps, text coloured by loss
# ---------------------------------------------------------------------------------------------
@st.cache_data(max_entries=4, show_spinner="Reading the held-out validation documents…")
def validation_documents() -> list[bytes]:
    """The long held-out validation documents (never seen in training)."""
    from posviz.data import load_corpus

    return list(load_corpus().eval_documents)


@st.cache_data(max_entries=4, show_spinner=False)
def _document_labels(n: int) -> list[str]:
    from posviz.lab_inputs import document_label

    return [document_label(i, d) for i, d in enumerate(validation_documents())]


def choose_text(where=None, default_doc: int = 0):
    """A text picker: a held-out validation document (in the URL as ``doc``) or pasted text.

    Returns a ``posviz.lab_inputs.TextInput``, or None after showing why there is no usable text (the
    caller then stops). Pasted text is not put in the URL (it can be 64 kB); the choice of
    document is. Notices (cut to the cap, control bytes) are shown as info boxes.
    """
    from posviz.lab_inputs import prepare_text
    from posviz.limits import MAX_TEXT_BYTES

    where = where or st
    documents = validation_documents()
    sources = ["doc", "paste"] if documents else ["paste"]
    source = where.radio("Text", sources, index=sources.index(qp_choice("src", sources[0], sources)),
                         format_func={"doc": "Held-out document", "paste": "Paste text"}.get, horizontal=True,
                         key="w_src", help="Validation documents are Python standard-library files kept out of training.")
    if source == "doc":
        labels = _document_labels(len(documents))
        index = where.selectbox("Document", range(len(documents)), index=qp_int("doc", min(default_doc, len(documents) - 1),
                                0, len(documents) - 1), format_func=labels.__getitem__, key="w_doc")
        sync_url(src=source, doc=index)
        raw: bytes | str = documents[index]
    else:
        sync_url(src=source)
        raw = where.text_area(f"Paste text (at most {MAX_TEXT_BYTES:,} bytes are used; not stored in the link)",
                              key="w_paste", height=140, placeholder="def f(x):\n    return x + 1\n")
    try:
        text = prepare_text(raw)
    except PosvizError as exc:
        error_box(exc)
        return None
    for notice in text.notices:
        where.info(notice, icon="ℹ️")
    return text


def show_pooled_matrix(pooled: np.ndarray, block: int, full_shape: tuple[int, int], name: str, x_title: str,
                       y_title: str, value_title: str, scheme: str = "viridis", marks: Sequence[int] = (),
                       mark_label: str = "", side: int = 512, title: str | None = None, compact: bool = False) -> None:
    """A matrix already block-averaged by ``block`` (from a ``full_shape`` one) drawn as a PNG.

    For maps too large to send whole (e.g. a 4,096² attention map): the caption states the real axes,
    ``marks`` are in full-matrix coordinates, and both the PNG and the pooled values download.
    ``compact``: for grids of small maps: no caption (the caller writes one for the grid) and one
    row of small download buttons.
    """
    h, w = full_shape
    png = _pooled_png(np.asarray(pooled, dtype=float), full_shape, scheme, tuple(marks), side)
    finite = np.isfinite(pooled)
    lo, hi = (np.nanmin(pooled), np.nanmax(pooled)) if finite.any() else (float("nan"), float("nan"))
    caption = (f"{y_title} (rows, 0–{h - 1:,}, top to bottom) × {x_title} (columns, 0–{w - 1:,}, left to right); "
               f"colour = {value_title} {_colour_legend(scheme, lo, hi)}; grey = masked"
               + (f"; each pixel averages {block}×{block} entries" if block > 1 else "")
               + (f"; white lines mark {mark_label}" if marks else "") + ".")
    if title:
        st.markdown(f"**{title}**")
    st.image(png, caption=None if compact else caption, width="stretch")
    row = st.container(horizontal=True)  # wraps in a narrow column instead of cutting the labels
    row.download_button("PNG" if compact else "Image (PNG)", png, file_name=f"{name}.png",
                        mime="image/png", key=f"png-{name}", width="content", on_click="ignore")
    row.download_button("CSV" if compact else "Data (CSV" + (", pooled)" if block > 1 else ")"),
                        csv_file(pd.DataFrame(pooled), index=True), file_name=f"{name}.csv", mime="text/csv",
                        key=f"csv-{name}", width="content", on_click="ignore")


@st.cache_data(max_entries=4 * CACHE_ENTRIES, show_spinner=False)
def _pooled_png(pooled: np.ndarray, full_shape: tuple[int, int], scheme: str, marks: tuple[int, ...],
                side: int) -> bytes:
    """The PNG of a pooled map, encoded once per server: every visitor of the same map gets these bytes."""
    from PIL import Image, ImageDraw

    h, w = full_shape
    rgb = _colorize(pooled, scheme)
    scale = max(1, side // max(rgb.shape[:2]))
    image = Image.fromarray(rgb).resize((rgb.shape[1] * scale, rgb.shape[0] * scale), Image.NEAREST)
    draw = ImageDraw.Draw(image)
    sx, sy = image.width / w, image.height / h
    for m in marks:
        if 0 < m < max(h, w):
            draw.line([(m * sx, 0), (m * sx, image.height)], fill=(255, 255, 255), width=2)
            draw.line([(0, m * sy), (image.width, m * sy)], fill=(255, 255, 255), width=2)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


LOSS_RAMP = [(255, 255, 255), (255, 237, 160), (254, 178, 76), (240, 59, 32), (189, 0, 38)]


def _loss_colour(value: float, top: float) -> str:
    if value != value:  # NaN: not scored (the first byte of the text: nothing predicts it)
        return "#e6e6e6"
    x = min(max(value / top, 0.0), 1.0) * (len(LOSS_RAMP) - 1)
    i = min(int(x), len(LOSS_RAMP) - 2)
    f = x - i
    r, g, b = (round(a * (1 - f) + c * f) for a, c in zip(LOSS_RAMP[i], LOSS_RAMP[i + 1]))
    return f"#{r:02x}{g:02x}{b:02x}"


def show_coloured_text(chars_with_values: Sequence[tuple[str, float]], top: float, unit: str = "bits",
                       height: int = 320, mark_at: int | None = None, mark_label: str = "") -> None:
    """Text with each character's background coloured by its value (e.g. loss in bits).

    ``mark_at``: a bar before that character (e.g. where the context passes the training length),
    explained by ``mark_label`` under the text.

    Every character goes through ``html.escape`` before it reaches ``st.html``, so user text can
    never become markup; the only markup is our own spans with a colour and a numeric tooltip.
    """
    import html as _html

    spans = []
    for char, value in chars_with_values:
        tip = "not scored" if value != value else f"{value:.2f} {unit}"
        shown = _html.escape(char if char != "\r" else "", quote=True)
        if mark_at is not None and len(spans) == mark_at:
            spans.append('<span style="border-left:3px solid #d00;margin:0 1px"></span>')
        spans.append(f'<span style="background:{_loss_colour(value, top)}" title="{tip}">{shown}</span>')
    legend = "".join(f'<span style="background:{_loss_colour(top * k / 4, top)};padding:0 .6em">'
                     f'{top * k / 4:.0f}</span>' for k in range(5))
    st.html(
        f'<div style="font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem;line-height:1.45;'
        f'white-space:pre-wrap;word-break:break-all;max-height:{height}px;overflow-y:auto;border:1px solid #ddd;'
        f'border-radius:6px;padding:.6em;color:#111;background:#fff">{"".join(spans)}</div>'
        f'<div style="font-size:.8rem;color:#555;margin-top:.3em">{unit} per character: {legend} or more; '
        f'<span style="background:#e6e6e6;padding:0 .4em">grey</span> = not scored (nothing before it to predict from)'
        + (f'; <span style="border-left:3px solid #d00;padding-left:.3em">red bar</span>: {_html.escape(mark_label)}'
           if mark_at is not None and mark_label else "") + '</div>'
    )


# ---------------------------------------------------------------------------------------------
# Live work shared by every session of this server, queued (posviz.serving)
# ---------------------------------------------------------------------------------------------
@st.cache_resource(show_spinner=False)
def shared_results():
    """The server's one store of live results (bounded in entries and bytes, see posviz.limits)."""
    from posviz.serving import SharedResults

    return SharedResults()


@st.cache_resource(show_spinner=False)
def work_queue():
    """The server's one queue of heavy computations (``HEAVY_SLOTS`` at once)."""
    from posviz.serving import WorkQueue

    return WorkQueue()


@st.cache_resource(show_spinner=False)
def warm_the_store(pages: tuple[str, ...]):
    """Once per server, from the first visitor's run (app.py calls it on every run; Streamlit runs it
    once): a background thread that makes the server its own first visitor. It opens each of
    ``pages`` (URL paths, in this order) at its default settings in a session of its own
    (``views/_warm.py``), so every page's default view is in the shared store before most visitors
    arrive; then it computes the Extrapolation lab's default view at every other slider stop. All of
    it is background work of the work queue: a visitor's computation always goes first.

    ``POSVIZ_WARM=0`` turns it off (the bench does, to time a first visitor on a server that has
    computed nothing). Not under ``AppTest``, which has no server to visit.
    """
    import os
    import threading

    if os.environ.get("POSVIZ_WARM", "1") == "0" or not st.context.headers.get("Host"):
        return None
    from posviz import extrapolation
    from posviz.lab_inputs import prepare_text
    from posviz.positions import POSITION_METHODS
    from views._warm import server_stream_url, visit

    url = server_stream_url(st.get_option("server.address"), int(st.get_option("server.port")),
                            st.get_option("server.baseUrlPath"))
    folders = [str(folder) for name, folder in shipped_checkpoints().items() if name in POSITION_METHODS]
    documents = validation_documents()
    results, queue = shared_results(), work_queue()

    def warm():
        start = time.perf_counter()
        for page in pages:
            try:
                how = visit(url, page)
            except Exception as exc:  # a page that fails is the page's to report to its visitors; go on
                how = repr(exc)
            if how != "ok":
                print(f"posviz: warm-up: page /{page} did not finish: {how}", flush=True)
        print(f"posviz: warm-up: every page's default view computed in {time.perf_counter() - start:.1f} s "
              f"({len(results)} results, {results.bytes / 2**20:.0f} MiB stored)", flush=True)
        try:
            if folders and documents:
                extrapolation.warm_default_view(results, queue, folders, prepare_text(documents[0]).as_bytes())
        except Exception as exc:  # a broken checkpoint is the pages' to report; the server goes on
            print(f"posviz: warm-up: the Extrapolation lab's slider stops stopped: {exc!r}", flush=True)
        print(f"posviz: warm-up done in {time.perf_counter() - start:.1f} s ({len(results)} results, "
              f"{results.bytes / 2**20:.0f} MiB stored)", flush=True)

    thread = threading.Thread(target=warm, name="posviz-warm", daemon=True)
    thread.start()
    return thread


def _warming() -> bool:
    """True in the server's own warm-up session, whose computations wait behind every visitor's."""
    from views._warm import WARM_HEADER

    return st.context.headers.get(WARM_HEADER) == "1"


def stored_result(name: str, key: tuple):
    """(found, value) from the store ``compute_once`` uses, for results a page computes itself
    (e.g. streamed to the page as they are produced) and keeps with ``store_result``."""
    return shared_results().get((name, key))


def store_result(name: str, key: tuple, value) -> None:
    shared_results().put((name, key), value)


def shared(name: str, key: tuple, build):
    """``build()`` once per server for ``key`` (no queue, no progress bar): for what a page derives
    from live results to show them (chart specs, coloured text), which every visitor of the same
    result would otherwise rebuild on every run."""
    return shared_results().get_or_compute((name, key), build)


def _queue_turn(label: str, slot):
    """This session's turn in the server's work queue, its place in line shown in ``slot`` meanwhile
    (the warm-up's own session waits behind every visitor's)."""
    def in_line(ahead: int) -> None:
        slot.progress(0.0, text=f"{label} Waiting in line: {ahead} computation{'' if ahead == 1 else 's'} for "
                                "other visitors ahead of this one (this server runs one at a time so that each "
                                "finishes sooner).")
    return work_queue().turn(in_line, background=_warming())


@contextmanager
def heavy_turn(label: str, slot=None):
    """Hold the server's work queue for a heavy computation the page runs itself (not through
    ``compute_once``), showing this visitor's place in line in ``slot`` (or a new one) meanwhile."""
    own = slot is None
    slot = st.empty() if own else slot
    try:
        with _queue_turn(label, slot):
            if own:
                slot.empty()
            yield
    finally:
        if own:
            slot.empty()


def compute_once(name: str, key: tuple, compute, label: str):
    """``compute(progress)`` once per ``key`` for the whole server, in the work queue, with a progress bar.

    Every session gets the same stored result (``posviz.serving.SharedResults``): a key that another
    session is computing right now is waited for, not computed twice. While the computation waits
    for its turn in the server's queue, the bar says how many are ahead. ``progress`` takes the
    fraction done (0..1). Exceptions are not stored: bad input is re-checked on every run.
    """
    results = shared_results()
    found, value = results.get((name, key))
    if found:
        return value
    slot = st.empty()

    def run():
        with _queue_turn(label, slot):
            slot.progress(0.0, text=label)
            return compute(lambda f: slot.progress(min(max(float(f), 0.0), 1.0), text=label))

    try:
        return results.get_or_compute((name, key), run, lambda: slot.progress(
            0.0, text=f"{label} Another visitor asked for the same just now: waiting for that result."))
    finally:
        slot.empty()
