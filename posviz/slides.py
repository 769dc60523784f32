"""A chart as a slide: the PNG of the slide at an exact size, and the sentences under a chart that say, from its
data, what it shows.

The app's presentation mode (``views/_slide.py``) draws one chart large under the page's title and a line
stating the settings; ``slide_png`` draws the same slide as a picture of exactly ``width``×``height`` pixels
with Vega-Lite's own renderer (vl-convert, no browser): the title, the settings line, the chart's views one
under the other, and the sentence. The sentences are written from the numbers the chart draws, never fixed.
"""
from __future__ import annotations

import copy
import io
import textwrap
from typing import Mapping, Sequence

import pandas as pd

from posviz.display import display_name
# Every text of the PNG (title, settings line, axes, legend, sentence) in the app's own Source Sans
from posviz.slide_font import font_for

SLIDE_WIDTH = 1920  # px: a slide is designed at 1920 wide and drawn scaled (by Vega's renderer, so text stays sharp)
PAD = 40  # px around the slide
SENTENCE_CHARACTERS = 110  # a line of the sentence at 26 px in 1,840 px
# Type a hall can read at 1920 px (scaled with the slide at 1280): the title, the settings line, the sentence.
TITLE_SIZE, SETTINGS_SIZE, SENTENCE_SIZE = 52, 26, 26
HEAD_GAP = 20  # px between the settings line and the chart
SEPARATOR = "  ·  "  # between two settings (views._slide.settings_of joins them with it)
FIT_ROUNDS = 4  # renders to fit the chart to its box (each a few tenths of a second)


def _sentence_view(sentence: str) -> dict:
    lines = textwrap.wrap(sentence, SENTENCE_CHARACTERS) or [""]
    return {"data": {"values": [{"line": line, "row": i} for i, line in enumerate(lines)]},
            "mark": {"type": "text", "align": "left", "baseline": "top", "fontSize": SENTENCE_SIZE, "color": "#31333F",
                     "font": font_for(sentence)},
            "encoding": {"text": {"field": "line"}, "x": {"value": 0},
                         "y": {"field": "row", "type": "ordinal", "axis": None, "scale": {"paddingOuter": 0}}},
            "width": SLIDE_WIDTH - 2 * PAD - 40, "height": round(1.4 * SENTENCE_SIZE) * len(lines),
            "view": {"stroke": None}}


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
    else:
        view["_posviz_square"] = True  # a fixed width came with it: it keeps its aspect when fitted


def _plots(view: dict):
    """Every plot of ``view`` that has a size of its own (in concatenations, facets and layers)."""
    for key in ("hconcat", "vconcat", "concat"):
        for part in view.get(key, []):
            yield from _plots(part)
    if "spec" in view:
        yield from _plots(view["spec"])
    if "width" in view or "height" in view:
        yield view
    for part in view.get("layer", []):
        if "width" in part or "height" in part:
            yield part


def _scaled(body: list[dict], mw: float, mh: float) -> list[dict]:
    """The body with every plot's width times ``mw`` and height times ``mh`` (a plot that keeps its aspect: both
    times the smaller)."""
    out = copy.deepcopy(body)
    for part in out:
        squares = {id(p) for p in _plots(part) if p.pop("_posviz_square", False)}
        for plot in _plots(part):
            fw, fh = (min(mw, mh),) * 2 if id(plot) in squares else (mw, mh)
            if isinstance(plot.get("width"), (int, float)):
                plot["width"] = max(20, round(plot["width"] * fw))
            if isinstance(plot.get("height"), (int, float)):
                plot["height"] = max(20, round(plot["height"] * fh))
    return out


def _merged_config(views: Sequence[dict], config: Mapping[str, Mapping]) -> dict:
    merged = {}
    for view in views:
        for group, values in view.get("config", {}).items():
            merged[group] = {**merged.get(group, {}), **values} if isinstance(values, Mapping) else values
    for group, values in config.items():
        merged[group] = {**merged.get(group, {}), **values}
    merged["font"] = font_for(" ".join(_strings(views)))  # the axes' and legends' labels: the charts' own text
    return merged


def _strings(value, found: set | None = None) -> set:
    """Every string a chart's spec holds (its titles, its data's names), where a visitor's text could be drawn."""
    found = set() if found is None else found
    if isinstance(value, str):
        found.add(value)
    elif isinstance(value, Mapping):
        for part in value.values():
            _strings(part, found)
    elif isinstance(value, (list, tuple)):
        for part in value:
            _strings(part, found)
    return found


def slide_spec(views: Sequence[dict], title: str, settings: str, sentence: str | None,
               config: Mapping[str, Mapping]) -> dict:
    """One Vega-Lite spec for the whole slide, as the PNG is drawn at its natural size: ``views`` (each a chart's
    spec, datasets as rows) under the title and the settings line, the sentence under them."""
    spec = _body_spec(views, sentence, config)
    spec["title"] = _title(title, settings)
    return spec


SETTINGS_CHARACTERS = 125  # a line of the settings line at 26 px in 1,840 px
SETTINGS_LINES = 3  # at most: the chart keeps the rest of the canvas


def settings_lines(settings: str) -> list[str]:
    """The settings line wrapped at its separators into lines a 1920-px canvas shows whole (one line of a long
    document's name cut its later settings off with an ellipsis: Compare's "Method A", "Method B", "Length")."""
    lines: list[str] = []
    for part in (settings or "").split(SEPARATOR):
        if lines and len(lines[-1]) + len(SEPARATOR) + len(part) <= SETTINGS_CHARACTERS:
            lines[-1] += SEPARATOR + part
        else:
            lines.append(part)
    return lines[:SETTINGS_LINES] or [""]


def _title(title: str, settings: str) -> dict:
    return {"text": title, "subtitle": settings_lines(settings), "anchor": "start", "fontSize": TITLE_SIZE, "offset": HEAD_GAP,
            "subtitleFontSize": SETTINGS_SIZE, "subtitleColor": "#555", "subtitlePadding": 10, "font": font_for(title),
            "subtitleFont": font_for(settings or ""), "limit": SLIDE_WIDTH - 2 * PAD, "subtitleLimit": SLIDE_WIDTH - 2 * PAD} if title else {}


def _body_spec(views: Sequence[dict], sentence: str | None, config: Mapping[str, Mapping], mw: float = 1.0,
               mh: float = 1.0) -> dict:
    datasets, body = {}, []
    for view in views:
        datasets.update(view.get("datasets", {}))
        part = {k: v for k, v in view.items() if k not in ("$schema", "config", "datasets")}
        _plot_width(part, SLIDE_WIDTH - 2 * PAD - 420)  # room for a legend beside the plot
        body.append(part)
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "vconcat": _scaled(body, mw, mh) + ([_sentence_view(sentence)] if sentence else []), "spacing": 24,
            "config": _merged_config(views, config), "background": "white", "padding": 0}
    if not body:  # the sentence alone
        spec["vconcat"] = spec["vconcat"][-1:]
    if datasets:
        spec["datasets"] = datasets
    return spec


def _render(spec: dict, scale: float):
    import vl_convert as vlc
    from PIL import Image

    return Image.open(io.BytesIO(vlc.vegalite_to_png(spec, scale=scale))).convert("RGB")


def _head(title: str, settings: str, scale: float):
    """The slide's head (title and settings line) as a picture, at ``scale``."""
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "title": _title(title, settings),
            "data": {"values": [{}]}, "mark": {"type": "point", "opacity": 0}, "width": 1, "height": 1,
            "config": {"view": {"stroke": None}, "font": font_for(f"{title} {settings}")}, "background": "white", "padding": 0}
    picture = _render(spec, scale)
    return picture.crop((0, 0, picture.width, max(1, picture.height - round(3 * scale))))  # less the 1-px plot


def head_height(title: str, settings: str, width: int) -> int:
    """The height (px) of a slide's head in its ``width``-wide PNG: where the chart may start."""
    scale = width / SLIDE_WIDTH
    return round(PAD * scale) + _head(title, settings, scale).height + round(HEAD_GAP * scale)


def _fitted_body(views, sentence, config, box_w: int, box_h: int, scale: float):
    """The charts and the sentence drawn to fill ``box_w`` × ``box_h`` px as nearly as their shapes allow: every
    plot's width and height scaled until the whole (axes, legends, titles included) meets the box. What a plot
    adds around itself does not scale with it, so each dimension is fitted by the secant method on the rendered size."""
    tries = []  # (mw, mh, picture)
    mw = mh = 1.0
    for _ in range(FIT_ROUNDS):
        picture = _render(_body_spec(views, sentence, config, mw, mh), scale)
        tries.append((mw, mh, picture))
        if abs(picture.width - box_w) <= 0.02 * box_w and abs(picture.height - box_h) <= 0.02 * box_h and \
                picture.width <= box_w and picture.height <= box_h:
            break
        mw, mh = (_next(tries, 0, box_w, "width"), _next(tries, 1, box_h, "height"))
    fitting = [t for t in tries if t[2].width <= box_w and t[2].height <= box_h]
    return max(fitting, key=lambda t: t[2].width * t[2].height)[2] if fitting else tries[-1][2]


def _next(tries, index: int, target: int, side: str) -> float:
    """The next multiplier of one dimension: the secant through the last two tries (the proportional step after
    one), aiming 1 % inside the box."""
    target = 0.99 * target
    m1, size1 = tries[-1][index], getattr(tries[-1][2], side)
    if len(tries) < 2 or getattr(tries[-2][2], side) == size1 or tries[-2][index] == m1:
        return max(0.2, m1 * target / max(1, size1))
    m0, size0 = tries[-2][index], getattr(tries[-2][2], side)
    slope = (size1 - size0) / (m1 - m0)
    return max(0.2, min(8.0, m1 + (target - size1) / slope)) if slope > 0 else max(0.2, m1 * target / max(1, size1))


def slide_png(views: Sequence[dict], title: str, settings: str, sentence: str | None, width: int, height: int,
              config: Mapping[str, Mapping]) -> bytes:
    """The slide as a PNG of exactly ``width``×``height`` px: the head (title, settings line) at the top left, the
    sentence at the bottom, and between them the charts fitted to the rest of the canvas (``_fitted_body``), in
    the type sizes of a 1920-px slide scaled to ``width``, shrunk to fit only where a chart's shape cannot be
    fitted otherwise."""
    from PIL import Image

    scale = width / SLIDE_WIDTH
    pad = round(PAD * scale)
    head = _head(title, settings, scale)
    top = pad + head.height + round(HEAD_GAP * scale)
    words = _render(_body_spec([], sentence, config), scale) if sentence else None
    under = words.height + round(24 * scale) if words is not None else 0
    box_w, box_h = width - 2 * pad, height - top - pad - under
    body = _fitted_body(views, None, config, box_w, box_h, scale)
    if body.width > box_w or body.height > box_h:
        fit = min(box_w / body.width, box_h / body.height)
        body = body.resize((max(1, int(body.width * fit)), max(1, int(body.height * fit))), Image.LANCZOS)
    canvas = Image.new("RGB", (width, height), "white")
    canvas.paste(head.crop((0, 0, min(head.width, box_w), head.height)), (pad, pad))
    canvas.paste(body, (pad + (box_w - body.width) // 2, top))
    if words is not None:
        canvas.paste(words.crop((0, 0, min(words.width, box_w), words.height)), (pad, top + body.height + round(24 * scale)))
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
