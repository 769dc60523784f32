"""A chart as a slide: the PNG of the slide at an exact size, and the sentences under a chart that say, from its
data, what it shows.

The app's presentation mode (``views/_slide.py``) draws one chart large under the page's title and a line
stating the settings; ``slide_png`` draws the same slide as a picture of exactly ``width``×``height`` pixels
with Vega-Lite's own renderer (vl-convert, no browser): the title, the settings line, the chart's views one
under the other, and the sentence. The sentences are written from the numbers the chart draws, never fixed.
"""
from __future__ import annotations

import io
import textwrap
from typing import Mapping, Sequence

import pandas as pd

from posviz.display import display_name

SLIDE_WIDTH = 1920  # px: a slide is drawn at 1920 wide and scaled (by Vega's renderer, so text stays sharp)
PAD = 40  # px around the slide
SENTENCE_CHARACTERS = 120  # a line of the sentence at 24 px in 1,840 px


def _sentence_view(sentence: str) -> dict:
    lines = textwrap.wrap(sentence, SENTENCE_CHARACTERS) or [""]
    return {"data": {"values": [{"line": line, "row": i} for i, line in enumerate(lines)]},
            "mark": {"type": "text", "align": "left", "baseline": "top", "fontSize": 24, "color": "#31333F"},
            "encoding": {"text": {"field": "line"}, "x": {"value": 0},
                         "y": {"field": "row", "type": "ordinal", "axis": None, "scale": {"paddingOuter": 0}}},
            "width": SLIDE_WIDTH - 2 * PAD - 40, "height": 34 * len(lines), "view": {"stroke": None}}


def _plot_width(view: dict, width: int) -> None:
    """A view that stretched to the page's width gets an explicit one (Vega's renderer has no page)."""
    if "hconcat" in view:
        for part in view["hconcat"]:
            _plot_width(part, width // len(view["hconcat"]))
    elif "vconcat" in view:
        for part in view["vconcat"]:
            _plot_width(part, width)
    elif "spec" in view:  # a facet: about three cells side by side
        _plot_width(view["spec"], width // 3)
    elif not isinstance(view.get("width"), (int, float)):
        view["width"] = width


def slide_spec(views: Sequence[dict], title: str, settings: str, sentence: str | None,
               config: Mapping[str, Mapping]) -> dict:
    """One Vega-Lite spec for the whole slide: ``views`` (each a chart's spec, datasets as rows) under the title
    and the settings line, the sentence under them."""
    datasets, body = {}, []
    for view in views:
        datasets.update(view.get("datasets", {}))
        part = {k: v for k, v in view.items() if k not in ("$schema", "config", "datasets")}
        _plot_width(part, SLIDE_WIDTH - 2 * PAD - 420)  # room for a legend beside the plot
        body.append(part)
    merged = {}
    for view in views:
        for group, values in view.get("config", {}).items():
            merged[group] = {**merged.get(group, {}), **values} if isinstance(values, Mapping) else values
    for group, values in config.items():
        merged[group] = {**merged.get(group, {}), **values}
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "title": {"text": title, "subtitle": settings or "", "anchor": "start", "fontSize": 40, "offset": 24,
                      "subtitleFontSize": 20, "subtitleColor": "#555", "subtitlePadding": 10},
            "vconcat": body + ([_sentence_view(sentence)] if sentence else []), "spacing": 24,
            "config": merged, "background": "white", "padding": PAD}
    if datasets:
        spec["datasets"] = datasets
    return spec


def slide_png(views: Sequence[dict], title: str, settings: str, sentence: str | None, width: int, height: int,
              config: Mapping[str, Mapping]) -> bytes:
    """The slide as a PNG of exactly ``width``×``height`` px: drawn at ``SLIDE_WIDTH`` scaled to ``width``, shrunk
    to fit when taller, on white."""
    import vl_convert as vlc
    from PIL import Image

    scale = width / SLIDE_WIDTH
    raw = vlc.vegalite_to_png(slide_spec(views, title, settings, sentence, config), scale=scale)
    picture = Image.open(io.BytesIO(raw)).convert("RGB")
    if picture.width > width or picture.height > height:
        fit = min(width / picture.width, height / picture.height)
        picture = picture.resize((max(1, int(picture.width * fit)), max(1, int(picture.height * fit))),
                                 Image.LANCZOS)
    canvas = Image.new("RGB", (width, height), "white")
    canvas.paste(picture, ((width - picture.width) // 2, 0))
    out = io.BytesIO()
    canvas.save(out, format="PNG", optimize=True)
    return out.getvalue()


# ---- sentences from the data -----------------------------------------------------------------------------------

def _number(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def extremes_sentence(data: pd.DataFrame, series: str, x: str, y: str, what: str, x_words,
                      lower_is_better: bool = True, names=None, digits: int = 2, at=None) -> str | None:
    """"At <x>, <best> has the lowest <what> (v) and <worst> the highest (v)", from the chart's own rows: at the
    largest ``x`` drawn, or the largest one up to ``at``. ``x_words(x)`` says an ``x`` in words, ``names`` a series (its display name by default: an id or a name in)."""
    names = names or display_name
    if data.empty or not {series, x, y} <= set(data.columns):
        return None
    rows = data[[series, x, y]].dropna()
    rows = rows[pd.to_numeric(rows[y], errors="coerce").notna()]
    if at is not None:
        rows = rows[rows[x] <= at]
    if rows.empty:
        return None
    at = rows[x].max()
    last = rows[rows[x] == at].groupby(series)[y].mean().sort_values()
    if last.empty:
        return None
    best, worst = (last.index[0], last.index[-1]) if lower_is_better else (last.index[-1], last.index[0])
    low, high = "lowest" if lower_is_better else "highest", "highest" if lower_is_better else "lowest"
    if len(last) == 1:
        return f"At {x_words(at)}, {names(best)} reads {_number(last[best], digits)} {what}."
    return (f"At {x_words(at)}, {names(best)} has the {low} {what} ({_number(last[best], digits)}) and "
            f"{names(worst)} the {high} ({_number(last[worst], digits)}), of {len(last)} drawn.")


def multiple_words(multiple: float) -> str:
    """A multiple of the training length as a person writes it: "4×", "1.5×", "1/64×" (not "0.015625×")."""
    if multiple >= 1 or multiple <= 0:
        return f"{multiple:g}×"
    inverse = 1 / multiple
    return f"1/{round(inverse)}×" if abs(inverse - round(inverse)) < 1e-9 else f"{multiple:.2g}×"


def length_words(train_length: int | None, unit: str = "byte"):
    """``x_words`` for an axis of lengths: "4,096 bytes (16× the training length)"."""
    def words(length) -> str:
        multiple = f" ({multiple_words(float(length) / train_length)} the training length)" if train_length else ""
        return f"{int(length):,} {unit}s{multiple}"
    return words


def means_sentence(data: pd.DataFrame, series: str, y: str, what: str, names=None, digits: int = 2) -> str | None:
    """"Averaged over the chart, a reads 1.23 <what> and b 1.45: a is lower by 0.22", from the chart's own rows."""
    names = names or display_name
    if data.empty or not {series, y} <= set(data.columns):
        return None
    means = data[[series, y]].dropna().groupby(series, sort=False)[y].mean()
    if len(means) < 2:
        return None
    said = ", ".join(f"{names(s)} {_number(v, digits)}" for s, v in means.items())
    low, high = means.idxmin(), means.idxmax()
    return (f"Averaged over the chart, {what}: {said}; {names(low)} is lower than {names(high)} by "
            f"{_number(means[high] - means[low], digits)}.")


def ranking_sentence(data: pd.DataFrame, series: str, y: str, what: str, lower_is_better: bool = True,
                     names=None, digits: int = 3) -> str | None:
    """"<best> has the lowest <what> (v) and <worst> the highest (v), of n", from the chart's own rows."""
    names = names or display_name
    if data.empty or not {series, y} <= set(data.columns):
        return None
    values = data[[series, y]].dropna().groupby(series, sort=False)[y].mean().sort_values()
    if len(values) < 2:
        return None
    best, worst = (values.index[0], values.index[-1]) if lower_is_better else (values.index[-1], values.index[0])
    low, high = ("lowest", "highest") if lower_is_better else ("highest", "lowest")
    return (f"{names(best)} has the {low} {what} ({_number(values[best], digits)}) and {names(worst)} the {high} "
            f"({_number(values[worst], digits)}), of {len(values)} drawn.")
