"""One look across the app (issue #12, part 3): one colour per method on every chart, and the small
labels a screenshot for a talk would show wrong ("None", "head 0.0", a cut-off sidebar header)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from posviz import palette
from posviz.display import display_name, ids_by_name
from posviz.explore.about import VAL_BPB
from posviz.positions import method_names

ROOT = Path(__file__).resolve().parent.parent
HEX = re.compile(r"^#[0-9A-Fa-f]{6}$")


def run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_app_page(page: str) -> AppTest:
    at = run(AppTest.from_file(str(ROOT / "menu.py"), default_timeout=60))
    at.switch_page(page)
    return run(at)


def colour_scales(at: AppTest) -> list[dict[str, str]]:
    """{series: colour} of every explicit colour scale in the page's Vega-Lite charts."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            colour = node.get("color")
            if isinstance(colour, dict) and isinstance(colour.get("scale"), dict):
                scale = colour["scale"]
                if isinstance(scale.get("domain"), list) and isinstance(scale.get("range"), list):
                    found.append(dict(zip(scale["domain"], scale["range"])))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for chart in at.get("vega_lite_chart"):
        walk(json.loads(chart.proto.spec))
    return found


def test_every_method_and_rope_variant_has_its_own_colour():
    names = method_names() + list(palette.ROPE_VARIANTS)
    colours = [palette.colour(n) for n in names]
    assert all(HEX.match(c) for c in colours), colours
    assert len({c.lower() for c in colours}) == len(names), dict(zip(names, colours))
    # the four methods being added next have their colours already, apart from the seven shipped ones
    for name in ("transformer_xl", "nezha", "kerple", "fire"):
        assert palette.colour(name) not in {palette.colour(n) for n in ("nope", "sinusoidal", "learned", "shaw", "t5",
                                                                        "alibi", "rope")}
    # methods are solid; every RoPE variant is dashed, each with its own pattern
    assert all(palette.dash(n) == [] for n in method_names())
    dashes = [tuple(palette.dash(n)) for n in palette.ROPE_VARIANTS]
    assert all(dashes) and len(set(dashes)) == len(dashes)
    # RoPE and its variants are told apart by hue as well as by dash (six blues could not be)
    import colorsys

    family = ["rope"] + list(palette.ROPE_VARIANTS)
    hues = {n: 360 * colorsys.rgb_to_hsv(*(int(palette.colour(n)[i:i + 2], 16) / 255 for i in (1, 3, 5)))[0]
            for n in family}
    for i, a in enumerate(family):
        for b in family[i + 1:]:
            apart = abs(hues[a] - hues[b]) % 360
            assert min(apart, 360 - apart) >= 10, (a, b, hues[a], hues[b])
    assert palette.rope_series("none") == "rope" and palette.colour(palette.rope_series("yarn")) == palette.colour("rope+yarn")
    # any two methods drawn together are told apart at a glance: CIE76 ΔE of at least MIN_DELTA_E between every
    # pair of method colours (RoPE, FoPE and PaTH were three blues; ALiBi and local/global two oranges)
    methods = method_names()
    close = [(a, b, round(palette.delta_e(palette.colour(a), palette.colour(b)), 1)) for i, a in enumerate(methods)
             for b in methods[i + 1:] if palette.delta_e(palette.colour(a), palette.colour(b)) < palette.MIN_DELTA_E]
    assert not close, close
    # the measure itself: white and black 100 apart, a colour and itself 0, the old cyan beside sky blue too close
    assert palette.delta_e("#ffffff", "#000000") == pytest.approx(100.0, abs=0.01) and palette.delta_e("#0072B2", "#0072B2") == 0
    assert palette.delta_e("#66CCEE", "#88CCEE") < palette.MIN_DELTA_E
    # a checkpoint that is no method still gets a colour, the same on every call
    assert palette.colour("my-model") == palette.colour("my-model") and HEX.match(palette.colour("my-model"))


def test_two_pages_colour_each_method_the_same(tiny_models):
    """Home's chart and the retrieval lab's chart (issue #12: sinusoidal was light blue on one, orange on the other)."""
    home = colour_scales(open_app_page("views/home.py"))
    lab = colour_scales(run(AppTest.from_file(str(ROOT / "views" / "retrieval.py"), default_timeout=60)))
    assert home and lab
    seen = {}
    for scale in home + lab:
        for series, colour in scale.items():
            series = ids_by_name().get(series, series)  # the legends say display names; the palette is keyed on ids
            if series in method_names():
                assert colour == palette.colour(series), (series, colour)
                seen.setdefault(series, set()).add(colour)
    assert {"sinusoidal", "alibi", "rope"} <= set(seen)
    assert all(len(c) == 1 for c in seen.values())
    # the rope scalings drawn on the RoPE page are in rope's family, as on the context-extension page
    rope = colour_scales(open_app_page("views/rope.py"))
    assert any(scale.get(display_name("yarn")) == palette.colour("rope+yarn") for scale in rope), rope


def test_home_says_cannot_run_and_the_sidebar_header_fits(tiny_models):
    at = open_app_page("views/home.py")
    table = next(d for d in at.main.dataframe if "extrapolates" in d.value.columns)
    shown = table.value  # what the browser's grid draws (it ignores a Styler's na_rep: a missing number reads "None")
    learned = shown[shown["method"] == "learned"].iloc[0]
    assert learned["bits/byte @ 16×"] == "cannot run"
    assert re.match(r"^\d+\.\d{3}$", learned["bits/byte @ 1×"])
    alibi = shown[shown["method"] == display_name("alibi")].iloc[0]
    assert re.match(r"^\d+\.\d{3}$", alibi["bits/byte @ 16×"])
    assert not shown[["bits/byte @ 1×", "bits/byte @ 16×"]].isin([None, "None", "nan"]).any().any()
    sidebar = json.loads(at.sidebar.dataframe[0].proto.columns)
    label = sidebar[VAL_BPB]["label"]
    assert len(label) <= len("val bits/byte"), label  # the sidebar's default width cuts a longer header
    # one quantity, one name: the sidebar's number is the About page's column and docs/results.md's "first 64 KiB"
    from views._checkpoints import VAL_BPB_HELP

    assert label == "final bpb" and "first 64 KiB of the long held-out validation documents" in VAL_BPB_HELP
    results = (ROOT / "docs" / "results.md").read_text()
    assert "| checkpoint | whole validation split | first 64 KiB of the long validation documents |" in results


def test_retrieval_slope_legend_names_heads_by_integer(tiny_models):
    at = run(AppTest.from_file(str(ROOT / "views" / "retrieval.py"), default_timeout=60))
    heads = set()
    for chart in at.get("vega_lite_chart"):  # Streamlit sends each chart's data apart from its spec
        for dataset in chart.proto.datasets:
            frame = pa.ipc.open_stream(dataset.data.data).read_all().to_pandas()
            if {"penalty", "head"} <= set(frame.columns):
                heads |= set(frame["head"])
    assert heads, "no ALiBi penalty chart"
    assert all(re.match(r"^head \d+ \(slope ", h) for h in heads), heads
    assert any(h.startswith("head 0 (") for h in heads)


def _encodings(node):
    """Every "encoding" object in a Vega-Lite spec (layers and facets included)."""
    if isinstance(node, dict):
        if isinstance(node.get("encoding"), dict):
            yield node["encoding"]
        for value in node.values():
            yield from _encodings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _encodings(value)


def test_charts_coloured_by_method_keep_their_legend(tiny_models):
    """Colour and dash on one field share one legend in Vega-Lite: hiding the dash's hides both, and
    a screenshot then shows lines nobody can name."""
    for page in ("views/home.py", "views/context_extension.py", "views/retrieval.py"):
        at = open_app_page(page)
        checked = 0
        for chart in at.get("vega_lite_chart"):
            for enc in _encodings(json.loads(chart.proto.spec)):
                colour, dash = enc.get("color", {}), enc.get("strokeDash", {})
                if colour.get("field") and colour.get("field") == dash.get("field"):
                    checked += 1
                    assert "legend" not in dash or dash["legend"] is not None, (page, colour["field"])
                    assert colour.get("legend", {}) is not None, (page, colour["field"])
        assert checked, f"{page}: no chart colours and dashes by the same field"
