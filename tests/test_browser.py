"""End to end: the real server in headless Chromium, every page of app.py, one widget moved on each.

The page list is read from app.py (``st.Page(..., url_path=...)``), so a new page is tested without
touching this file. Each page, on the tiny checkpoints of conftest.py (fast):

1. renders without an exception element and leaves a screenshot of its main area in
   test-output/screenshots/<url_path>.png for review;
2. changes (URL or text) when a widget moves, still without an exception;
3. survives a link with junk in every query parameter it keeps in its URL: no exception, no
   markup or script from the link, the defaults, and a notice naming each ignored parameter.

The home page also runs once on the real models/ folder. The other bad-input cases are in
test_bad_input_browser.py.
"""
from __future__ import annotations

import urllib.parse

import pytest

from browser_support import (MAIN, OUTPUT, ROOT, StreamlitServer, alert_texts, app_pages,  # noqa: F401
                             assert_no_script_ran, browser, exception_texts, main_text, new_tab, screenshot_main,
                             wait_for_change, wait_rendered)
from posviz.checkpoint import shipped_checkpoints
from posviz.loadtest import move_a_widget

pytestmark = pytest.mark.browser
PAGES = app_pages()
# Markup, script, markdown image/link, out-of-range and non-numbers, empty, NUL, and very long text
JUNK = ["<script>window.__xss=1</script>", "-1", "99999999999999999999", "NaN", "![x](/x.png)",
        "<img src=x onerror=window.__xss=1>", "", "\x00", "[a](javascript:window.__xss=1)", "ä" * 300]


def test_app_pages_are_read_from_app_py():
    assert len(PAGES) >= 10, PAGES
    assert sum(p.default for p in PAGES) == 1, "exactly one default page"
    assert len({p.url_path for p in PAGES}) == len(PAGES), "url_path values must be unique"
    for entry in PAGES:
        assert (ROOT / entry.script).is_file(), f"app.py lists {entry.script}, which does not exist"


@pytest.fixture(scope="module")
def tiny_server(tiny_models_dir):
    with StreamlitServer(models=tiny_models_dir, log=OUTPUT / "server-browser-tiny.log") as server:
        yield server


@pytest.mark.parametrize("entry", PAGES, ids=[p.url_path for p in PAGES])
def test_page_renders_reacts_and_survives_a_junk_link(entry, tiny_server, browser):
    tab = new_tab(browser)
    try:
        # 1. first render
        tab.goto(tiny_server.url + entry.url)
        wait_rendered(tab)
        assert not exception_texts(tab), f"{entry.title}: {exception_texts(tab)}"
        text = main_text(tab)
        assert text.strip(), f"{entry.title} rendered nothing"
        screenshot_main(tab, entry.url_path)

        # 2. a person moves a widget
        moved = move_a_widget(tab)
        url, after = wait_for_change(tab, (tab.url, text))
        assert not exception_texts(tab), f"{entry.title} after moving {moved}: {exception_texts(tab)}"
        assert after.strip(), f"{entry.title} went blank after moving {moved}"

        # 3. every parameter the page keeps in its link, replaced by junk
        params = urllib.parse.parse_qs(urllib.parse.urlparse(url).query, keep_blank_values=True)
        assert params, f"{entry.title} keeps no state in its link"
        junk = {key: JUNK[i % len(JUNK)] for i, key in enumerate(sorted(params))}
        tab.goto(tiny_server.url + entry.url + "?" + urllib.parse.urlencode(junk))
        wait_rendered(tab)
        assert not exception_texts(tab), f"{entry.title} with junk {junk}: {exception_texts(tab)}"
        assert_no_script_ran(tab)
        assert main_text(tab).strip()
        notices = " ".join(alert_texts(tab))
        unmentioned = [key for key in junk if f"parameter {key}=" not in notices]
        assert not unmentioned, f"{entry.title}: no notice for junk in {unmentioned}; notices: {notices[:500]}"
        assert tiny_server.healthy()
    finally:
        tab.context.close()


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
            tab.context.close()
