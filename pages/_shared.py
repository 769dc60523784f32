"""UI helpers shared by the page scripts: sidebar, URL state, chart export, matrix display.

No maths here: numbers come from ``posviz``. Everything a user types is shown as text, never as HTML.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from posviz.checkpoint import read_metrics, shipped_checkpoints
from posviz.errors import PosvizError
from posviz.limits import CACHE_ENTRIES, device_label

PRESENTATION_CSS = """
<style>
html, body, [data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li { font-size: 1.25rem !important; }
h1 { font-size: 3rem !important; } h2 { font-size: 2.2rem !important; }
[data-testid="stToolbar"], [data-testid="stDecoration"], footer { display: none !important; }
</style>
"""


# ---------------------------------------------------------------------------------------------
# URL query-string state: every widget reads its default from the URL and writes its value back,
# so a link reproduces the view. Junk values fall back to the default with a notice.
# ---------------------------------------------------------------------------------------------
def _notice_junk(key: str, raw: str, default) -> None:
    st.session_state.setdefault("_url_notices", []).append(
        f"Ignored URL parameter {key}={raw[:40]!r}; using the default {default!r}."
    )


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
    for message in st.session_state.pop("_url_notices", []):
        st.warning(message, icon="⚠️")


# ---------------------------------------------------------------------------------------------
# Page frame
# ---------------------------------------------------------------------------------------------
@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
def checkpoint_summary() -> pd.DataFrame:
    rows = []
    for name, folder in shipped_checkpoints().items():
        try:
            m = read_metrics(folder)
            rows.append({"checkpoint": name, "val bits/byte @ train length": m.get("val_bpb_at_train_length"),
                         "parameters": m.get("parameters")})
        except PosvizError as exc:
            rows.append({"checkpoint": name, "val bits/byte @ train length": None, "parameters": None,
                         "problem": str(exc)})
    return pd.DataFrame(rows)


def page_header(title: str, intro: str) -> None:
    """Title, intro, the shared sidebar, presentation mode and any URL notices."""
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
        st.sidebar.dataframe(summary[["checkpoint", "val bits/byte @ train length"]], hide_index=True)
    st.title(title)
    if not presentation:
        st.caption(intro)
    show_url_notices()


# ---------------------------------------------------------------------------------------------
# Charts: every chart gets its data as CSV; Altair's own menu (…) saves PNG and SVG.
# ---------------------------------------------------------------------------------------------
def show_chart(chart: alt.Chart, data: pd.DataFrame, name: str, caption: str | None = None) -> None:
    st.altair_chart(chart, use_container_width=True)
    cols = st.columns([1, 4])
    cols[0].download_button("Data (CSV)", data.to_csv(index=False).encode(), file_name=f"{name}.csv",
                            mime="text/csv", key=f"csv-{name}")
    if caption:
        cols[1].caption(caption + "  ·  Save the chart as PNG or SVG from its ⋯ menu.")
    else:
        cols[1].caption("Save the chart as PNG or SVG from its ⋯ menu.")


ALTAIR_MAX_CELLS = 256 * 256


def _colorize(matrix: np.ndarray, scheme: str = "viridis") -> np.ndarray:
    """(h, w) floats to (h, w, 3) uint8 with a perceptual colour ramp; NaN (masked) is light grey."""
    ramps = {
        "viridis": [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)],
        "redblue": [(33, 102, 172), (146, 197, 222), (247, 247, 247), (244, 165, 130), (178, 24, 43)],
    }
    stops = np.array(ramps[scheme], dtype=float)
    finite = np.isfinite(matrix)
    lo, hi = (np.nanmin(matrix[finite]), np.nanmax(matrix[finite])) if finite.any() else (0.0, 1.0)
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
    df = pd.DataFrame({"row": np.repeat(np.arange(h), w), "col": np.tile(np.arange(w), h), "value": matrix.ravel()})
    if h * w <= ALTAIR_MAX_CELLS:
        plot = df.dropna()
        chart = alt.Chart(plot).mark_rect().encode(
            x=alt.X("col:O", title=x_title, axis=alt.Axis(labelOverlap=True, values=list(range(0, w, max(1, w // 16))))),
            y=alt.Y("row:O", title=y_title, axis=alt.Axis(labelOverlap=True, values=list(range(0, h, max(1, h // 16))))),
            color=alt.Color("value:Q", title=value_title,
                            scale=alt.Scale(scheme="viridis" if scheme == "viridis" else "redblue",
                                            reverse=scheme == "redblue")),
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
                             f"right); colour = {value_title} from {lo:.3g} (dark) to {hi:.3g} (bright); "
                             f"each pixel averages {block}×{block} cells"
                             + (f"; white lines mark {mark_label}" if marks else "") + "."))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    cols = st.columns(2)
    cols[0].download_button("Image (PNG)", buf.getvalue(), file_name=f"{name}.png", mime="image/png", key=f"png-{name}")
    cols[1].download_button("Data (CSV, downsampled)", pd.DataFrame(small).to_csv().encode(),
                            file_name=f"{name}.csv", mime="text/csv", key=f"csv-{name}")


def error_box(exc: Exception, what_next: str | None = None) -> None:
    """A bad-input message on the page; the app keeps running."""
    st.error(f"{exc}" + (f"\n\n{what_next}" if what_next else ""), icon="🚫")


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
