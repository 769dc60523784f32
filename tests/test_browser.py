"""End to end: the real server in headless Chromium, every page of app.py, one widget moved on each.

The page list is read from app.py (``st.Page(..., url_path=...)``), so a new page is tested without
touching this file. Each page: renders without an exception element, changes when a widget moves,
and leaves a screenshot of its main area in test-output/screenshots/<url_path>.png for review.
The pages run on the tiny checkpoints of conftest.py (fast); the home page also runs once on the
real models/ folder.
"""
from __future__ import annotations

import pytest

from browser_support import (MAIN, OUTPUT, ROOT, StreamlitServer, app_pages, browser, exception_texts,  # noqa: F401
                             main_text, new_tab, screenshot_main, wait_for_change, wait_rendered)
from posviz.checkpoint import shipped_checkpoints
from posviz.loadtest import move_a_widget

pytestmark = pytest.mark.browser
PAGES = app_pages()


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
def test_page_renders_reacts_and_is_screenshotted(entry, tiny_server, browser):
    tab = new_tab(browser)
    try:
        tab.goto(tiny_server.url + entry.url)
        wait_rendered(tab)
        assert not exception_texts(tab), f"{entry.title}: {exception_texts(tab)}"
        text = main_text(tab)
        assert text.strip(), f"{entry.title} rendered nothing"
        screenshot_main(tab, entry.url_path)

        moved = move_a_widget(tab)
        url, after = wait_for_change(tab, (tab.url, text))
        assert not exception_texts(tab), f"{entry.title} after moving {moved}: {exception_texts(tab)}"
        assert after.strip(), f"{entry.title} went blank after moving {moved}"
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
