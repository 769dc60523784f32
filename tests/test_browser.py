"""End to end: the real server in headless Chromium, every page of the menu (menu.py), one widget moved on each.

The page list is read from menu.py (``st.Page(..., url_path=...)``), so a new page is tested without
touching this file. Each page, on the tiny checkpoints of conftest.py (fast), as a visitor sees it:

1. at its defaults, at 1366×768 (a laptop): no exception, no error box, no browser console error
   or page error, at least one chart drawn with data, nothing cut off (text narrower than its box,
   a table hiding rows or columns, a chart label outside its chart, a legend that does not name every
   series drawn); a screenshot of its main area goes to test-output/screenshots/<url_path>.png;
2. when a widget moves, what the page shows changes (a number outside the widgets, a chart's marks
   or an image), not only the URL;
3. survives a link with junk in every query parameter it keeps in its URL: the server's answer to that link (over
   its protocol, views/_warm.ProtocolSession: a second page load per page cost the suite a minute) has no
   exception, a notice naming each ignored parameter, and none of the link's text as markup (no Markdown drawn as
   HTML holding it, no tag, image or link of it outside a code span); one junk link is drawn in Chromium too, and
   runs no script;
4. in presentation mode (the sidebar's toggle), a slide: at 1920×1080 (a projector) the sidebar closed, the first
   chart starting on the first screen and covering at least a third of it; nothing cut off at 1366×768 or at
   1920×1080; the slide's "Leave the slide" clickable, nothing over it (one page clicks it and is back).

A deep link with settings as the very first request of a new server opens inside the app (its menu,
its wide layout, the link's settings), and /home opens the Home page. The home page also runs once on
the real models/ folder. The other bad-input cases are in test_bad_input_browser.py.
"""
from __future__ import annotations

import contextlib
import os
import re
import urllib.parse

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from browser_support import (MAIN, OUTPUT, ROOT, ConsoleWatch, StreamlitServer, alert_texts, app_pages,  # noqa: F401
                             assert_no_script_ran, browser, exception_texts, look_at, main_text, menu_sections,
                             new_tab, output_fingerprint, protocol_visit, screenshot_main, sight, wait_for_change,
                             wait_for_output_change, wait_rendered)
from posviz.models.checkpoint_files import shipped_checkpoints
from posviz_tools.loadtest import move_a_widget
from posviz_tools.look import slide_seen, wait_for_a_chart

pytestmark = pytest.mark.browser
PAGES = app_pages()
# Markup, script, markdown image/link, out-of-range and non-numbers, empty, NUL, and very long text
JUNK = ["<script>window.__xss=1</script>", "-1", "99999999999999999999", "NaN", "![x](/x.png)",
        "<img src=x onerror=window.__xss=1>", "", "\x00", "[a](javascript:window.__xss=1)", "ä" * 300]
MARKUP = re.compile(r"<\w|!\[|\]\(")  # the start of a tag, a Markdown image, a Markdown link


def markup_from_the_link(answer, values) -> list[str]:
    """What of a link's junk the server sent to be drawn as markup: any of it in Markdown drawn as HTML, or its
    tags, images and links anywhere in a text outside a code span (which Streamlit draws as literal text)."""
    found = [body for body in answer.html for value in values if value and value in body]
    for text in answer.texts:
        outside_code = re.sub(r"`[^`]*`", "", text)
        found += [value for value in values if MARKUP.search(value or "") and value in outside_code]
    return found


def test_app_pages_are_read_from_the_menu():
    assert len(PAGES) >= 10, PAGES
    assert sum(p.default for p in PAGES) == 1, "exactly one default page"
    assert len({p.url_path for p in PAGES}) == len(PAGES), "url_path values must be unique"
    for entry in PAGES:
        assert (ROOT / entry.script).is_file(), f"menu.py lists {entry.script}, which does not exist"
    # Streamlit would run a pages/ folder beside the menu script as its own menu until st.navigation has run once
    assert not (ROOT / "pages").exists(), "a pages/ folder beside menu.py breaks deep links on a new server"


# The Workshop's runs on this server: one step of training, scored on 4 KiB (the page's recipe is the quick one)
WORKSHOP_RECIPE = '{"tokens": 4096, "eval_bytes": 4096}'


@pytest.fixture(scope="module")
def tiny_server(tiny_models_dir):
    env = {**os.environ, "POSVIZ_WORKSHOP_RECIPE": WORKSHOP_RECIPE}
    with StreamlitServer(models=tiny_models_dir, env=env, log=OUTPUT / "server-browser-tiny.log") as server:
        yield server


SIZES = [(1366, 768), (1920, 1080)]


def assert_seen_whole(tab, what: str, sizes=SIZES, said=()) -> None:
    """``said``: error boxes the page already showed for the same settings (a length a checkpoint cannot run)."""
    wait_for_a_chart(tab)  # every page looked at whole draws one: wait for the browser to draw it, not for a clock
    for width, height in sizes:
        seen = look_at(tab, width, height)
        new_errors = [box for box in seen.error_boxes if box not in said]
        assert not new_errors, f"{what} at {width}×{height}: error box {new_errors}"
        assert seen.charts_with_data >= 1, f"{what} at {width}×{height}: no chart drawn with data ({seen.charts})"
        cut = seen.cut_off()
        assert not cut, f"{what} at {width}×{height}, cut off:\n" + "\n".join(cut)


# The page whose slide is left by a real click on "Leave the slide" (the README's slide); on every other page the click is
# Playwright's trial (click(trial=True): visible, enabled, not covered, where a real click would land), without the
# page's redraw that leaving costs: the button is one component (views/_slide.py), what differs by page is what lies
# over it (a chart's toolbar did, on four pages).
LEFT_BY_A_CLICK = "extrapolation"


# The labs whose headline chart is what a screenshot or a slide is taken of: at 1366×768 it covers at least this share
# of the main area (Compare's covered 31 % when the Extrapolation lab's covered 40 %).
HEADLINE_CHART_SHARE = 0.35
LARGE_HEADLINE = {"extrapolation", "compare", "kv-cache", "generation"}

LARGEST_CHART_SHARE_JS = """() => {
  const main = document.querySelector('[data-testid="stMain"]').getBoundingClientRect();
  const areas = [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stVegaLiteChart"]')].map(c => {
    const r = c.getBoundingClientRect(); return r.width * r.height; });
  return Math.max(0, ...areas) / (main.width * window.innerHeight);
}"""


@pytest.mark.parametrize("entry", PAGES, ids=[p.url_path for p in PAGES])
def test_page_renders_reacts_and_survives_a_junk_link(entry, tiny_server, browser):
    tab = new_tab(browser, *SIZES[0])
    console = ConsoleWatch(tab)
    try:
        # 1. first render, as a visitor sees it, on a laptop (a projector's 1920×1080 is the slide's, step 4)
        tab.goto(tiny_server.url + entry.url)
        wait_rendered(tab)
        assert not exception_texts(tab), f"{entry.title}: {exception_texts(tab)}"
        text = main_text(tab)
        assert text.strip(), f"{entry.title} rendered nothing"
        assert_seen_whole(tab, entry.title, SIZES[:1])
        if entry.url_path in LARGE_HEADLINE:
            # the headline chart may be laid out after the first chart drew (Compare's came second in one CI run: 24 %)
            with contextlib.suppress(PlaywrightTimeout):
                tab.wait_for_function(f"({LARGEST_CHART_SHARE_JS})() >= {HEADLINE_CHART_SHARE}", timeout=10_000)
            share = tab.evaluate(LARGEST_CHART_SHARE_JS)
            assert share >= HEADLINE_CHART_SHARE, f"{entry.title}: its largest chart covers {share:.0%} of the main area"
        assert not console.errors, f"{entry.title}: {console.errors}"
        screenshot_main(tab, entry.url_path)

        # 2. a person moves a widget: what the page shows changes, not only its URL
        shown = output_fingerprint(tab)
        moved = move_a_widget(tab)
        url, after = wait_for_change(tab, (tab.url, text))
        assert not exception_texts(tab), f"{entry.title} after moving {moved}: {exception_texts(tab)}"
        assert after.strip(), f"{entry.title} went blank after moving {moved}"
        now = wait_for_output_change(tab, shown)
        changed = [part for part in shown if shown[part] != now[part]]
        assert changed, f"{entry.title}: moving {moved} changed no number, chart or image on the page"
        said = sight(tab).error_boxes  # what the moved settings make the page say (learned past its table)

        # 3. every parameter the page keeps in its link, replaced by junk: the server's whole answer to that link (its
        # protocol, no second page load: test_a_junk_link_in_chromium_runs_no_script draws one in the browser)
        params = urllib.parse.parse_qs(urllib.parse.urlparse(url).query, keep_blank_values=True)
        assert params, f"{entry.title} keeps no state in its link"
        junk = {key: JUNK[i % len(JUNK)] for i, key in enumerate(sorted(params))}
        answer = protocol_visit(tiny_server, entry.url.lstrip("/"), urllib.parse.urlencode(junk))
        assert answer.ok, f"{entry.title} with junk {junk}: {answer.status} {answer.exceptions}"
        assert answer.texts, f"{entry.title} with junk {junk} rendered nothing"
        notices = " ".join(answer.texts)
        unmentioned = [key for key in junk if f"parameter {key}=" not in notices]
        assert not unmentioned, f"{entry.title}: no notice for junk in {unmentioned}; notices: {notices[:500]}"
        assert not markup_from_the_link(answer, junk.values()), f"{entry.title}: the link's text drawn as markup"

        # 4. presentation mode is a slide: the chart first and large, the sidebar closed; nothing cut off on a laptop
        # or a projector. Turned on with the sidebar's toggle, as a speaker does (no new page load; a link's
        # present=1 is the deep-link test's), on the settings just moved; "Leave the slide" there to be clicked
        if "present=1" not in tab.url:  # (a page without widgets of its own moved that toggle in step 2)
            before = (tab.url, main_text(tab))
            tab.locator('[data-testid="stSidebar"] [data-testid="stCheckbox"]').filter(has_text="Presentation mode").click()
            wait_for_change(tab, before)
        url = tab.url
        assert "present=1" in url, f"{entry.title}: the presentation toggle did not reach the link ({url})"
        assert not exception_texts(tab), f"{entry.title} in presentation mode: {exception_texts(tab)}"
        assert_seen_whole(tab, f"{entry.title} in presentation mode", SIZES, said)
        slide = slide_seen(tab)  # assert_seen_whole leaves the window at 1920×1080
        assert not slide.sidebar, f"{entry.title}: the sidebar shows on a slide"
        assert slide.top is not None and slide.top < 1080, f"{entry.title}: the slide's chart starts at {slide.top} px"
        assert slide.covers(1920, 1080) >= 1 / 3, f"{entry.title}: the slide's chart covers {slide.covers(1920, 1080):.0%} of the screen ({slide})"
        leave = tab.locator(f"{MAIN} button").filter(has_text="Leave the slide")
        if entry.url_path != LEFT_BY_A_CLICK:
            leave.click(trial=True, timeout=10_000)  # fails where anything lies over the button
        else:
            before = (tab.url, main_text(tab))
            leave.click()
            url, _ = wait_for_change(tab, before)
            assert "present=1" not in url and slide_seen(tab).sidebar, f"{entry.title}: the slide was not left ({url})"
            assert not exception_texts(tab), f"{entry.title} after leaving the slide: {exception_texts(tab)}"

        assert not console.errors, f"{entry.title}: {console.errors}"
        assert tiny_server.healthy()
    finally:
        tab.close()


def test_a_junk_link_in_chromium_runs_no_script_and_names_each_parameter(tiny_server, browser):
    """Every page's junk link is checked in the server's answer (step 4 above); here one drawn in Chromium, as a
    visitor who follows it sees it: a notice naming each parameter, no script run, no console error, a page."""
    lab = next(p.url for p in PAGES if p.url_path == "extrapolation")
    junk = {"L": JUNK[0], "models": JUNK[5], "stride": JUNK[4]}
    tab = new_tab(browser, *SIZES[0])
    console = ConsoleWatch(tab)
    try:
        tab.goto(tiny_server.url + lab + "?" + urllib.parse.urlencode(junk))
        wait_rendered(tab)
        assert not exception_texts(tab), exception_texts(tab)
        assert_no_script_ran(tab)
        assert "Bits per byte at" in main_text(tab), "the lab did not fall back to its defaults"
        notices = " ".join(alert_texts(tab))
        unmentioned = [key for key in junk if f"parameter {key}=" not in notices]
        assert not unmentioned, f"no notice for junk in {unmentioned}; notices: {notices[:500]}"
        assert tab.locator(f"{MAIN} img[src='x']").count() == 0, "the link's <img> was drawn"
        assert not console.errors, console.errors
    finally:
        tab.close()


def test_a_deep_link_as_a_new_servers_first_request_opens_inside_the_app(tiny_models_dir, browser):
    """Streamlit runs a pages/ folder beside the menu script on its own until st.navigation has run once: the
    first link a new server got decided whether pages opened inside the app's menu."""
    sections = list(dict.fromkeys(p.section for p in PAGES))
    with StreamlitServer(models=tiny_models_dir, log=OUTPUT / "server-browser-deep-link.log") as server:
        tab = new_tab(browser, 1366, 768)
        try:
            tab.goto(server.url + "/rope?m=10&present=1")  # the server's very first page request
            wait_rendered(tab)
            assert not exception_texts(tab), exception_texts(tab)
            assert menu_sections(tab) == sections, "the page opened outside the app's menu"
            width = tab.evaluate("""() => document.querySelector('[data-testid="stMainBlockContainer"]')
                                          .getBoundingClientRect().width""")
            assert width > 1000, f"main column {width:.0f} px wide at 1366 px: not the app's wide layout"
            position = tab.locator(f'{MAIN} [data-testid="stSlider"]').filter(has_text="position m").first
            assert position.locator('input[type="range"], [role="slider"]').first.evaluate(
                "e => e.value || e.getAttribute('aria-valuenow')") == "10", "the link's m=10 was not applied"
            assert not slide_seen(tab).sidebar, "the link's present=1 was not applied: the sidebar shows"
            assert "m=10" in tab.url and "present=1" in tab.url

            # /home is the Home page's name: it opens Home (served at /) with the link's settings
            tab.goto(server.url + "/home?present=1")
            wait_rendered(tab)
            assert urllib.parse.urlparse(tab.url).path == "/", tab.url
            assert "present=1" in tab.url
            assert tab.locator('[role="dialog"]').count() == 0, "a 'Page not found' dialog opened"
            home = next(p for p in PAGES if p.default)
            assert menu_sections(tab) == sections
            assert tab.locator('[data-testid="stSidebarNav"] a[aria-current="page"]').text_content().strip().endswith(home.title)
        finally:
            tab.close()


def test_home_on_the_shipped_models(browser):
    """The real models/ folder (whatever training has written so far) renders the home page."""
    with StreamlitServer(models=ROOT / "models", log=OUTPUT / "server-browser-shipped.log") as server:
        tab = new_tab(browser)
        try:
            tab.goto(server.url + "/")
            wait_rendered(tab)
            assert not exception_texts(tab), exception_texts(tab)
            assert tab.locator(f"{MAIN} h1").count() == 1, "home has no title"
            if shipped_checkpoints(ROOT / "models"):
                assert "No checkpoints found" not in main_text(tab)
            screenshot_main(tab, "home-shipped-models")
        finally:
            tab.close()


def test_the_workshop_trains_a_formula_that_the_extrapolation_lab_then_runs(tiny_server, browser):
    """A visitor's whole path: a formula drawn from a link, Train, its scores, and the Extrapolation lab with it."""
    tab = new_tab(browser, 1366, 768)
    console = ConsoleWatch(tab)
    try:
        tab.goto(tiny_server.url + "/workshop?example=Hard+cut+at+64")  # drawn: the test above, at the defaults
        wait_rendered(tab)
        assert not exception_texts(tab) and not alert_texts(tab), alert_texts(tab)
        tab.get_by_role("button", name="Train (about 3 minutes)").click()
        tab.get_by_text("Open in the Extrapolation lab").wait_for(timeout=120_000)
        wait_rendered(tab)
        assert "yours: Hard cut at 64" in main_text(tab) and not alert_texts(tab), alert_texts(tab)
        tab.get_by_text("Open in the Extrapolation lab").click()
        tab.wait_for_url("**/extrapolation**")
        wait_rendered(tab, timeout_ms=120_000)
        assert not exception_texts(tab), exception_texts(tab)
        chips = tab.locator(f'{MAIN} [data-testid="stMultiSelect"]').first.inner_text()
        assert "yours: Hard cut at 64" in chips, chips
        wait_for_a_chart(tab)
        seen = look_at(tab, 1366, 768)
        assert not seen.error_boxes and seen.charts_with_data >= 1, (seen.error_boxes, seen.charts)
        assert not console.errors, console.errors
        screenshot_main(tab, "workshop-in-extrapolation")
    finally:
        tab.close()
