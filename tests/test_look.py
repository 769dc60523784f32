"""The browser look's own checks (posviz_tools/look.py), on charts drawn by Vega's own renderer in a page of their own:
each fails on the defect a visitor found (#72) and passes on its fix. No server: the SVG that vl-convert draws, placed
where Streamlit places a chart."""
from __future__ import annotations

import altair as alt
import pandas as pd
import pytest
import vl_convert as vlc
from browser_support import browser, new_tab  # noqa: F401  (the fixture)

from posviz_tools.look import sight, wait_for_a_chart

pytestmark = pytest.mark.browser

FRAME = """<html><body><div data-testid="stMain"><div style="display:flex;width:900px">
<div data-testid="stColumn" style="width:300px"><div data-testid="stVegaLiteChart">{svg}</div></div>
<div data-testid="stColumn" style="width:600px"></div></div></div></body></html>"""


def problems(tab, chart: alt.TopLevelMixin) -> list[str]:
    svg = vlc.vegalite_to_svg(chart.to_json()).replace("<svg ", '<svg class="marks" ', 1)
    tab.set_content(FRAME.format(svg=svg))
    return sight(tab).cut_off()


STAGES = pd.DataFrame({"x": [1, 2, 1, 2], "y": [1, 2, 2, 3], "model": ["a", "a", "b", "b"], "stage": ["before", "before", "after", "after"]})


def test_the_look_fails_on_a_key_that_draws_nothing_a_chart_past_its_column_and_a_chart_without_marks(browser):  # noqa: F811
    tab = new_tab(browser, 1200, 800)
    try:
        # Context extension's stage key: a dash legend beside a colour legend of another field (Vega-Lite gives its
        # lines a transparent stroke)
        dashed = alt.Chart(STAGES).mark_line(point=True).encode(
            x="x:Q", y="y:Q", color="model:N", detail="model:N",
            strokeDash=alt.StrokeDash("stage:N", legend=alt.Legend(symbolType="stroke", symbolStrokeColor="#333"))
        ).properties(width=150, height=100)
        assert any("draws nothing" in p for p in problems(tab, dashed)), problems(tab, dashed)
        shaped = alt.layer(alt.Chart(STAGES).mark_line().encode(x="x:Q", y="y:Q", color="model:N"),
                           alt.Chart(STAGES).mark_point(filled=True).encode(x="x:Q", y="y:Q", color="model:N", shape="stage:N")
                           ).properties(width=150, height=100)
        assert problems(tab, shaped) == []
        # NoPE + Canon's faceted bars: wider than their column
        wide = alt.Chart(STAGES).mark_bar().encode(x="x:O", y="y:Q").properties(width=500, height=100)
        assert any("past its column" in p for p in problems(tab, wide)), problems(tab, wide)
        # a view with no mark at all
        empty = alt.Chart(STAGES.iloc[:0]).mark_bar().encode(x="x:O", y="y:Q").properties(width=150, height=100)
        assert any("no marks" in p for p in problems(tab, empty)), problems(tab, empty)
    finally:
        tab.close()


def test_the_wait_for_a_chart_waits_for_marks_and_gives_up_in_time(browser):  # noqa: F811
    """``wait_for_a_chart``: true once a chart's marks are drawn, even when they come after the wait began (as Vega
    draws after the script is done); false, within its bound, on a page whose chart has no marks; with ``every``,
    true only once every chart has its marks."""
    tab = new_tab(browser, 1200, 800)
    try:
        bars = alt.Chart(STAGES).mark_bar().encode(x="x:O", y="y:Q").properties(width=150, height=100)
        svg = vlc.vegalite_to_svg(bars.to_json()).replace("<svg ", '<svg class="marks" ', 1)
        tab.set_content(FRAME.format(svg=""))
        assert not wait_for_a_chart(tab, at_most_ms=600)
        tab.evaluate("svg => setTimeout(() => { document.querySelector('[data-testid=\"stVegaLiteChart\"]').innerHTML = svg; }, 800)",
                     svg)
        assert wait_for_a_chart(tab, at_most_ms=10_000)
        # every chart: false while a second chart has no marks, true once it has them
        tab.set_content(FRAME.format(svg=svg).replace('<div data-testid="stColumn" style="width:600px"></div>',
                                                      '<div data-testid="stColumn" style="width:600px">'
                                                      '<div data-testid="stVegaLiteChart"></div></div>'))
        assert wait_for_a_chart(tab, at_most_ms=600) and not wait_for_a_chart(tab, at_most_ms=600, every=True)
        tab.evaluate("svg => { document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')[1].innerHTML = svg; }", svg)
        assert wait_for_a_chart(tab, at_most_ms=2_000, every=True)
    finally:
        tab.close()
