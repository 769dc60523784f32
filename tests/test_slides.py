"""Presentation mode is a slide (issue #56): one chart of the page, large, under its title and one line stating the
settings, a sentence from the data under it, its PNG at exactly 1920×1080 and 1280×720; a Slide button beside each
chart. What a person sees of it in a browser (the sidebar closed, the chart on the first screen and covering a
third of it) is checked for every page in test_browser.py; the pages' sentences are read here against the numbers.
"""
from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from test_pages_explore import ROPE, chart_frames, open_page

from posviz.labs import kv_cache
from posviz.slides import extremes_sentence, length_words, slide_png
from views import _slide


def slide_charts(at) -> list[dict]:
    """The specs drawn at a slide's size (the slide's own chart): every other chart keeps its page size."""
    return [spec for spec, _ in chart_frames(at) if spec.get("height") == _slide.SLIDE_PLOT_HEIGHT]


def styles(at) -> str:
    return " ".join(h.proto.body for h in at.get("html"))


def texts(at) -> list[str]:
    return [m.value for m in at.markdown] + [c.value for c in at.caption]


def test_the_rope_page_as_a_slide_shows_its_headline_chart_with_the_settings_and_a_sentence(tiny_models):
    at = open_page(ROPE, present="1", hd="32", rbase="10000")
    assert at.title[0].value.startswith("RoPE")
    # the slide's chart: the frequencies (the page's headline), drawn large with fonts a hall reads, alone
    (spec,) = slide_charts(at)
    assert spec["config"]["axis"]["labelFontSize"] >= 16 and spec["config"]["legend"]["labelFontSize"] >= 16
    assert "stSidebar" in styles(at) and "wavelength" in json.dumps(spec)
    # the settings line states what the widgets show, as they show it
    line = _slide.settings_of(at.session_state[_slide.RUN_KEY])
    assert "head dimension d: 32" in line and "base: 10,000" in line, line
    # and only what the chart depends on: not the one-pair section's position above it, nor the sections below it
    assert "position m" not in line and "query position" not in line and "extension factor" not in line, line
    # the sentence from the table: pair i turns at θ_i = 10000^(-2i/32); a pair never completes a turn in training
    # when its wavelength 2π/θ_i exceeds the training length (32 positions on the tiny checkpoints)
    wavelengths = [2 * math.pi / 10000 ** (-2 * i / 32) for i in range(16)]
    never = sum(w > 32 for w in wavelengths)
    sentence = [t for t in texts(at) if "fastest of the 16 pairs" in t]
    assert len(sentence) == 1 and f"{never} of them never complete a turn" in sentence[0], texts(at)
    assert f"{min(wavelengths):,.1f}" in sentence[0].replace("\\", "") and f"{max(wavelengths):,.0f}" in sentence[0].replace("\\", "")
    assert not at.sidebar.markdown  # no device line or checkpoint table under a closed sidebar


def test_a_link_names_the_slides_chart_and_junk_in_it_is_refused_with_a_notice(tiny_models):
    at = open_page(ROPE, present="1", slide="rope_one_pair")
    (spec,) = slide_charts(at)  # the link's chart, not the headline: a square, kept square
    assert spec["width"] == spec["height"] == _slide.SLIDE_PLOT_HEIGHT and "wavelength" not in json.dumps(spec)
    at = open_page(ROPE, present="1", slide="<b>x</b>")
    assert any("Ignored URL parameter slide=" in w.value for w in at.warning)
    assert len(slide_charts(at)) == 1  # the headline instead


def test_the_slide_button_turns_the_page_into_that_charts_slide_and_back(tiny_models):
    at = open_page(ROPE, hd="32")
    assert not slide_charts(at) and at.query_params["present"] == "0"
    at.button(key="to-slide-rope_frequencies_d32").click().run()
    assert at.query_params["present"] == "1" and at.query_params["slide"] == "rope_frequencies_d32"
    assert len(slide_charts(at)) == 1
    at.button(key="w_leave_slide").click().run()
    assert at.query_params["present"] == "0" and "slide" not in at.query_params and not slide_charts(at)


@pytest.mark.parametrize("width, height", [(1920, 1080), (1280, 720)])
def test_a_slides_png_is_exactly_its_size_with_title_chart_and_sentence(width, height):
    data = pd.DataFrame({"x": [1, 2, 3, 1, 2, 3], "y": [1.0, 2.0, 3.0, 3.0, 2.0, 1.0], "c": list("aaabbb")})
    view = {"data": {"values": data.to_dict("records")}, "mark": "line",
            "encoding": {"x": {"field": "x", "type": "quantitative"}, "y": {"field": "y", "type": "quantitative"},
                         "color": {"field": "c", "type": "nominal"}}, "height": _slide.SLIDE_PLOT_HEIGHT}
    png = slide_png([view], "A title", "length: 4,096", "A sentence under the chart.", width, height,
                    _slide.SLIDE_CHART_CONFIG)
    picture = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    assert picture.shape == (height, width)
    dark = picture < 128
    assert dark[: height // 10].any(), "no title drawn at the top"
    assert dark[height // 5: height * 4 // 5].sum() > 500, "no chart drawn in the middle"
    blank = slide_png([view], "A title", "length: 4,096", None, width, height, _slide.SLIDE_CHART_CONFIG)
    assert blank != png  # the sentence is drawn


@pytest.mark.parametrize("width, height", [(1920, 1080), (1280, 720)])
@pytest.mark.parametrize("shape", ["line", "square", "stacked"])
def test_a_slides_png_fills_its_canvas_in_a_projectors_type(width, height, shape):
    """Issue #72: the chart filled 36-58 % of the PNG's width. Below the head, the drawn content now spans at least
    75 % of the width and 70 % of the height, for a wide chart, a square map (which keeps its aspect: it fills the
    height) and two charts one under the other; the type is a projector's (axis labels and legend >= 20 px at 1920,
    the title >= 48), in one sans-serif, and the PNG takes Streamlit's category colours, as the screen does."""
    from posviz import slides
    from posviz_tools.slide_fill import GOAL_HEIGHT, GOAL_WIDTH, filled

    data = pd.DataFrame({"x": list(range(12)) * 2, "y": [float(i % 5) for i in range(24)], "c": ["a"] * 12 + ["b"] * 12})
    line = {"data": {"values": data.to_dict("records")}, "mark": "line", "height": _slide.SLIDE_PLOT_HEIGHT,
            "encoding": {"x": {"field": "x", "type": "quantitative", "title": "length (bytes)"},
                         "y": {"field": "y", "type": "quantitative", "title": "bits per byte"},
                         "color": {"field": "c", "type": "nominal"}}}
    square = {"data": {"values": [{"r": r, "k": k, "v": r - k} for r in range(8) for k in range(8)]}, "mark": "rect",
              "width": 300, "height": 300, "encoding": {"x": {"field": "k", "type": "ordinal"}, "y": {"field": "r", "type": "ordinal"},
                                                        "color": {"field": "v", "type": "quantitative"}}}
    views = {"line": [line], "square": [square], "stacked": [_slide.slide_spec(line, 2), _slide.slide_spec(line, 2)]}[shape]
    views = [_slide.slide_spec(v) if shape != "stacked" else v for v in views]
    png = slide_png(views, "Extrapolation lab", "Checkpoints: RoPE, ALiBi", "At 4,096 bytes, ALiBi is lowest.", width,
                    height, _slide.SLIDE_PNG_CONFIG)
    assert Image.open(io.BytesIO(png)).size == (width, height)
    w, h = filled(png, slides.head_height("Extrapolation lab", "Checkpoints: RoPE, ALiBi", width))
    assert w >= GOAL_WIDTH or shape == "square", (w, h)  # a square is as wide as the height allows
    assert h >= GOAL_HEIGHT, (w, h)
    config = _slide.SLIDE_PNG_CONFIG
    assert min(config["axis"]["labelFontSize"], config["legend"]["labelFontSize"]) >= 20 and slides.TITLE_SIZE >= 48
    assert config["range"]["category"] == _slide.STREAMLIT_CATEGORY


def _fonts_named(spec) -> set[str]:
    """Every font a Vega-Lite spec names (a mark's, the title's and subtitle's, the config's)."""
    if isinstance(spec, dict):
        found = {v for k, v in spec.items() if k in ("font", "subtitleFont", "labelFont", "titleFont") and isinstance(v, str)}
        return found.union(*(_fonts_named(v) for v in spec.values()))
    if isinstance(spec, list):
        return set().union(*(_fonts_named(v) for v in spec))
    return set()


def test_the_png_is_drawn_in_the_apps_own_source_sans_at_the_weights_asked_for():
    """Issue #72: the settings line was drawn in a serif, the rest in the renderer's Liberation Sans. Every text of a
    slide names the family of the file Streamlit serves the app's Source Sans from (read here with fontTools, apart
    from posviz.slide_font), and the renderer draws it: a text in it differs from the same text in the fallback
    (as an unknown family is not: the same pixels whatever its name), and a bold title is darker than a normal one (the
    variable font's default instance, ExtraLight 200, is what the renderer drew for every weight before the
    weights were cut from it)."""
    import vl_convert as vlc
    from fontTools.ttLib import TTFont

    from posviz import slide_font, slides

    woff2 = slide_font.streamlit_font_file()
    assert woff2 is not None, "the installed Streamlit serves no SourceSansVF-Upright*.woff2: see posviz/slide_font.py"
    names = TTFont(str(woff2))["name"]
    family = names.getDebugName(16) or names.getDebugName(1)
    assert "Source Sans" in family.replace("SourceSans", "Source Sans"), family
    assert slide_font.slide_font() == family, slide_font.slide_font_source()
    spec = slides.slide_spec([{"data": {"values": [{"x": 1, "y": 2}]}, "mark": "point",
                               "encoding": {"x": {"field": "x", "type": "quantitative"}}}],
                             "A title", "Length: 4,096", "A sentence.", _slide.SLIDE_PNG_CONFIG)
    assert _fonts_named(spec) == {family}

    def drawn(font: str, weight: str = "normal") -> np.ndarray:
        text = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "background": "white",
                "data": {"values": [{"t": "Bits per byte past 256 Wg"}]}, "width": 700, "height": 60,
                "mark": {"type": "text", "font": font, "fontSize": 40, "fontWeight": weight, "align": "left", "x": 0},
                "encoding": {"text": {"field": "t"}}, "config": {"view": {"stroke": None}}}
        return np.asarray(Image.open(io.BytesIO(vlc.vegalite_to_png(text))).convert("L"), dtype=float)

    unknown = drawn("No Such Family Anywhere")
    assert np.array_equal(unknown, drawn("Nor This One"))  # what any family the renderer does not know looks like
    normal, bold = drawn(family), drawn(family, "bold")
    for other, what in ((unknown, "an unknown family"), (drawn(slide_font.FALLBACK), "the fallback")):
        assert normal.shape != other.shape or np.abs(normal - other).mean() > 1.0, f"the family is drawn as {what}"
    assert (255 - bold).sum() > 1.3 * (255 - normal).sum(), "bold is drawn no heavier than normal"


def test_a_text_the_app_font_cannot_draw_is_drawn_in_the_fallback_not_as_boxes():
    """A visitor's document in Hebrew names its first words in the settings line: Source Sans has no Hebrew, and the
    renderer draws a character its font lacks as a box (no fallback to another font), so that text, and only that
    text, is drawn in Liberation Sans, which has it."""
    import vl_convert as vlc

    from posviz import slide_font, slides

    family, hebrew = slide_font.slide_font(), "שלום עולם"
    assert slide_font.font_for("Length: 4,096 · θ ≥ 1× − …") == family
    assert slide_font.font_for(f"Document: {hebrew}") == slide_font.FALLBACK
    spec = slides.slide_spec([{"data": {"values": [{"x": 1, "model": "RoPE"}]}, "mark": "point",
                               "encoding": {"x": {"field": "x", "type": "quantitative"}}}],
                             "Extrapolation lab", f"Document: {hebrew}", "A sentence.", _slide.SLIDE_PNG_CONFIG)
    assert spec["title"]["font"] == family and spec["title"]["subtitleFont"] == slide_font.FALLBACK
    assert spec["config"]["font"] == family  # the charts' own labels are the app's

    def drawn(font: str) -> np.ndarray:
        text = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "background": "white",
                "data": {"values": [{"t": hebrew}]}, "width": 400, "height": 60,
                "mark": {"type": "text", "font": font, "fontSize": 40, "align": "left", "x": 0},
                "encoding": {"text": {"field": "t"}}, "config": {"view": {"stroke": None}}}
        return np.asarray(Image.open(io.BytesIO(vlc.vegalite_to_png(text))).convert("L"), dtype=float)

    boxes, letters = drawn(family), drawn(slide_font.font_for(hebrew))
    assert boxes.shape != letters.shape or np.abs(boxes - letters).mean() > 1.0, "the Hebrew is drawn as boxes"


def test_without_streamlits_font_file_the_png_says_why_and_draws_in_the_fallback(monkeypatch):
    """Another Streamlit release may rename its font file: the slide still draws, in the renderer's sans-serif, and
    posviz says what it did not find."""
    from posviz import slide_font

    monkeypatch.setattr(slide_font, "_found", None)
    monkeypatch.setattr(slide_font, "streamlit_font_file", lambda: None)
    assert slide_font.slide_font() == slide_font.FALLBACK
    assert "SourceSansVF-Upright" in slide_font.slide_font_source()
    view = {"data": {"values": [{"x": 1, "y": 2}, {"x": 2, "y": 1}]}, "mark": "line",
            "encoding": {"x": {"field": "x", "type": "quantitative"}, "y": {"field": "y", "type": "quantitative"}}}
    png = slide_png([_slide.slide_spec(view)], "A title", "Length: 4,096", "A sentence.", 1280, 720,
                    _slide.SLIDE_PNG_CONFIG)
    assert Image.open(io.BytesIO(png)).size == (1280, 720)


def test_the_sentence_names_the_lowest_and_highest_at_the_longest_length_drawn():
    rows = pd.DataFrame({"model": ["a", "b", "c", "a", "b", "c"], "length": [256, 256, 256, 1024, 1024, 1024],
                         "bpb": [1.0, 1.1, 1.2, 3.0, 1.5, np.nan]})
    said = extremes_sentence(rows, "model", "length", "bpb", "bits per byte", length_words(256))
    # c has no value at 1,024 (it cannot run there): of the two drawn, b is lowest, a highest
    assert said == ("At 1,024 bytes (4× the training length), b has the lowest bits per byte (1.50) and a the highest "
                    "(3.00), of 2 drawn.")
    assert "256 bytes (1×" in extremes_sentence(rows, "model", "length", "bpb", "bits per byte", length_words(256), at=512)
    assert extremes_sentence(rows.iloc[:0], "model", "length", "bpb", "x", str) is None


def test_the_kv_diagrams_sentence_counts_the_shifted_caches_stale_keys():
    # In pass t+1 of a window of W, the shifted cache recomputes only the newest byte; every other key was
    # computed at W-1 and now sits at W-2, W-3, ...: all W-1 are read at another position. The others: none.
    for window in (4, 8, 16):
        said = kv_cache.diagram_sentence(kv_cache.two_pass_diagram(window))
        assert f"“{kv_cache.STRATEGY_TITLES['shifted_cache']}” reads {window - 1} of its {window} bytes" in said
        assert "the other 3 strategies" in said


def test_the_settings_line_says_what_each_widget_shows():
    run = _slide.SlideRun(title="t", wanted=None)
    _slide.note(run, "select_slider", "base", 10000, lambda b: f"{b:,}")
    _slide.note(run, "multiselect", "Checkpoints", ["rope", "alibi"], str.upper)
    _slide.note(run, "toggle", "All checkpoints", False)
    _slide.note(run, "text_input", "Formula", "-d*" + "x" * 200)
    _slide.note(run, "slider", "length", (16, 2048))
    _slide.note(run, "multiselect", "dimensions", [0, 2, 16])
    _slide.note(run, "toggle", "Presentation mode", True, key=_slide.PRESENT_KEY)
    shown = dict(run.settings)
    assert shown["base"] == "10,000" and shown["Checkpoints"] == "ROPE, ALIBI" and shown["All checkpoints"] == "off"
    assert shown["Formula"].startswith("“-d*x") and len(shown["Formula"]) <= _slide.MAX_SHOWN + 2
    assert shown["length"] == "16 – 2,048" and shown["dimensions"] == "0, 2, 16" and "Presentation mode" not in shown
    assert json.dumps(run.settings)  # plain strings


def test_a_multiple_of_the_training_length_is_written_as_a_person_writes_it():
    from posviz.slides import multiple_words

    assert [multiple_words(m) for m in (4, 1, 1.5, 1 / 64, 0.5, 0.3)] == ["4×", "1×", "1.5×", "1/64×", "1/2×", "0.3×"]


def test_the_decay_sentence_reads_the_bound_at_both_ends():
    from posviz.explore import rope

    # at distance 0 every S_j = j, so the relative bound (1/(d/2)) Σ_{j=1}^{d/2} |S_j| is (d/2 + 1) / 2: 8.5 for d = 32
    said = rope.decay_sentence(rope.rope_decay_bound(32, 10_000, 1024))
    assert said.startswith("The bound on a query–key score starts at 8.50") and "distance 1,024" in said


def test_two_maps_compared_share_one_colour_scale():
    from posviz.labs.compare import opening_pair, shared_range
    from views._matrices import _colorize

    a, b = np.array([[-3.5, -1.0], [0.0, np.nan]]), np.array([[-6.0, -1.0], [0.0, -3.5]])
    domain = shared_range(a, b)
    assert domain == (-6.0, 0.0)
    ca, cb = _colorize(a, domain=domain), _colorize(b, domain=domain)
    assert (ca[0, 0] == cb[1, 1]).all() and (ca[0, 1] == cb[0, 1]).all()  # -3.5 and -1.0: one colour in both maps
    assert not (_colorize(a)[0, 0] == _colorize(b)[1, 1]).all()  # each on its own range, they differed
    assert opening_pair(["nope", "alibi", "rope", "fox"]) == ("rope", "alibi")
    assert opening_pair(["nope", "fox"]) == ("nope", "fox")


def test_the_sink_sentence_says_none_in_words_or_names_the_sink_heads():
    rows = [{"model": "rope", "layer": 0, "head": h, "share": s, "uniform": 0.004} for h, s in enumerate((0.001, 0.003))]
    assert kv_cache.sink_sentence(rows).startswith("No head is a sink") and "0.3%" in kv_cache.sink_sentence(rows)
    rows.append({"model": "alibi", "layer": 1, "head": 0, "share": 0.62, "uniform": 0.004})
    assert "alibi (1 of 1 heads)" in kv_cache.sink_sentence(rows) and "rope" not in kv_cache.sink_sentence(rows)


def test_the_png_button_draws_the_slide_from_the_charts_stored_spec():
    """The specs a page keeps hold their datasets as Arrow streams (as Streamlit sends them): the PNG reads them
    back as rows, NaN as a gap, and draws the slide at the size asked."""
    import altair as alt

    from views._charts import _specs_of

    data = pd.DataFrame({"length": [256, 512, 1024] * 2, "bpb": [1.2, 1.3, np.nan, 1.1, 1.0, 0.9],
                         "model": ["rope"] * 3 + ["alibi"] * 3})
    specs, csv = _specs_of(alt.Chart(data).mark_line().encode(x="length:Q", y="bpb:Q", color="model:N"), data)
    assert any(isinstance(v, bytes) for s in specs for v in s.get("datasets", {}).values())
    run = _slide.SlideRun(title="Extrapolation lab", wanted=None, settings=[("Checkpoints", "RoPE, ALiBi")])
    png = _slide._png_now(specs, run, "At 1,024 bytes, ALiBi is lowest.", 1280, 720)
    assert Image.open(io.BytesIO(png)).size == (1280, 720) and b"length" in csv


def test_a_long_settings_line_wraps_in_the_png_instead_of_losing_its_last_settings():
    """Compare's PNG cut "Method A: RoPE · Method B: ALiBi · Length L (bytes): 512" off behind a long document name."""
    from posviz.slides import SETTINGS_CHARACTERS, SETTINGS_LINES, settings_lines

    settings = _slide.SEPARATOR.join(["Compare: method A vs method B", "Text: Held-out document",
                                      "Document: #0 · 61,444 bytes · The `ast` module helps Python applications to process tre…",
                                      "Method A: RoPE", "Method B: ALiBi", "Length L (bytes): 512"])
    lines = settings_lines(settings)
    assert 2 <= len(lines) <= SETTINGS_LINES and all(len(line) <= SETTINGS_CHARACTERS for line in lines)
    assert _slide.SEPARATOR.join(lines) == settings and lines[-1].endswith("Length L (bytes): 512")
    assert settings_lines("") == [""] and settings_lines("Rows: every row") == ["Rows: every row"]
