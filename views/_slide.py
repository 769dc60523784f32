"""Presentation mode is a slide: one chart of the page, large, under the page's title and one line stating
the settings, with one sentence under it saying what it shows, and its PNG at 1920×1080 and 1280×720.

``?present=1`` (the sidebar's toggle, or a chart's "Slide" button) turns a page into its slide; ``slide=<chart>``
says which chart (the name of its CSV file), else the page's first. The page still runs whole, at the link's
settings: every element that is neither the slide's head, its chart, a progress bar nor an error or warning is
hidden by one stylesheet, so no page knows it is drawn as a slide. The slide's chart is drawn in a container keyed
``slide-<name>``, which the stylesheet keeps (``views._charts`` asks ``claims`` before drawing each chart).

The settings line is what the page's widgets show (their labels and formatted values, in the order the page
drew them): each widget Streamlit draws is noted by ``note_widget``, which ``install_widget_notes`` hooks into
Streamlit's widget functions once per process, with where it stood (the sidebar, or the main area's section: one
per ``st.header``). The line keeps those the slide's chart can depend on (``settings_of``). Nothing is noted outside
presentation mode.
"""
from __future__ import annotations

import copy
import functools
import re
import threading
from dataclasses import dataclass, field

import streamlit as st
from streamlit.proto.RootContainer_pb2 import RootContainer

from posviz.slides import SEPARATOR  # the settings line's, wrapped at it in the PNG
from views._quote import plain  # the settings line quotes what a visitor typed
from views._url import notice_junk, qp_bool, sync_url

PRESENT_KEY = "w_present"  # the sidebar toggle's key: the Slide buttons and "Leave the slide" set it
SLIDE_PARAM = "slide"  # the URL parameter naming the slide's chart
RUN_KEY = "_slide_run"  # this run's SlideRun, in the session state
CHART_NAME = re.compile(r"[A-Za-z0-9_.-]{1,120}")
# The plot area's height on a slide (px): with the title and the settings line above it, the axis and the
# sentence under it, the slide fills a 1920×1080 screen without scrolling.
SLIDE_PLOT_HEIGHT = 700
# Fonts of a chart on a slide, scaled as the captions are (Vega-Lite's defaults are 10-11 px: unreadable from a hall)
SLIDE_CHART_CONFIG = {
    "axis": {"labelFontSize": 17, "titleFontSize": 19, "titlePadding": 12, "labelLimit": 300},
    "legend": {"labelFontSize": 17, "titleFontSize": 18, "symbolSize": 180, "labelLimit": 420, "rowPadding": 6},
    "header": {"labelFontSize": 18, "titleFontSize": 19},
    "title": {"fontSize": 22},
    "text": {"fontSize": 15},
}
# The PNG's: a 1920-px canvas on a projector, at least 20 px (issue #72; the screen's slide keeps the sizes above,
# which fit a 1366-px laptop's legends uncut)
SLIDE_PNG_FONTS = {
    "axis": {"labelFontSize": 22, "titleFontSize": 24, "titlePadding": 14, "labelLimit": 420},
    "legend": {"labelFontSize": 22, "titleFontSize": 24, "symbolSize": 260, "labelLimit": 640, "rowPadding": 8},
    "header": {"labelFontSize": 22, "titleFontSize": 24},
    "title": {"fontSize": 26},
    "text": {"fontSize": 20},
}

# Streamlit's own categorical colours (its light theme), which it gives a chart on screen when the chart names none:
# the PNG's renderer would take Vega's (the Scoreboard's "remap" turned from light blue to orange in the PNG).
STREAMLIT_CATEGORY = ["#0068c9", "#83c9ff", "#ff2b2b", "#ffabab", "#29b09d", "#7defa1", "#ff8700", "#ffd16a",
                      "#6d3fc0", "#d5dae5"]
SLIDE_PNG_CONFIG = {**SLIDE_PNG_FONTS, "range": {"category": STREAMLIT_CATEGORY}, "line": {"strokeWidth": 3}}

# What is hidden on a slide: in every block of the main area, each element that is not the head, the slide's chart
# container, something that holds it or sits in it, a progress bar, a spinner, an error or a warning.
KEEP = ('.st-key-slidehead', '.st-key-slidehead *', ':has(.st-key-slidehead)', '[class*="st-key-slide-"]', '[class*="st-key-slide-"] *',
        ':has([class*="st-key-slide-"])', ':has([data-testid="stAlertContentError"])',
        ':has([data-testid="stAlertContentWarning"])', ':has([data-testid="stProgress"])',
        ':has([data-testid="stSpinner"])')
BLOCKS = ':is([data-testid="stVerticalBlock"], [data-testid="stHorizontalBlock"])'
SLIDE_CSS = f"""
<style>
section[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"], [data-testid="stToolbar"], [data-testid="stDecoration"], footer {{ display: none !important; }}
[data-testid="stMainBlockContainer"] {{ padding: 1.2rem 2.5rem 0.5rem !important; max-width: 100% !important; }}
[data-testid="stMainBlockContainer"] {BLOCKS} > :not({", ".join(KEEP)}) {{ display: none !important; }}
[data-testid="stMain"] h1 {{ font-size: 2.6rem !important; padding: 0 0 0.2rem !important; }}
.st-key-slidehead {{ position: relative; z-index: 5; }}  /* above the chart's toolbar, which overlapped "Leave the slide" */
.st-key-slidehead [data-testid="stCaptionContainer"] p {{ font-size: 1.15rem !important; }}
[class*="st-key-slide-"] [data-testid="stMarkdown"] p {{ font-size: 1.5rem !important; line-height: 1.4 !important; }}
[class*="st-key-slide-"] img {{ max-height: 66vh; width: auto !important; }}
[data-testid="stColumn"]:has([class*="st-key-slide-"]) {{ width: 100% !important; flex: 1 1 100% !important; max-width: 100% !important; }}
</style>
"""


@dataclass
class SlideRun:
    """One run of a page in presentation mode: which chart is the slide's, and what the widgets showed."""

    title: str
    wanted: str | None  # the chart the link names
    headline: str | None = None  # without one: the first chart whose name starts with this (the page's own choice)
    chosen: str | None = None  # the chart drawn as the slide, once drawn
    settings: list[tuple[str, str]] = field(default_factory=list)
    # where each setting's widget stood: SIDEBAR, or the number of the main area's section (0: above its first
    # st.header, the page's own controls); the slide's line keeps only those its chart can depend on
    places: list = field(default_factory=list)
    section: int = 0  # the main area's section being drawn (one per st.header)
    chosen_place: tuple[int, int] | None = None  # (section, settings noted) when the slide's chart was drawn
    charts_drawn: list[tuple[int, int]] = field(default_factory=list)  # the same, for every chart of the page
    settings_slot: object = None
    png_slot: object = None


def current() -> SlideRun | None:
    """This run's slide, or None outside presentation mode."""
    return st.session_state.get(RUN_KEY)


def begin(title: str, intro: str, headline: str | None = None) -> bool:
    """The presentation-mode toggle and, when on, the slide's head (title, settings line, buttons) and its
    stylesheet; returns whether the page is a slide. Called by ``page_header`` before anything else. ``headline``:
    the start of the name of the chart the page's slide shows when the link names none (else its first chart)."""
    st.session_state[RUN_KEY] = None
    presentation = st.sidebar.toggle("Presentation mode", value=qp_bool("present", False), key=PRESENT_KEY,
                                     help="The page as a slide: one chart, large, for screenshots and talks.")
    sync_url(present=presentation)
    if not presentation:
        if SLIDE_PARAM in st.query_params:
            del st.query_params[SLIDE_PARAM]
        return False
    wanted = st.query_params.get(SLIDE_PARAM)
    if wanted is not None and not CHART_NAME.fullmatch(wanted):
        notice_junk(SLIDE_PARAM, wanted, None)
        wanted = None
    run = SlideRun(title=title, wanted=wanted, headline=headline)
    st.session_state[RUN_KEY] = run
    st.html(SLIDE_CSS)  # our own constant stylesheet, never visitor text
    head = st.container(key="slidehead")
    head.title(title)
    line = head.container(horizontal=True, vertical_alignment="center")
    run.settings_slot = line.empty()
    run.png_slot = line.container(horizontal=True, width="content")
    line.button("Leave the slide", key="w_leave_slide", on_click=_leave, type="tertiary")
    return True


def _leave() -> None:
    st.session_state[PRESENT_KEY] = False


def enter(name: str) -> None:
    """A chart's Slide button: presentation mode, on that chart."""
    st.session_state[PRESENT_KEY] = True
    st.query_params[SLIDE_PARAM] = name


def claims(name: str) -> bool:
    """Whether the chart ``name``, about to be drawn, is this slide's chart (the one the link names, else the page's
    headline, else the first one drawn): it alone is drawn in a container the slide's stylesheet keeps."""
    run = current()
    if run is None:
        return False
    run.charts_drawn.append((run.section, len(run.settings)))
    if run.chosen is not None:
        return run.chosen == name
    if run.wanted is not None and run.wanted != name:
        return False
    if run.wanted is None and run.headline and not name.startswith(run.headline):
        return False
    run.chosen = name
    run.chosen_place = (run.section, len(run.settings))
    return True


def finish() -> None:
    """After the page's script: the settings line, from what its widgets showed (menu.py calls it)."""
    run = current()
    if run is None or run.settings_slot is None:
        return
    shown = settings_of(run)

    run.settings_slot.caption(plain(shown) if shown else "At its default settings.")


# ---- what the widgets show, for the settings line -------------------------------------------------------------

WIDGETS = ("slider", "select_slider", "selectbox", "radio", "multiselect", "toggle", "checkbox", "number_input",
           "text_input", "segmented_control", "pills")
SIDEBAR = "sidebar"  # a setting's place: the sidebar's widgets set every chart of the page
SIDEBAR_ROOT = RootContainer.SIDEBAR  # the root of a DeltaGenerator drawn in the sidebar
MAX_SHOWN = 80  # characters of one widget's value on the settings line (a long pasted text is cut)


def _shown(value, format_func, kind: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)) and (format_func is not None or kind in ("multiselect", "pills")):
        return ", ".join(str(format_func(v) if format_func else _shown(v, None)) for v in value)
    if format_func is not None:
        return str(format_func(value))
    if isinstance(value, (list, tuple)):
        return " – ".join(_shown(v, None) for v in value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)


def note_widget(kind: str, label, value, format_func=None, key=None, place=None) -> None:
    """Note what a widget shows for the slide's settings line (in presentation mode only)."""
    run = current()
    if run is not None:
        note(run, kind, label, value, format_func, key, place)


def note_section() -> None:
    """A header drawn in the main area: the widgets after it set the charts after it (in presentation mode only)."""
    run = current()
    if run is not None:
        run.section += 1


def note(run: SlideRun, kind: str, label, value, format_func=None, key=None, place=None) -> None:
    """Add what a widget shows (its label, its value as it shows it) to ``run``'s settings line; ``place``: SIDEBAR
    for a sidebar widget, else the main area's current section."""
    if key in (PRESENT_KEY, "w_leave_slide"):
        return
    try:
        text = _shown(value, format_func, kind)
    except Exception:  # a format_func that cannot format its own value: the line leaves it out, the page shows why
        return
    text = " ".join(text.split())
    if len(text) > MAX_SHOWN:
        text = text[: MAX_SHOWN - 1] + "…"
    label = " ".join(str(label or "").split())
    run.settings.append((label, f"“{text}”" if kind == "text_input" else text))
    run.places.append(place if place is not None else run.section)


def install_widget_notes() -> None:
    """Wrap Streamlit's widget functions (``st.slider`` and every container's ``.slider``, ...) so each notes
    what it shows; once per process. A wrapper returns exactly what the widget returned."""
    from streamlit.delta_generator import DeltaGenerator

    with _INSTALLING:  # two first visitors at once would wrap each function twice
        if getattr(DeltaGenerator, "_posviz_notes", False):
            return
        _install(DeltaGenerator)


_INSTALLING = threading.Lock()


def _install(DeltaGenerator) -> None:
    for kind in WIDGETS:
        original = getattr(DeltaGenerator, kind)

        def noted(self, label, *args, _original=original, _kind=kind, **kwargs):
            value = _original(self, label, *args, **kwargs)
            note_widget(_kind, label, value, kwargs.get("format_func"), kwargs.get("key"),
                        SIDEBAR if self._root_container == SIDEBAR_ROOT else None)
            return value

        functools.update_wrapper(noted, original)
        setattr(DeltaGenerator, kind, noted)
        # st.slider and the others are methods bound to the main area when streamlit is imported
        setattr(st, kind, getattr(st._main, kind))
    header = DeltaGenerator.header

    def sectioned(self, *args, _original=header, **kwargs):
        if self._root_container != SIDEBAR_ROOT:
            note_section()
        return _original(self, *args, **kwargs)

    functools.update_wrapper(sectioned, header)
    DeltaGenerator.header = sectioned
    st.header = st._main.header
    DeltaGenerator._posviz_notes = True


# ---- the slide's chart and its PNG ----------------------------------------------------------------------------

def container_key(name: str) -> str:
    """The key of the container a chart is drawn in: what the slide's stylesheet finds it by."""
    return "slide-" + re.sub(r"[^a-zA-Z0-9_-]", "-", name)


def _resized(view: dict, height: float) -> None:
    """``view``'s plot area ``height`` px tall (a fixed width keeps its aspect: a square stays square)."""
    if "hconcat" in view:
        for part in view["hconcat"]:
            _resized(part, height)
    elif "vconcat" in view:
        for part in view["vconcat"]:
            _resized(part, height / len(view["vconcat"]))
    elif "spec" in view:  # a facet: its cells share the height with their headers
        _resized(view["spec"], height * 0.85)
    else:
        old_w, old_h = view.get("width"), view.get("height")
        view["height"] = round(height)
        if isinstance(old_w, (int, float)) and isinstance(old_h, (int, float)) and old_h:
            view["width"] = round(height * old_w / old_h)
        for part in view.get("layer", []):  # a layer's own size would win over its chart's: the same size for all
            if "height" in part or "width" in part:
                _resized(part, height)
                if "width" in view:
                    part["width"] = view["width"]


def slide_spec(spec: dict, parts: int = 1) -> dict:
    """A chart's spec as a slide draws it: its plot area a ``parts``-th of the slide's height and every font scaled
    with the captions (``SLIDE_CHART_CONFIG`` over the chart's own settings)."""
    out = copy.deepcopy({k: v for k, v in spec.items() if k != "datasets"})
    _resized(out, SLIDE_PLOT_HEIGHT / parts)
    # room for the larger axis titles inside the chart's own box (the default 5 px cut them by 3 px); an object, as
    # Streamlit adds to it
    out["padding"] = {"left": 12, "right": 5, "top": 5, "bottom": 5}
    config = out.setdefault("config", {})
    for group, values in SLIDE_CHART_CONFIG.items():
        config[group] = {**config.get(group, {}), **values}
    if "datasets" in spec:
        out["datasets"] = spec["datasets"]
    return out


# The slide's PNG: (button label, width, height); the PNG is drawn at 1920×1080 and scaled for the smaller one
PNG_SIZES = (("PNG 1920×1080", 1920, 1080), ("PNG 1280×720", 1280, 720))


def offer_png(specs: list[dict], name: str, sentence: str | None) -> None:
    """The PNG buttons in the slide's head; each PNG is drawn when its button is pressed, with the settings line
    the run has written by then."""
    run = current()
    if run is None or run.png_slot is None:
        return
    for label, width, height in PNG_SIZES:
        run.png_slot.download_button(
            label, functools.partial(_png_now, specs, run, sentence, width, height),
            file_name=f"{name}-{width}x{height}.png", mime="image/png", key=f"png-slide-{width}",
            on_click="ignore", type="tertiary")


def _png_now(specs, run: SlideRun, sentence, width: int, height: int) -> bytes:
    from posviz.slides import slide_png

    return slide_png([_json_datasets(slide_spec(s, len(specs))) for s in specs], run.title, settings_of(run),
                     sentence, width, height, SLIDE_PNG_CONFIG)


def settings_of(run: SlideRun) -> str:
    """The settings the slide's chart can depend on: the sidebar's, and the main area's drawn before it, less those of
    another section that drew a chart of its own after them (they set that chart: the RoPE page's one-pair section).
    A widget drawn after the chart cannot set it. Before a chart is chosen (or outside a page run), every setting."""
    kept = [(label, value) for i, (label, value) in enumerate(run.settings) if value and _sets_the_chart(run, i)]
    return SEPARATOR.join(f"{label}: {value}" for label, value in kept)


def _sets_the_chart(run: SlideRun, i: int) -> bool:
    if run.chosen_place is None or i >= len(run.places):
        return True
    place, (section, noted_before) = run.places[i], run.chosen_place
    if place == SIDEBAR:
        return True
    if i >= noted_before:
        return False
    return place == section or not any(s == place and n > i for s, n in run.charts_drawn)


def _json_datasets(spec: dict) -> dict:
    """``spec`` with its datasets as rows (Streamlit's copies hold them as Arrow streams)."""
    import math

    import pyarrow as pa

    out = dict(spec)
    datasets = {}
    for name, values in spec.get("datasets", {}).items():
        if isinstance(values, (bytes, bytearray)):
            values = pa.ipc.open_stream(values).read_all().to_pylist()
        datasets[name] = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
                          for row in values]
    if datasets:
        out["datasets"] = datasets
    return out
