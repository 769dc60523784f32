"""The bench's browser measurements: pages in headless Chromium (``/usr/bin/chromium``) on servers
started as the README starts them (``loadtest.StreamlitServer``).

* ``measure_first_render``: every page in a new browser session on a warm server, for a server's
  first visitor of it (``POSVIZ_WARM=0``) and for a later visitor;
* ``measure_cold_visits``: each page as a newly started server's very first visit, then a new setting;
* ``measure_cold_floor`` and ``measure_new_session_floor``: minimal apps, what no page can go below.

Each returns its numbers, or a problem saying why it could not measure (no Playwright, no Chromium).
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from .loadtest import MAIN, exception_texts, script_idle

ROOT = Path(__file__).resolve().parent.parent


CONTENT = ", ".join(f'{MAIN} [data-testid="{t}"]' for t in
                    ("stVegaLiteChart", "stImage", "stDataFrame", "stMetric", "stTable", "stCode"))


def _time_page(tab, url: str, timeout_s: float, quiet_s: float = 0.5) -> tuple[float, float]:
    """(seconds until the page was complete, seconds until its first chart, image, table or metric showed).

    Polls every 50 ms. Complete: the page script has finished (its state went to notRunning and
    stayed there for ``quiet_s``; a page's own rerun passes through notRunning briefly, and the quiet
    wait is not counted) *and* the browser has drawn content, which for charts comes after the script.
    """
    t0 = time.perf_counter()
    tab.goto(url, wait_until="commit")
    first_content, idle_since = None, None
    while time.perf_counter() - t0 < timeout_s:
        now = time.perf_counter() - t0
        if first_content is None and tab.locator(CONTENT).count():
            first_content = now
        if script_idle(tab):
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= quiet_s and first_content is not None:
                return max(idle_since, first_content), first_content
        else:
            idle_since = None
        tab.wait_for_timeout(50)
    raise TimeoutError(f"{url} did not finish, or drew no chart, table or metric, within {timeout_s:.0f} s")


def _visit(browser, url: str, timeout_s: float) -> tuple[float, float, list[str]]:
    """A new browser session opens ``url``: (complete s, first content s, exception texts shown)."""
    tab = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    try:
        finished, content = _time_page(tab, url, timeout_s)
        return finished, content, exception_texts(tab)
    finally:
        tab.context.close()


def measure_first_render(models_dir: str | None, repeats: int = 3, timeout_s: float = 180.0):
    """First render of every page in a new browser session, on running servers, three ways.

    *Warm server*: a server started as the README does, whose first visit (the home page) started its
    warm-up (``views/_serving.warm_the_store``: it opens every page at its defaults itself, then the
    Extrapolation lab's slider stops); once that is done, each page opens in a new browser session, as
    a visitor of a demo that has been up a while. *First visitor*: a server started with
    ``POSVIZ_WARM=0`` (nothing computed ahead), home page opened once (that cold start is reported on
    its own), then each page in a new session: it computes all it shows. *Later visitor*: then another
    new session opens the same page and gets that first visitor's shared results. Each pass runs on
    new servers, ``repeats`` times (a 2-core machine that also runs the browser is noisy), medians kept.
    Returns ({url_path: (first visitor complete s, first content s, later visitor complete s, later first
    content s, warm-server complete s, warm-server first content s)}, cold start s, problem or None,
    warm-up seconds).
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        return {}, None, f"not measured: Playwright is not installed ({exc}); `pip install -r requirements-test.txt`", None
    from .loadtest import StreamlitServer, app_pages, launch_chromium

    if not Path("/usr/bin/chromium").exists():
        return {}, None, "not measured: /usr/bin/chromium is missing (apt-get install chromium)", None
    runs, colds, pages, warm, warmups = {}, [], app_pages(), {}, []
    home = next(p for p in pages if p.default)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            for run in range(repeats):
                # torch's default threads, as `streamlit run app.py` serves a visitor (the browser shares the cores)
                # POSVIZ_WARM=0: nothing computed ahead, so each page's first visitor computes all it shows
                with StreamlitServer(models=models_dir, torch_threads=None,
                                     env={**os.environ, "POSVIZ_WARM": "0"}) as server:
                    cold = _visit(browser, server.url + home.url, timeout_s)[0]
                    colds.append(cold)
                    print(f"  pass {run + 1}/{repeats}: cold start (first visit of a new server) {cold:.2f} s", flush=True)
                    for entry in pages:
                        finished, content, errors = _visit(browser, server.url + entry.url, timeout_s)
                        later, later_content, later_errors = _visit(browser, server.url + entry.url, timeout_s)
                        errors += later_errors
                        runs.setdefault(entry.url_path, []).append(
                            (float("nan") if errors else finished, content, float("nan") if errors else later, later_content))
                        suffix = f"  EXCEPTION: {errors[0][:200]}" if errors else ""
                        print(f"  first render {entry.url_path:>18}: {finished:.2f} s (first chart "
                              f"{content:.2f} s); a later visitor {later:.2f} s (first chart {later_content:.2f} s)"
                              f"{suffix}", flush=True)
                with StreamlitServer(models=models_dir, torch_threads=None) as server:  # as the README starts it
                    _visit(browser, server.url + home.url, timeout_s)  # the first visit starts the warm-up
                    warmups.append(server.wait_warm())
                    print(f"  pass {run + 1}/{repeats}: warm-up done {warmups[-1]:.1f} s after the first visit", flush=True)
                    for entry in pages:
                        finished, content, errors = _visit(browser, server.url + entry.url, timeout_s)
                        warm.setdefault(entry.url_path, []).append((float("nan") if errors else finished, content))
                        print(f"  warm server  {entry.url_path:>18}: {finished:.2f} s (first chart {content:.2f} s)"
                              + (f"  EXCEPTION: {errors[0][:200]}" if errors else ""), flush=True)
        finally:
            browser.close()
    times = {page: tuple(statistics.median(r[i] for r in rows) for i in range(4))
             + tuple(statistics.median(r[i] for r in warm.get(page, [(float("nan"),) * 2])) for i in range(2))
             for page, rows in runs.items()}
    return times, statistics.median(colds), None, statistics.median(warmups)


# A setting each page has not computed yet, as the query string a visitor's widget change leaves.
NEW_SETTING = {"home": "present=true", "absolute": "len=200", "rope": "dmax=2000", "biases": "ctx=2048", "content": "head=2",
               "extrapolation": "L=2048", "kv-cache": "n=300", "context-extension": "factor=8.0",
               "retrieval": "chunks=6", "generation": "seed=7", "compare": "layer=1", "about": "present=true",
               "scoreboard": "rows=remap", "workshop": "example=Hard+cut+at+64"}
COLD_GOALS = {"explore_complete": 3.0, "lab_first": 3.0, "lab_complete": 5.0, "new_setting": 2.0}


def measure_cold_visits(models_dir: str | None, timeout_s: float = 180.0):
    """What the very first visitor of each page gets from a new server, and then a new setting.

    Per page: a new server started as the README does (``streamlit run app.py``, torch's default
    threads; ``POSVIZ_WARM=0``, so the page is timed alone, not beside the server's warm-up of every
    other page), and that page is its first visit (imports, checkpoint loading and every computation
    included: nothing is warm). Then, on the same server, a new browser session opens the page with
    a setting it has not computed (``NEW_SETTING``), which is what moving a widget costs, and another
    new session opens that setting again (a later visitor of it, who gets it shared). Returns
    ({url_path: {"section", "cold": (complete, first), "new": (complete, first) or None, "new_later":
    (complete, first) or None}}, problem).
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        return {}, f"not measured: Playwright is not installed ({exc})"
    from .loadtest import StreamlitServer, app_pages, launch_chromium

    if not Path("/usr/bin/chromium").exists():
        return {}, "not measured: /usr/bin/chromium is missing (apt-get install chromium)"
    out = {}
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            for entry in app_pages():
                # POSVIZ_WARM=0: the page's own cost, not shared with the server warming every page beside it
                with StreamlitServer(models=models_dir, torch_threads=None, env={**os.environ, "POSVIZ_WARM": "0"}) as server:
                    complete, first, broken = _visit(browser, server.url + entry.url, timeout_s)
                    cold = (complete, first)
                    new = new_later = None
                    if entry.url_path in NEW_SETTING:
                        url = f"{server.url}/{entry.url_path}?{NEW_SETTING[entry.url_path]}"
                        complete, first, errors = _visit(browser, url, timeout_s)
                        new, broken = (complete, first), broken + errors
                        new_later = _visit(browser, url, timeout_s)[:2]  # a later visitor of it
                out[entry.url_path] = {"section": entry.section, "cold": cold, "new": new, "new_later": new_later,
                                       "exception": broken[:1]}
                print(f"  cold {entry.url_path:>18}: complete {cold[0]:.2f} s, first chart {cold[1]:.2f} s; new setting "
                      + ("n/a" if new is None else f"{new[0]:.2f} s (first chart {new[1]:.2f} s)")
                      + (f"  EXCEPTION: {broken[0][:200]}" if broken else ""), flush=True)
        finally:
            browser.close()
    return out, None


# The floor under every cold visit: a page that draws one metric and imports what posviz pages import.
FLOOR_APPS = {
    "Streamlit alone": "",
    "+ pandas, altair": "import pandas, altair\n",
    "+ pandas, altair, torch": "import pandas, altair, torch\n",
}


def measure_cold_floor(timeout_s: float = 60.0, repeats: int = 2) -> tuple[dict[str, float], str | None]:
    """Cold first visit of minimal apps (one ``st.metric``), each on a new server started as the README
    does, with the repository's ``.streamlit/config.toml``: what no page can go below on this machine
    (browser, Streamlit's own start, and the imports). {label: median complete seconds}."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        return {}, f"not measured: Playwright is not installed ({exc})"
    from .loadtest import StreamlitServer, launch_chromium

    if not Path("/usr/bin/chromium").exists():
        return {}, "not measured: /usr/bin/chromium is missing (apt-get install chromium)"
    times: dict[str, list[float]] = {label: [] for label in FLOOR_APPS}
    with tempfile.TemporaryDirectory(prefix="posviz-floor-") as tmp, sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            for _ in range(repeats):
                for i, (label, imports) in enumerate(FLOOR_APPS.items()):
                    root = Path(tmp) / f"app{i}"
                    (root / ".streamlit").mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / ".streamlit" / "config.toml", root / ".streamlit" / "config.toml")
                    (root / "app.py").write_text(f"import streamlit as st\n{imports}st.metric('bytes', 1)\n")
                    with StreamlitServer(root=root, torch_threads=None) as server:
                        times[label].append(_visit(browser, server.url, timeout_s)[0])
        finally:
            browser.close()
    floor = {label: statistics.median(t) for label, t in times.items()}
    print("  cold floor: " + ", ".join(f"{k} {v:.2f} s" for k, v in floor.items()), flush=True)
    return floor, None


def measure_new_session_floor(timeout_s: float = 60.0, sessions: int = 4) -> float | None:
    """A new browser session on a running server, for the minimal app with posviz's imports (one
    ``st.metric``): what any page's first chart costs a new visitor here before its own work (the
    browser loads Streamlit's frontend, opens its connection, the server runs the script). The first
    session (the server's cold start) is left out; median of the others."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    from .loadtest import StreamlitServer, launch_chromium

    if not Path("/usr/bin/chromium").exists():
        return None
    times = []
    with tempfile.TemporaryDirectory(prefix="posviz-floor-") as tmp, sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            root = Path(tmp)
            (root / ".streamlit").mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / ".streamlit" / "config.toml", root / ".streamlit" / "config.toml")
            (root / "app.py").write_text("import streamlit as st\nimport pandas, altair, torch\nst.metric('bytes', 1)\n")
            with StreamlitServer(root=root, torch_threads=None) as server:
                for _ in range(sessions):
                    times.append(_visit(browser, server.url, timeout_s)[1])
        finally:
            browser.close()
    floor = statistics.median(times[1:])
    print(f"  new-session floor (warm server, one metric): {floor:.2f} s", flush=True)
    return floor


FIRST_REQUEST_GOAL_S = 5.0  # a newly started server's first request, a deep link to a page: complete within this
WARM_UP_SLOWDOWN = 1.2  # the server's warm-up may slow that first visitor's page by at most 20 %
FIRST_REQUEST_VIEWPORT = (1366, 768)  # a speaker's laptop


def measure_first_requests(models_dir: str | None, repeats: int = 1, timeout_s: float = 180.0,
                           pages: list[str] | None = None) -> tuple[dict, str | None]:
    """Seconds until each page is complete when it is a newly started server's very first request (a
    talk's deep link, opened at 1366x768), two ways per page, each on a new server:

    Every server starts with an empty result store (``POSVIZ_STORE`` a new empty folder), as on a fresh clone.
    *as served*: the server as the README starts it, whose first visit also starts its warm-up
    (``views/_serving.warm_the_store``) beside this visitor; *alone*: ``POSVIZ_WARM=0``, the page's own
    cold cost. Their ratio is what the warm-up costs the visitor. Medians of ``repeats``;
    ({url_path: {"section", "served": (complete, first chart), "alone": (complete, first chart),
    "exception": [...]}}, problem or None). ``pages``: url paths to measure (default every page)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        return {}, f"not measured: Playwright is not installed ({exc})"
    from .loadtest import StreamlitServer, app_pages, launch_chromium

    if not Path("/usr/bin/chromium").exists():
        return {}, "not measured: /usr/bin/chromium is missing (apt-get install chromium)"
    width, height = FIRST_REQUEST_VIEWPORT
    served_env = {k: v for k, v in os.environ.items() if k != "POSVIZ_WARM"}  # as `streamlit run app.py` serves
    entries = [e for e in app_pages() if pages is None or e.url_path in pages]
    runs: dict[str, dict] = {e.url_path: {"section": e.section, "served": [], "alone": [], "exception": []}
                             for e in entries}
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            for _ in range(repeats):
                for entry in entries:
                    for how, env in (("served", served_env), ("alone", {**os.environ, "POSVIZ_WARM": "0"})):
                        # a fresh clone's: no result stored yet (``make store`` and the Docker image build one
                        # ahead, which must not be what meets the goal)
                        empty_store = tempfile.mkdtemp(prefix="posviz-empty-store-")
                        with StreamlitServer(models=models_dir, torch_threads=None,
                                             env={**env, "POSVIZ_STORE": empty_store}) as server:
                            tab = browser.new_context(viewport={"width": width, "height": height}).new_page()
                            try:
                                complete, first = _time_page(tab, server.url + entry.url, timeout_s)
                                errors = exception_texts(tab)
                            finally:
                                tab.context.close()
                        shutil.rmtree(empty_store, ignore_errors=True)
                        row = runs[entry.url_path]
                        row[how].append((complete, first))
                        row["exception"] += errors
                        print(f"  first request {entry.url_path:>18} ({how}): complete {complete:.2f} s, first chart "
                              f"{first:.2f} s" + (f"  EXCEPTION: {errors[0][:200]}" if errors else ""), flush=True)
        finally:
            browser.close()
    out = {}
    for page, row in runs.items():
        out[page] = {"section": row["section"], "exception": row["exception"][:1],
                     **{how: tuple(statistics.median(r[i] for r in row[how]) for i in range(2))
                        for how in ("served", "alone")}}
    return out, None
