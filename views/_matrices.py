"""Matrices drawn as heatmaps: an Altair chart with tooltips when small, else a block-averaged PNG
whose caption states the real axes, with the PNG and the values to download.
"""
from __future__ import annotations

import io
import warnings
from typing import Sequence

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from posviz.limits import CACHE_ENTRIES
from views._charts import csv_file, show_cached_chart, show_chart
from views._serving import shared


# Above this many cells a matrix is a PNG, not a heatmap of one Vega mark per cell. A heatmap draws in the
# visitor's browser: the Absolute page's 256×256 cosine map and 256×128 learned table as heatmaps (98,304 marks)
# held its first view 2.5 s longer on 2 cores (7.1–7.4 s against 4.6 s, `python -m posviz_tools.bench
# --first-request`); a 128×128 map draws in a fraction of that. Larger maps keep every cell up to 512 a side.
ALTAIR_MAX_CELLS = 128 * 128


def _colour_legend(scheme: str, lo: float, hi: float) -> str:
    """How a PNG map's colours read, for its caption (``_colorize`` draws red-blue centred on 0)."""
    if scheme == "viridis":
        return f"from {lo:.3g} (dark) to {hi:.3g} (bright)"
    return f"blue below 0, white at 0, red above (range {lo:.3g} to {hi:.3g})"


def _colorize(matrix: np.ndarray, scheme: str = "viridis", domain: tuple[float, float] | None = None) -> np.ndarray:
    """(h, w) floats to (h, w, 3) uint8 with a perceptual colour ramp; NaN (masked) is light grey. ``domain``: the
    values the ramp's ends stand for (two maps meant to be compared share one), else the matrix's own range."""
    ramps = {
        "viridis": [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)],
        "redblue": [(33, 102, 172), (146, 197, 222), (247, 247, 247), (244, 165, 130), (178, 24, 43)],
    }
    stops = np.array(ramps[scheme], dtype=float)
    finite = np.isfinite(matrix)
    lo, hi = (np.nanmin(matrix[finite]), np.nanmax(matrix[finite])) if finite.any() else (0.0, 1.0)
    if domain is not None:
        lo, hi = domain
    if scheme == "redblue":  # diverging: white is 0, so the sign of a difference or weight reads at a glance
        lo, hi = -max(abs(lo), abs(hi)), max(abs(lo), abs(hi))
    t = np.zeros_like(matrix, dtype=float) if hi == lo else np.clip((np.nan_to_num(matrix, nan=lo) - lo) / (hi - lo), 0, 1)
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
    with np.errstate(all="ignore"), warnings.catch_warnings():  # a block wholly masked (NaN) stays NaN: no warning
        warnings.simplefilter("ignore", RuntimeWarning)
        out = np.nanmean(padded.reshape(H // block, block, W // block, block), axis=(1, 3))
    return out, block


def show_matrix(matrix: np.ndarray, name: str, x_title: str, y_title: str, value_title: str,
                scheme: str = "viridis", marks: Sequence[int] = (), mark_label: str = "", key: tuple | None = None,
                says: str | None = None) -> None:
    """A matrix as an Altair heatmap with tooltips when small, else as a downsampled image.

    Altair in the browser takes minutes at 2048² and fails at 4096², so large matrices are
    block-averaged to at most 512 px a side and drawn as a PNG with the axes stated in the caption.
    ``marks``: rows/columns to outline (e.g. the training length). ``key``: everything the matrix
    depends on; the heatmap's Vega-Lite spec is then built once per server under it (building it
    took tens of milliseconds on every rerun).
    """
    matrix = np.asarray(matrix, dtype=float)
    h, w = matrix.shape
    if h * w <= ALTAIR_MAX_CELLS and key is not None:
        show_cached_chart(("matrix", name, scheme, x_title, y_title, value_title) + tuple(key),
                          lambda: _heatmap(matrix, x_title, y_title, value_title, scheme), name, says=says)
        return
    if h * w <= ALTAIR_MAX_CELLS:
        show_chart(*_heatmap(matrix, x_title, y_title, value_title, scheme), name, says=says)
        return
    args = (x_title, y_title, value_title, scheme, tuple(marks), mark_label)
    png, caption, small = (shared("matrix-png", ("png", name) + args + tuple(key), lambda: _picture(matrix, *args))
                           if key is not None else _picture(matrix, *args))
    st.image(png, caption=caption)
    row = st.container(horizontal=True)
    row.download_button("Image (PNG)", png, file_name=f"{name}.png", mime="image/png", key=f"png-{name}",
                        width="content", on_click="ignore")
    row.download_button("Data (CSV, downsampled)", csv_file(pd.DataFrame(small), index=True),
                        file_name=f"{name}.csv", mime="text/csv", key=f"csv-{name}", width="content", on_click="ignore")


def _picture(matrix: np.ndarray, x_title: str, y_title: str, value_title: str, scheme: str, marks: tuple,
             mark_label: str) -> tuple[bytes, str, np.ndarray]:
    """(PNG, its caption, the block-averaged values) of a matrix too large for a heatmap."""
    h, w = matrix.shape
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
    caption = (f"{y_title} (rows, 0–{h - 1}, top to bottom) × {x_title} (columns, 0–{w - 1}, left to "
               f"right); colour = {value_title} {_colour_legend(scheme, lo, hi)}; "
               f"each pixel averages {block}×{block} cells"
               + (f"; white lines mark {mark_label}" if marks else "") + ".")
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue(), caption, small


def _heatmap(matrix: np.ndarray, x_title: str, y_title: str, value_title: str, scheme: str):
    """(Altair heatmap, its long-format data) of a small matrix; NaN cells (masked) are left out."""
    h, w = matrix.shape
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
    return chart, df


def show_pooled_matrix(pooled: np.ndarray, block: int, full_shape: tuple[int, int], name: str, x_title: str,
                       y_title: str, value_title: str, scheme: str = "viridis", marks: Sequence[int] = (),
                       mark_label: str = "", side: int = 512, title: str | None = None, compact: bool = False,
                       key: tuple | None = None, domain: tuple[float, float] | None = None) -> None:
    """A matrix already block-averaged by ``block`` (from a ``full_shape`` one) drawn as a PNG.

    For maps too large to send whole (e.g. a 4,096² attention map): the caption states the real axes,
    ``marks`` are in full-matrix coordinates, and both the PNG and the pooled values download.
    ``compact``: for grids of small maps: no caption (the caller writes one for the grid) and one
    row of small download buttons. ``key``: everything the map depends on; the server then keeps its PNG
    under it, where without one the PNG is cached by the map's values (hashing a 256x256 map on every run).
    """
    h, w = full_shape
    args = (np.asarray(pooled, dtype=float), full_shape, scheme, tuple(marks), side, domain)
    png, lo, hi = shared("pooled-png", key + args[2:], lambda: _pooled_picture(*args)) if key is not None else \
        _cached_picture(*args)
    caption = (f"{y_title} (rows, 0–{h - 1:,}, top to bottom) × {x_title} (columns, 0–{w - 1:,}, left to right); "
               f"colour = {value_title} {_colour_legend(scheme, lo, hi)}; grey = masked"
               + (f"; each pixel averages {block}×{block} entries" if block > 1 else "")
               + (f"; white lines mark {mark_label}" if marks else "") + ".")
    if title:
        st.markdown(f"**{title}**")
    # PNG as it is: "auto" would re-encode a map without an alpha channel as a blurred JPEG on every run
    st.image(png, caption=None if compact else caption, width="stretch", output_format="PNG")
    row = st.container(horizontal=True)  # wraps in a narrow column instead of cutting the labels
    row.download_button("PNG" if compact else "Image (PNG)", png, file_name=f"{name}.png",
                        mime="image/png", key=f"png-{name}", width="content", on_click="ignore")
    row.download_button("CSV" if compact else "Data (CSV" + (", pooled)" if block > 1 else ")"),
                        csv_file(pd.DataFrame(pooled), index=True), file_name=f"{name}.csv", mime="text/csv",
                        key=f"csv-{name}", width="content", on_click="ignore")


@st.cache_data(max_entries=4 * CACHE_ENTRIES, show_spinner=False)
def _cached_picture(pooled: np.ndarray, full_shape: tuple[int, int], scheme: str, marks: tuple[int, ...],
                    side: int, domain: tuple[float, float] | None = None) -> tuple[bytes, float, float]:
    """``_pooled_picture`` once per server for every visitor of the same map."""
    return _pooled_picture(pooled, full_shape, scheme, marks, side, domain)


def _pooled_picture(pooled: np.ndarray, full_shape: tuple[int, int], scheme: str, marks: tuple[int, ...],
                    side: int, domain: tuple[float, float] | None = None) -> tuple[bytes, float, float]:
    """(the PNG of a pooled map, the values its colour ramp's ends stand for: ``domain``, else its own lowest and
    highest finite value)."""
    from PIL import Image, ImageDraw

    h, w = full_shape
    rgb = _colorize(pooled, scheme, domain)
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
    finite = np.isfinite(pooled)
    lo, hi = (float(np.nanmin(pooled)), float(np.nanmax(pooled))) if finite.any() else (float("nan"), float("nan"))
    if domain is not None:
        lo, hi = domain
    return buf.getvalue(), lo, hi


def recurrent_layer_notes(named_kinds: Sequence[tuple[str, str]], layer: int, also: str = "") -> None:
    """A caption for each model whose ``layer`` is not attention (``LabModel.layer_kind``): what its map is instead.
    ``named_kinds``: (display name, quoted for Markdown; kind) per model drawn; ``also``: what else reads the map."""
    for name, kind in named_kinds:
        if kind != "attention":
            st.caption(f"Layer {layer} of {name} is a {kind} layer: no softmax, but its output is still a weighted "
                       "sum of the values, o_t = Σ_s w_ts v_s (its implied matrix). Drawn: each weight's share of its "
                       f"row's Σ|w| (signs dropped){also}.")
