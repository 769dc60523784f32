"""Fixtures and helpers shared by the browser tests (imported by them; not a test module).

The browser tests never skip: without /usr/bin/chromium or Playwright they fail, with a message that
says what to install (CI installs Debian's chromium in .ci/run).
"""
from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from posviz_tools.look import ConsoleWatch, Sight, look_at, output_fingerprint, sight
from posviz_tools.loadtest import (EXCEPTION, MAIN, StreamlitServer, app_pages, exception_texts, launch_chromium,
                             main_text, screenshot_whole_main, stream_url, wait_for_change, wait_rendered)

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output"
SCREENSHOTS = OUTPUT / "screenshots"

__all__ = ["EXCEPTION", "MAIN", "OUTPUT", "ROOT", "SCREENSHOTS", "StreamlitServer", "app_pages", "browser",
           "exception_texts", "main_text", "new_tab", "wait_rendered", "wait_for_change", "copy_models",
           "assert_serving", "protocol_visit", "alert_texts", "screenshot_main", "assert_no_script_ran", "ConsoleWatch", "Sight",
           "look_at", "output_fingerprint", "wait_for_output_change", "menu_sections"]


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # a failure, not a skip: the browser tests are part of the suite
        pytest.fail(f"Playwright is not installed ({exc}); run `make test`, which installs requirements-test.txt")
    if not Path("/usr/bin/chromium").exists():
        pytest.fail("/usr/bin/chromium is missing: install Debian's chromium (`apt-get install chromium`); "
                    ".ci/run does this on CI")
    with sync_playwright() as p:
        chromium = launch_chromium(p)
        yield chromium
        chromium.close()


_SHARED_CONTEXTS: dict = {}  # id(browser) -> (browser, its shared context)


def new_tab(browser, width: int = 1280, height: int = 900):
    """A new tab (``width``×``height``) in the one browser context this browser's tests share, as a visitor's tabs
    share one browser: its cache keeps Streamlit's scripts and their compiled code from one page load to the next (a
    fresh context per tab compiled them again, about 0.8 s of Chromium's CPU a load). Close it with ``tab.close()``."""
    held = _SHARED_CONTEXTS.get(id(browser))
    if held is None or held[0] is not browser:
        held = _SHARED_CONTEXTS[id(browser)] = (browser, browser.new_context())
    tab = held[1].new_page()
    tab.set_viewport_size({"width": width, "height": height})
    tab.set_default_timeout(60_000)
    return tab


def assert_no_script_ran(tab) -> None:
    """No payload from a paste or a link ran (window.__xss) or became an element."""
    assert tab.evaluate("typeof window.__xss") == "undefined", "a pasted or linked payload ran as script"
    assert tab.locator('img[src="x"], img[src$="/x.png"]').count() == 0, "a payload became an <img> element"


def alert_texts(tab) -> list[str]:
    """Texts of every st.error / st.warning / st.info box in the main area."""
    return [a.inner_text() for a in tab.query_selector_all(f'{MAIN} [data-testid="stAlert"]')]


def screenshot_main(tab, name: str) -> Path:
    """Screenshot of the page's main area, tall enough to hold all of it (capped at 8000 px)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    path.write_bytes(screenshot_whole_main(tab, max_height=8000, min_height=900, restore_height=900))
    return path


def wait_for_output_change(tab, before: dict, timeout_s: float = 30) -> dict:
    """Wait until what the page shows (numbers, chart marks, images; not its widgets) differs from ``before``."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = output_fingerprint(tab)
        if now != before or time.monotonic() > deadline:
            return now
        tab.wait_for_timeout(250)


def menu_sections(tab) -> list[str]:
    """The headings of the app's navigation menu in the sidebar (read from the page, also under a slide's closed sidebar)."""
    # text_content, not inner_text: a slide's closed sidebar draws nothing; minus the name of the fold icon it holds
    return [re.sub(r"expand_(more|less)$", "", h.text_content().strip()).strip()
            for h in tab.query_selector_all('[data-testid="stNavSectionHeader"]')]


def copy_models(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def assert_serving(server: StreamlitServer, page: str = "about") -> None:
    """The server still answers its health check and renders a page without an exception: asked for over its own
    protocol (views/_warm.ProtocolSession), the server's whole answer in a fraction of a second, where a browser tab
    spent 3-4 s drawing it (how a page looks is test_browser.py's)."""
    assert server.healthy(), f"health check failed after bad input; server log:\n{server.log_tail()}"
    answer = protocol_visit(server, page)
    assert answer.ok, f"/{page} after bad input: {answer.status} {answer.exceptions}"
    assert answer.texts, f"/{page} rendered nothing"


def protocol_visit(server: StreamlitServer, page: str, query: str = ""):
    """The server's answer (views/_warm.Answer) to a new visitor of ``page`` (its url_path; "" the default page)."""
    from views._warm import ProtocolSession

    with ProtocolSession(stream_url(server), page, query, timeout_s=120) as session:
        return session.open()
