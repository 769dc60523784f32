"""Drive the real app: start a Streamlit server on loopback, open it in headless Chromium, and load it.

``python -m posviz_tools.loadtest [--sessions 10] [--seconds 60] [--page extrapolation]`` starts its own
server on 127.0.0.1, opens ``--sessions`` browser tabs (one Chromium, one context per tab, so each is
its own Streamlit session) that keep moving the page's widgets for ``--seconds``, then prints how many
answers came back per session, any exception shown on a page, and the server's peak memory.

The browser tests reuse the helpers here. Playwright is a test-only dependency, imported only when a
browser is launched; the browser is Debian's ``/usr/bin/chromium`` (never a downloaded build).
Traffic goes to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

# what a process costs, from /proc (the names stay importable from here: bench_protocol and the tests read them)
from posviz_tools.process_meter import _descendants, browser_cpu_seconds, cpu_seconds, peak_rss_mb  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
# Without the networking flags Chromium keeps dialling Google's hosts, which a closed network refuses.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RENDERED = '[data-testid="stApp"][data-test-script-state="notRunning"]'
EXCEPTION = '[data-testid="stException"]'
MAIN = '[data-testid="stMain"]'
DRAWN = MAIN + ' [data-testid="stElementContainer"]'  # anything a page script has drawn


# ---------------------------------------------------------------------------------------------
# The pages, read from menu.py without importing it (importing would need a running Streamlit).
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PageEntry:
    script: str  # e.g. "views/rope.py"
    title: str
    url_path: str
    default: bool
    section: str = ""  # the navigation menu's heading above it ("Explore", "Live labs", ...)

    @property
    def url(self) -> str:
        """Path of the page on the server; the default page is served at the root."""
        return "/" if self.default else f"/{self.url_path}"


def app_pages(app: Path = ROOT / "menu.py") -> list[PageEntry]:
    """Every page of menu.py's menu (``st.Page("views/x.py", ...)``), in the order of the menu.

    Hidden pages (``visibility="hidden"``, e.g. the ``/home`` alias) and pages made from a function
    are left out: they are not in the menu. The default page's ``url_path`` is ``""`` (it is served
    at ``/``), so its name here is its script's stem.
    """
    tree = ast.parse(app.read_text(), str(app))
    calls = sorted((node for node in ast.walk(tree) if isinstance(node, ast.Call)),
                   key=lambda node: (node.lineno, node.col_offset))
    section_of = {}  # id of each st.Page call -> the menu heading whose list holds it
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.List):
                    section_of.update({id(item): key.value for item in value.elts})
    pages = []
    for node in calls:
        if getattr(node.func, "attr", getattr(node.func, "id", None)) != "Page":
            continue
        if not (node.args and isinstance(node.args[0], ast.Constant)):
            continue  # a page made from a function
        kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords
              if k.arg in ("title", "url_path", "default", "visibility")}
        if kw.get("visibility") == "hidden":
            continue
        script = node.args[0].value
        pages.append(PageEntry(script, kw.get("title", Path(script).stem),
                               kw.get("url_path") or Path(script).stem, bool(kw.get("default", False)),
                               section_of.get(id(node), "")))
    return pages


# ---------------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: ask Linux to stop this server when the test run that started it is killed."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# The README's command. Every other setting is in .streamlit/config.toml, so the tests, the load test
# and the bench measure what a visitor of `streamlit run app.py` (or the Docker Space) gets.
APP_COMMAND = ("streamlit", "run", "app.py")


def server_command(port: int, address: str) -> list[str]:
    """The README's command with only what a run must vary: where it listens."""
    return [sys.executable, "-m", *APP_COMMAND, "--server.port", str(port), "--server.address", address]


WARM_DONE = "posviz: warm-up done"  # the line views/_serving.warm_the_store prints when it has finished


class StreamlitServer:
    """``streamlit run app.py`` on a free 127.0.0.1 port, stopped (with its log kept) on exit."""

    def __init__(self, models: str | Path | None = None, env: dict | None = None, log: Path | None = None,
                 root: str | Path = ROOT, torch_threads: int | None = 1):
        self.root = Path(root)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # env replaces this process's environment when given (e.g. to drop PYTHONPATH)
        base = dict(os.environ if env is None else env)
        # One thread per torch op by default: the tests' browser and many sessions share two cores.
        # None: torch's own default (every core), as `streamlit run app.py` runs for a visitor.
        self.env = base if torch_threads is None else {"OMP_NUM_THREADS": str(torch_threads), **base}
        if models is not None:
            self.env["POSVIZ_CHECKPOINTS"] = str(models)
        self.log_path = log or Path(tempfile.mkstemp(prefix="posviz-server-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None
        self.command: list[str] = server_command(self.port, "127.0.0.1")

    def __enter__(self) -> "StreamlitServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.command, cwd=self.root, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            self.wait_healthy(timeout=90)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/_stcore/health", timeout=5) as response:
                return response.status == 200 and response.read().strip() == b"ok"
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {self.process.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.25)
        raise TimeoutError(f"streamlit not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def peak_rss_mb(self) -> float | None:
        return peak_rss_mb(self.process.pid)

    def wait_warm(self, timeout: float = 600.0) -> float:
        """Wait until the server's warm-up (every page's default view, then the Extrapolation lab's
        slider stops; ``views/_serving.warm_the_store``) has finished, as on a demo that has been up a
        while. It starts with the first visit, so open one page first. Returns the seconds waited."""
        start = deadline = time.monotonic()
        deadline += timeout
        while time.monotonic() < deadline:
            if WARM_DONE in self.log_tail(n=1 << 16):
                return time.monotonic() - start
            if self.process.poll() is not None:
                raise RuntimeError(f"streamlit exited with code {self.process.returncode}:\n{self.log_tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"the server's warm-up did not finish within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


# ---------------------------------------------------------------------------------------------
# Browser
# ---------------------------------------------------------------------------------------------
def launch_chromium(playwright):
    """Debian's Chromium, headless, with the flags this closed network needs."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium).")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)


def script_idle(page) -> bool:
    """The page's script has run and is not running now: its state reads notRunning and the main area
    holds something a run drew. (A fresh tab reads notRunning before its first run has even started,
    Streamlit's initial state, and a busy server can take a while to start that run.)"""
    app = page.locator('[data-testid="stApp"]')
    return bool(app.count() and app.get_attribute("data-test-script-state") == "notRunning"
                and page.locator(DRAWN).count())


# Settled, judged inside the page in one wait: a MutationObserver stamps every change of the script state, and the
# page counts as settled once the script is idle, has drawn something, and no state change has happened for
# ``quiet`` ms of the page's own clock since this wait began. (Polling from Python counted its 100 ms sleeps as the
# quiet time, and three round trips to a busy renderer per poll made a 0.5 s quiet take 2-3 s per page load.)
_SETTLED_JS = """
([quiet, token, drawn]) => {
  const now = performance.now();
  if (!window.__posvizStates) {
    window.__posvizStates = {last: now};
    new MutationObserver(() => { window.__posvizStates.last = performance.now(); })
      .observe(document, {attributes: true, subtree: true, attributeFilter: ['data-test-script-state']});
  }
  if (window.__posvizStates.token !== token) { window.__posvizStates.token = token; window.__posvizStates.start = now; }
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning' || !document.querySelector(drawn)) return false;
  return now - Math.max(window.__posvizStates.last, window.__posvizStates.start) >= quiet;
}
"""


def wait_rendered(page, timeout_ms: float = 60_000, quiet_ms: int = 500) -> None:
    """Wait until Streamlit has run the page script and stayed idle (``script_idle``) for ``quiet_ms`` since this
    call: a widget change or a page's own rerun passes through notRunning briefly, so one sighting is not enough,
    and a rerun a click has asked for may not have started yet when this is called."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.wait_for_selector(RENDERED, timeout=timeout_ms)
    token = f"{time.monotonic_ns()}"
    try:
        page.wait_for_function(_SETTLED_JS, arg=[quiet_ms, token, DRAWN], polling=100, timeout=timeout_ms)
    except PlaywrightTimeout:
        raise TimeoutError(f"the page script did not settle within {timeout_ms / 1000:.0f} s") from None
    page.wait_for_selector(MAIN, timeout=timeout_ms)


def wait_for_change(page, before: tuple[str, str], timeout_s: float = 60) -> tuple[str, str]:
    """Wait until the URL or the main text differs from ``before`` = (url, main text), then for the rerun to settle."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (page.url, main_text(page)) != before:
            wait_rendered(page, timeout_s * 1000)
            return page.url, main_text(page)
        page.wait_for_timeout(200)
    raise AssertionError(f"nothing on the page changed within {timeout_s:.0f} s (URL {page.url})")


def screenshot_whole_main(page, max_height: int, min_height: int | None = None, settle_ms: int = 300,
                          restore_height: int | None = None) -> bytes:
    """PNG of the page's main area with the window made tall enough to hold all of it (at most
    ``max_height`` px, at least ``min_height``, default the window's height); then the window is
    ``restore_height`` tall again (default: as it was). stMain is the scrolling box, so a shot of it
    at the window's own height would hold only what the window shows."""
    width, height = page.viewport_size["width"], page.viewport_size["height"]
    full = page.evaluate("""() => document.querySelector('[data-testid="stMain"]').scrollHeight""")
    page.set_viewport_size({"width": width, "height": int(min(max(full + 40, min_height or height), max_height))})
    page.wait_for_timeout(settle_ms)  # charts re-lay out and draw at the new size
    shot = page.locator(MAIN).screenshot()
    page.set_viewport_size({"width": width, "height": restore_height or height})
    return shot


def exception_texts(page) -> list[str]:
    return [e.inner_text()[:2000] for e in page.query_selector_all(EXCEPTION)]


def main_text(page) -> str:
    return page.inner_text(MAIN)


def move_a_widget(page, slider_label: str | None = None) -> str:
    """Change one input on the page the way a person would; return what was changed.

    ``slider_label``: move the slider whose label starts with this text. Otherwise, in the main
    area: the first slider (arrow key on its thumb), else a select box (pick another option), else a
    checkbox or toggle, else a radio; a page without any falls back to the sidebar's
    presentation-mode toggle. Every widget writes its value to the URL, so the query string changes.
    """
    main = page.locator(MAIN)
    sliders = main.locator('[data-testid="stSlider"]')
    if slider_label is not None:
        sliders = sliders.filter(has=page.locator('[data-testid="stWidgetLabel"]', has_text=slider_label))
        if not sliders.count():
            raise AssertionError(f"no slider labelled {slider_label!r} on {page.url}")
    # Streamlit 1.67 draws a slider as a react-aria <input type="range">; older ones as role="slider"
    slider = sliders.first.locator('input[type="range"], [role="slider"]').first
    if sliders.count():
        label = _label_of(sliders.first)
        slider.focus()
        value = lambda: slider.evaluate("e => e.value !== undefined && e.value !== '' ? e.value : e.getAttribute('aria-valuenow')")
        before = value()
        slider.press("ArrowRight")
        if value() == before:  # at its maximum already
            slider.press("ArrowLeft")
        return f"slider {label!r}"
    select = main.locator('[data-testid="stSelectbox"]').first
    if select.count():
        label = _label_of(select)
        select.locator('[role="combobox"], input').first.click()
        options = page.locator('[role="option"]')
        options.first.wait_for(timeout=10_000)
        for i in range(options.count()):
            if options.nth(i).get_attribute("aria-selected") != "true":
                options.nth(i).click()
                break
        return f"select box {label!r}"
    check = main.locator('[data-testid="stCheckbox"] label').first
    if check.count():
        label = check.inner_text().strip()
        check.click()
        return f"checkbox {label!r}"
    radio = main.locator('[data-testid="stRadio"] label:has(input:not(:checked))').first
    if radio.count():
        label = radio.inner_text().strip()
        radio.click()
        return f"radio option {label!r}"
    toggle = page.locator('[data-testid="stSidebar"] [data-testid="stCheckbox"] label').first
    if toggle.count():
        toggle.click()
        return f"sidebar toggle {toggle.inner_text().strip()!r}"
    raise AssertionError("no slider, select box, checkbox, radio or sidebar toggle on the page to move")


def _label_of(widget) -> str:
    label = widget.locator('[data-testid="stWidgetLabel"]').first
    return label.inner_text().strip() if label.count() else "?"


# ---------------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class LoadResult:
    sessions: int
    seconds: float
    answers: list[int]  # reruns completed per session
    exceptions: list[str]
    errors: list[str]  # sessions that stopped answering, with why
    peak_rss_mb: float | None
    healthy_after: bool
    server_cpu_s: float = 0.0  # CPU the server used while the sessions moved their widgets
    browser_cpu_s: float = 0.0  # and the browser drawing every answer, on the same cores
    # wall-clock seconds between the two CPU readings: a round that starts before ``seconds`` is up runs to its
    # end, so the answers (and the CPU they cost) can take longer than ``seconds``; 0 where not measured
    measured_s: float = 0.0

    def window_s(self) -> float:
        return self.measured_s or self.seconds

    def answer_bound(self) -> float | None:
        """The most answers per session the machine's cores allow at the CPU each answer cost here (server
        and browser together), had nothing else run: all cores busy for the whole time the answers took.
        The answers seen can never pass it (the CPU they used fits in the cores' time) unless the meter
        misses some of that CPU."""
        total = sum(self.answers)
        if not total or not (self.server_cpu_s + self.browser_cpu_s):
            return None
        per_answer = (self.server_cpu_s + self.browser_cpu_s) / total
        return (os.cpu_count() or 1) * self.window_s() / per_answer / self.sessions

    def summary(self) -> str:
        total = sum(self.answers)
        lines = [f"{self.sessions} sessions for {self.seconds:.0f} s: {total} answers "
                 f"({total / self.seconds:.2f}/s), per session {self.answers}",
                 f"exceptions shown: {len(self.exceptions)}; sessions that stopped answering: {len(self.errors)}",
                 f"server peak RSS (VmHWM): {self.peak_rss_mb:.0f} MB" if self.peak_rss_mb else "server peak RSS: n/a",
                 f"health endpoint after the load: {'ok' if self.healthy_after else 'FAILED'}"]
        bound = self.answer_bound()
        if bound is not None:
            total = sum(self.answers)
            lines.append(f"CPU per answer: server {self.server_cpu_s / total:.2f} s, browser {self.browser_cpu_s / total:.2f} s "
                         f"(the browser shares the server's {os.cpu_count()} cores); at that cost the cores allow at most "
                         f"{bound:.1f} answers per session in the {self.window_s():.0f} s the answers took")
            if self.server_cpu_s:  # where each visitor's browser runs on the visitor's own machine
                server_only = (os.cpu_count() or 1) * self.window_s() / (self.server_cpu_s / total) / self.sessions
                lines.append(f"the server's share alone would allow at most {server_only:.0f} answers per session "
                             f"(browsers on the visitors' own machines)")
        return "\n".join(lines + [f"  {e}" for e in self.errors + self.exceptions])


def wait_all_answered(tabs: dict, before: dict, timeout_s: float, quiet_ms: int = 500,
                      step_ms: int = 100) -> dict:
    """Wait for every tab at once until its page changed from ``before[i]`` = (url, main text) and its
    script then stayed idle for ``quiet_ms`` (as ``wait_rendered``). {i: None if answered, else why not}.

    One loop over all tabs: waiting for each in turn would add every tab's quiet time to the round
    (ten tabs x 0.5 s = 5 s a round, at most 12 answers a minute, whatever the server does).
    """
    deadline = time.monotonic() + max(1.0, timeout_s)
    changed, quiet_since, outcome = set(), {}, {}
    while len(outcome) < len(tabs) and time.monotonic() < deadline:
        for i, tab in tabs.items():
            if i in outcome:
                continue
            try:
                if i not in changed and (tab.url != before[i][0] or main_text(tab) != before[i][1]):
                    changed.add(i)
                if i in changed:
                    state = tab.get_attribute('[data-testid="stApp"]', "data-test-script-state", timeout=5_000)
                    now = time.monotonic()
                    if state != "notRunning":
                        quiet_since.pop(i, None)
                    elif now - quiet_since.setdefault(i, now) >= quiet_ms / 1000:
                        outcome[i] = None
            except Exception as exc:
                if type(exc).__name__ == "TimeoutError":  # the browser is too busy to read this tab now: not yet
                    continue
                outcome[i] = f"{type(exc).__name__}: {str(exc)[:300]}"  # a tab that cannot be read: not answering
        next(iter(tabs.values())).wait_for_timeout(step_ms)
    for i in tabs:
        outcome.setdefault(i, "nothing on the page changed" if i not in changed else "the page did not settle")
    return outcome


def tab_round(tabs: dict, alive: set, names: dict, slider_label: str | None,
              timeout_s: float) -> tuple[list[int], list[str], list[str]]:
    """One round of browser tabs: move a widget in every tab of ``alive`` without waiting, then wait for
    all of them at once. Returns (the tabs answered, the error boxes they show, why others stopped); a
    tab that stopped leaves ``alive``."""
    before, shown, stopped = {}, [], []
    for i in sorted(alive):
        try:
            before[i] = (tabs[i].url, main_text(tabs[i]))
            move_a_widget(tabs[i], slider_label)
        except Exception as exc:  # a tab that cannot be driven counts as not answering
            stopped.append(f"{names[i]}: {type(exc).__name__}: {str(exc)[:300]}")
            alive.discard(i)
    answered = []
    for i, outcome in wait_all_answered({i: tabs[i] for i in alive}, before, timeout_s).items():
        if outcome is None:
            answered.append(i)
            shown += [f"{names[i]}: {t}" for t in exception_texts(tabs[i])]
        else:
            stopped.append(f"{names[i]}: no answer: {outcome}")
            alive.discard(i)
    return answered, shown, stopped


def run_load(server: StreamlitServer, page_path: str, sessions: int, seconds: float,
             slider_label: str | None = None, answer_timeout_s: float = 60, grace_s: float = 60,
             warm_first: bool = False) -> LoadResult:
    """``sessions`` tabs on ``page_path`` moving a widget in turn until ``seconds`` have passed.

    One Chromium with one context per session. The tabs are driven round-robin from this thread
    (Playwright's sync API is single-threaded): each round moves a widget in every tab without
    waiting, so the server always has reruns from several sessions at once, then collects the
    answers. Bounded: no new round starts after ``seconds``, and a session that has not answered
    ``grace_s`` after that counts as stopped. ``warm_first``: one visit of ``page_path`` first, then
    wait for the server's warm-up to finish (a demo that has been up a while before its crowd comes).
    """
    from playwright.sync_api import sync_playwright

    answers, errors, exceptions = [0] * sessions, [], []
    server_cpu = browser_cpu = measured_s = 0.0
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            if warm_first:
                tab = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
                tab.goto(server.url + page_path, wait_until="commit")
                wait_rendered(tab, (answer_timeout_s + grace_s) * 1000)
                tab.context.close()
                print(f"warm-up done {server.wait_warm():.0f} s after the first visit", flush=True)
            tabs = []
            for _ in range(sessions):
                tab = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
                tab.set_default_timeout(answer_timeout_s * 1000)
                tab.goto(server.url + page_path, wait_until="commit")
                tabs.append(tab)
            for tab in tabs:  # all ten first renders run on the server at the same time
                wait_rendered(tab, (answer_timeout_s + grace_s) * 1000)
            alive = set(range(sessions))
            server_cpu, browser_cpu = cpu_seconds(server.process.pid), browser_cpu_seconds()
            measured_from = time.monotonic()
            deadline = time.monotonic() + seconds
            hard_deadline = deadline + grace_s
            names = {i: f"session {i}" for i in range(sessions)}
            while time.monotonic() < deadline and alive:
                answered, shown, stopped = tab_round(tabs, alive, names, slider_label,
                                                     min(answer_timeout_s, hard_deadline - time.monotonic()))
                for i in answered:
                    answers[i] += 1
                exceptions += shown
                errors += stopped
            server_cpu = cpu_seconds(server.process.pid) - server_cpu
            browser_cpu = browser_cpu_seconds() - browser_cpu
            measured_s = time.monotonic() - measured_from
        finally:
            browser.close()
    return LoadResult(sessions, seconds, answers, exceptions, errors, server.peak_rss_mb(), server.healthy(),
                      server_cpu, browser_cpu, measured_s)


# ---------------------------------------------------------------------------------------------
# A crowd that speaks the protocol (views/_warm.ProtocolSession, as the server's warm-up does): the
# server's capacity, without a browser drawing every answer on the same cores
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class SessionRecord:
    page: str
    widget: str = ""
    latencies: list = dataclasses.field(default_factory=list)  # seconds of each answer after the first visit
    errors: list = dataclasses.field(default_factory=list)
    opened_s: float | None = None  # the first visit's answer

    @property
    def answers(self) -> int:
        return len(self.latencies)


@dataclasses.dataclass
class CrowdResult:
    sessions: list[SessionRecord]
    seconds: float
    server_cpu_s: float
    driver_cpu_s: float  # this process: the protocol sessions (and the browser tabs' driver)
    browser_cpu_s: float
    peak_rss_mb: float | None
    healthy_after: bool
    tabs: list[int] = dataclasses.field(default_factory=list)  # answers drawn by each browser tab
    tab_problems: list[str] = dataclasses.field(default_factory=list)  # error boxes or tabs that stopped

    @property
    def answers(self) -> list[int]:
        return [s.answers for s in self.sessions]

    @property
    def latencies(self) -> list[float]:
        return sorted(t for s in self.sessions for t in s.latencies)

    def percentile(self, q: float) -> float | None:
        lat = self.latencies
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None

    @property
    def errors(self) -> list[str]:
        return [f"session {i} ({s.page}): {e}" for i, s in enumerate(self.sessions) for e in s.errors]

    @property
    def cpu_per_answer(self) -> float | None:
        total = sum(self.answers) + sum(self.tabs)
        return self.server_cpu_s / total if total else None

    def summary(self) -> str:
        import statistics

        answers = self.answers
        total = sum(answers)
        lines = [f"{len(self.sessions)} protocol sessions for {self.seconds:.0f} s: {total} answers "
                 f"({total / self.seconds:.2f}/s); per session min {min(answers, default=0)}, median "
                 f"{statistics.median(answers) if answers else 0:g}, max {max(answers, default=0)}"]
        if total:
            lines.append(f"latency: median {self.percentile(0.5):.2f} s, 95th percentile {self.percentile(0.95):.2f} s")
        lines.append(f"errors: {len(self.errors)}; sessions never answered after their first visit: "
                     f"{sum(1 for n in answers if n == 0)}")
        if self.tabs:
            lines.append(f"{len(self.tabs)} browser tabs in the crowd: answers drawn {self.tabs}; problems: "
                         f"{len(self.tab_problems)}")
        if self.cpu_per_answer is not None:
            lines.append(f"server CPU per answer: {self.cpu_per_answer:.3f} s ({self.server_cpu_s:.1f} s in all); "
                         f"the driver used {self.driver_cpu_s:.1f} s and the browser {self.browser_cpu_s:.1f} s of the same "
                         f"{os.cpu_count()} cores")
        lines.append(f"server peak RSS (VmHWM): {self.peak_rss_mb:.0f} MB" if self.peak_rss_mb else "server peak RSS: n/a")
        lines.append(f"health endpoint after the crowd: {'ok' if self.healthy_after else 'FAILED'}")
        return "\n".join(lines + [f"  {e}" for e in (self.errors + self.tab_problems)[:20]])


def stream_url(server: "StreamlitServer") -> str:
    return server.url.replace("http://", "ws://") + "/_stcore/stream"


def _protocol_session(url: str, page: str, query: str, label: str | None, deadline: float, record: SessionRecord,
                      answer_timeout_s: float, start_gate) -> None:
    from views._warm import ProtocolSession, main_widget, next_stops

    try:
        start_gate.wait()
        with ProtocolSession(url, page, query, timeout_s=answer_timeout_s) as session:
            first = session.open()
            record.opened_s = first.seconds
            if not first.ok:
                record.errors.append(f"first visit: {first.status} {first.exceptions[:1]}")
                return
            widget = main_widget(session, label)
            if widget is None:
                record.errors.append("no widget to move on the page")
                return
            record.widget = widget.label
            stops, turn = next_stops(widget), 1
            while turn == 1 or time.monotonic() < deadline:  # every visitor moves it once, however late it came
                answer = session.move(widget.label, stops[turn % len(stops)])
                turn += 1
                if not answer.ok:
                    record.errors.append(f"{widget.label}: {answer.status} {answer.exceptions[:1]}")
                    continue
                record.latencies.append(answer.seconds)
                widget = session.widgets.get(widget.label, widget)  # a rerun may announce new options
    except Exception as exc:  # a session that cannot go on counts its error, the crowd goes on
        record.errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")


def run_crowd(server: "StreamlitServer", pages: list[str], sessions: int, seconds: float, label: str | None = None,
              browser_tabs: int = 0, answer_timeout_s: float = 120, seed: int = 0, arrival_s: float = 0.0) -> CrowdResult:
    """``sessions`` protocol sessions, each opening a page of ``pages`` (url paths with an optional query
    string; picked at random with ``seed`` when there are several) and then moving one widget on it
    (``label``, or the page's main widget: ``views/_warm.main_widget``) until ``seconds`` have passed; they arrive
    spread over ``arrival_s``. ``browser_tabs`` Chromium tabs ride along in the same crowd, each on a
    page of its own, moving a widget and checking what they draw (no error box)."""
    import random
    import threading

    rng = random.Random(seed)
    url = stream_url(server)
    chosen = [pages[0] if len(pages) == 1 else rng.choice(pages) for _ in range(sessions)]
    records = [SessionRecord(page) for page in chosen]
    gate = threading.Event()
    cpu0, driver0, browser0 = cpu_seconds(server.process.pid), time.process_time(), browser_cpu_seconds()
    deadline = time.monotonic() + seconds
    threads = []
    for i, page in enumerate(chosen):
        path, _, query = page.lstrip("/").partition("?")
        delay = arrival_s * i / max(1, sessions)
        t = threading.Thread(target=lambda *a, d=delay: (time.sleep(d), _protocol_session(*a)),
                             args=(url, path, query, label, deadline, records[i], answer_timeout_s, gate), daemon=True)
        t.start()
        threads.append(t)
    gate.set()
    tabs, problems = ([], []) if not browser_tabs else _ride_along(server, [rng.choice(pages) for _ in range(browser_tabs)],
                                                                  deadline, answer_timeout_s)
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic()) + answer_timeout_s)
    for r, t in zip(records, threads):
        if t.is_alive():
            r.errors.append(f"no answer within {answer_timeout_s:.0f} s of the end")
    return CrowdResult(records, seconds, cpu_seconds(server.process.pid) - cpu0, time.process_time() - driver0,
                       browser_cpu_seconds() - browser0, server.peak_rss_mb(), server.healthy(), tabs, problems)


def _ride_along(server: "StreamlitServer", pages: list[str], deadline: float, answer_timeout_s: float):
    """Browser tabs in a protocol crowd, until ``deadline``: ([answers drawn per tab], [problems seen])."""
    from playwright.sync_api import sync_playwright

    answers, problems = [0] * len(pages), []
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            tabs = {}
            for i, page in enumerate(pages):
                tab = browser.new_context(viewport={"width": 1366, "height": 768}).new_page()
                tab.set_default_timeout(answer_timeout_s * 1000)
                tab.goto(server.url + "/" + page.lstrip("/"), wait_until="commit")
                tabs[i] = tab
            for i, tab in tabs.items():
                wait_rendered(tab, answer_timeout_s * 1000)
                problems += [f"tab {i} ({pages[i]}): {t}" for t in exception_texts(tab)]
            alive, names = set(tabs), {i: f"tab {i} ({page})" for i, page in enumerate(pages)}
            while time.monotonic() < deadline and alive:
                answered, shown, stopped = tab_round(tabs, alive, names, None, answer_timeout_s)
                for i in answered:
                    answers[i] += 1
                problems += shown + stopped
        finally:
            browser.close()
    return answers, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--page", default="extrapolation", help="url_path of the page to load (see app.py)")
    parser.add_argument("--slider", default="Evaluation length", help="label of the slider to move (start of it)")
    parser.add_argument("--models", default=None, help="checkpoint folder (default: $POSVIZ_CHECKPOINTS or models/)")
    parser.add_argument("--max-rss-mb", type=float, default=1536, help="fail if the server's peak RSS exceeds this")
    parser.add_argument("--min-answers", type=int, default=1, help="fail if a session got fewer answers than this")
    parser.add_argument("--cold", action="store_true", help="start the load on the new server at once, without "
                        "waiting for its warm-up (by default one visit starts it and the load waits until it is done)")
    parser.add_argument("--protocol", action="store_true", help="sessions speak Streamlit's WebSocket protocol and "
                        "draw nothing (views/_warm.ProtocolSession): the server's own capacity")
    parser.add_argument("--page-at-random", action="store_true", help="with --protocol: each session opens a page of "
                        "the menu at random (and moves its first slider or select box) instead of --page")
    parser.add_argument("--browser-tabs", type=int, default=0, help="with --protocol: Chromium tabs in the same crowd")
    parser.add_argument("--arrival", type=float, default=0.0, help="with --protocol: seconds over which sessions arrive")
    parser.add_argument("--max-median-s", type=float, default=None, help="fail if the median answer took longer")
    parser.add_argument("--max-p95-s", type=float, default=None, help="fail if the 95th percentile took longer")
    parser.add_argument("--fair", action="store_true", help="fail if the fewest answers in a session are under half "
                        "the median")
    args = parser.parse_args(argv)
    paths = {p.url_path: p.url for p in app_pages()}
    if args.page not in paths:
        parser.error(f"unknown page {args.page!r}; pages: {', '.join(paths)}")
    if args.protocol:
        return crowd_main(args, paths)
    with StreamlitServer(models=args.models) as server:
        print(f"server {server.url} (pid {server.process.pid}); loading {paths[args.page]} ...", flush=True)
        result = run_load(server, paths[args.page], args.sessions, args.seconds, args.slider or None,
                          warm_first=not args.cold)
    print(result.summary())
    ok = (not result.exceptions and not result.errors and result.healthy_after
          and min(result.answers) >= max(1, args.min_answers)
          and (result.peak_rss_mb or 0) <= args.max_rss_mb)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def crowd_main(args, paths: dict[str, str]) -> int:
    """``--protocol``: a crowd of protocol sessions (and ``--browser-tabs`` tabs) on a warm server."""
    import statistics

    pages = list(paths.values()) if args.page_at_random else [paths[args.page]]
    label = None if args.page_at_random else (args.slider or None)
    with StreamlitServer(models=args.models, torch_threads=None) as server:
        print(f"server {server.url} (pid {server.process.pid}); {args.sessions} protocol sessions on "
              f"{'every page at random' if args.page_at_random else pages[0]} ...", flush=True)
        if not args.cold:
            from views._warm import ProtocolSession

            with ProtocolSession(stream_url(server), pages[0].lstrip("/").partition("?")[0]) as first:
                first.open()
            print(f"warm-up done {server.wait_warm():.0f} s after the first visit", flush=True)
        result = run_crowd(server, pages, args.sessions, args.seconds, label, browser_tabs=args.browser_tabs,
                           arrival_s=args.arrival)
    print(result.summary())
    answers = result.answers
    checks = {
        "no error": not result.errors and not result.tab_problems,
        "every session answered": min(answers, default=0) >= max(1, args.min_answers),
        "server healthy after": result.healthy_after,
        f"peak RSS <= {args.max_rss_mb:.0f} MB": (result.peak_rss_mb or 0) <= args.max_rss_mb,
    }
    if args.fair:
        checks["fewest answers >= half the median"] = min(answers, default=0) >= 0.5 * statistics.median(answers or [0])
    if args.max_median_s is not None:
        checks[f"median <= {args.max_median_s} s"] = (result.percentile(0.5) or 1e9) <= args.max_median_s
    if args.max_p95_s is not None:
        checks[f"95th percentile <= {args.max_p95_s} s"] = (result.percentile(0.95) or 1e9) <= args.max_p95_s
    if args.browser_tabs:
        checks["every browser tab drew answers"] = min(result.tabs, default=0) >= 1
    for name, ok in checks.items():
        print(f"  {'met   ' if ok else 'MISSED'} {name}")
    ok = all(checks.values())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
