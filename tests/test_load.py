"""Four concurrent visitors on a live lab, bounded in time, against a server on 127.0.0.1 only.

One Chromium with four contexts (four Streamlit sessions) keeps moving the extrapolation lab's length
slider for LOAD_SECONDS (each move re-scores the text with every chosen checkpoint); every session must keep answering, no page may show an exception, the
server must stay healthy, and its peak resident memory (VmHWM from /proc) must stay bounded.
`make load` (python -m posviz_tools.loadtest) runs ten, then a hundred, for minutes on the shipped checkpoints;
here four tabs are enough to have several sessions' reruns on the server at once, and keep the suite short (each tab
is a page load and an answer drawn per round, 5 s of Chromium's CPU a tab on the 2 cores the server shares; six took
over a minute of the suite).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from browser_support import OUTPUT, StreamlitServer, app_pages
from posviz_tools.loadtest import run_load
from posviz_tools.process_meter import _descendants, browser_cpu_seconds

pytestmark = pytest.mark.browser
SESSIONS = 4
LOAD_SECONDS = float(os.environ.get("POSVIZ_LOAD_SECONDS", "4"))  # one or two rounds of answers
# Three checkpoints (absolute, relative bias, rotary) keep a round of answers within a few
# seconds on 2 cores; `make load` runs all seven for a minute.
CHECKPOINTS = "sinusoidal,alibi,rope"
SLIDER = "Evaluation length"  # the lab's main control: every move re-scores every checkpoint
MAX_PEAK_RSS_MB = 3072  # tiny checkpoints; the app's memoised results are bounded by limits.CACHE_ENTRIES


def test_concurrent_sessions_on_the_extrapolation_lab(tiny_models_dir):
    lab = next(p.url for p in app_pages() if p.url_path == "extrapolation") + f"?models={CHECKPOINTS}"
    with StreamlitServer(models=tiny_models_dir, log=OUTPUT / "server-load.log") as server:
        result = run_load(server, lab, sessions=SESSIONS, seconds=LOAD_SECONDS, slider_label=SLIDER)
        log = server.log_tail()
    report = result.summary()
    (OUTPUT / "load.txt").write_text(report + "\n")
    print(report)
    assert not result.errors, f"sessions stopped answering:\n{report}\n{log}"
    assert not result.exceptions, report
    assert all(n >= 1 for n in result.answers), report
    assert result.healthy_after, report
    assert result.peak_rss_mb is not None and result.peak_rss_mb < MAX_PEAK_RSS_MB, report
    # the report says what an answer cost the server and the browser, and what the cores allow at that cost
    assert result.server_cpu_s > 0 and result.browser_cpu_s > 0, report
    assert "CPU per answer: server" in report and result.answer_bound() >= min(result.answers) * 0.5, report


def test_a_short_protocol_crowd(tiny_models_dir):
    """The protocol driver on a real server: three sessions that speak Streamlit's WebSocket protocol
    (no browser) move the Extrapolation lab's length slider for a few seconds, and one opens a page at
    random and moves its first widget. Each must be answered, with no error box, and the report must
    say what an answer cost the server."""
    from posviz_tools.loadtest import run_crowd
    from views._warm import ProtocolSession

    lab = next(p.url for p in app_pages() if p.url_path == "extrapolation") + f"?models={CHECKPOINTS}"
    # the crowd alone on the server: no warm-up beside it; the server's two threads even where the tests run in two
    # workers (pytest-xdist), whose other tests take their share of the cores meanwhile
    quiet = {**os.environ, "POSVIZ_WARM": "0", "OMP_NUM_THREADS": "2"}
    with StreamlitServer(models=tiny_models_dir, env=quiet, log=OUTPUT / "server-crowd.log") as server:
        result = run_crowd(server, [lab], sessions=3, seconds=8, label=SLIDER)
        mixed = run_crowd(server, [p.url for p in app_pages()], sessions=2, seconds=3, seed=3)
        # a link whose n is below the next window: moving W reruns the fragment alone, which must say so in
        # place (the notice slot under the title is outside the fragment; writing there raised every move)
        junk = run_crowd(server, ["/kv-cache?models=alibi,rope&W=64&n=96"], sessions=1, seconds=2, label="Window W")
        # what a session reads off the page: the slider's id, its options and the value shown
        with ProtocolSession(server.url.replace("http", "ws") + "/_stcore/stream", "extrapolation",
                             f"models={CHECKPOINTS}&L=64") as session:
            opened = session.open()
            slider = session.widgets["Evaluation length (bytes)"]
            moved = session.move(slider.label, slider.options[0])
    report = result.summary()
    print(report, mixed.summary(), sep="\n")
    assert opened.ok and moved.ok and opened.messages > moved.messages > 0, (opened, moved)
    assert slider.kind == "slider" and slider.value.startswith("64 ") and len(slider.options) > 3
    assert not result.errors and not mixed.errors, report + mixed.summary()
    assert not junk.errors and junk.answers[0] >= 1, junk.summary()
    assert min(result.answers) >= 1 and sum(result.answers) >= 4, report  # each session kept moving it
    assert all(s.widget == "Evaluation length (bytes)" for s in result.sessions), report
    assert all(n >= 1 for n in mixed.answers), mixed.summary()
    assert result.server_cpu_s > 0 and result.cpu_per_answer is not None and result.healthy_after, report
    assert "latency: median" in report and "server CPU per answer" in report


# ---------------------------------------------------------------------------------------------
# The CPU meter counts the Chromium this run started and no one else's. A CI run (two pytest workers) measured the
# browser's CPU during the load test as -32 s: the meter summed every Chromium process on the machine, and the other
# worker's browser closed between its two readings. These tests start busy processes named as Chromium names its own
# (the kernel's comm, set with prctl) below and beside this process, and read the meter.
# ---------------------------------------------------------------------------------------------
# A child that names itself "chrome-test" (PR_SET_NAME = 15), prints "ready", and spins for `seconds` of CPU.
SPIN = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"chrome-test", 0, 0, 0)
print("ready", flush=True)
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
open(sys.argv[3], "w").close()  # done spinning
time.sleep(float(sys.argv[2]))
"""


def _spin(seconds: float, linger: float, done, detached: bool = False) -> subprocess.Popen:
    if detached:  # started by a shell that exits at once, so the spinner's parent is no longer this process
        cmd = f"{sys.executable} -c '{SPIN}' {seconds} {linger} {done} > /dev/null 2>&1 & echo $!"
        shell = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True, start_new_session=True)
        return int(shell.stdout.split()[-1])
    process = subprocess.Popen([sys.executable, "-c", SPIN, str(seconds), str(linger), str(done)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def _wait_for(*files, at_most_s: float = 60.0) -> None:
    deadline = time.monotonic() + at_most_s  # a loaded CI machine may take a while to give 0.6 s of CPU
    while not all(f.exists() for f in files):
        assert time.monotonic() < deadline, "the spinners did not finish"
        time.sleep(0.05)


def test_a_chromium_child_of_this_process_is_counted_and_a_strangers_is_not(tmp_path):
    stranger = _spin(0.6, 60.0, tmp_path / "stranger", detached=True)
    before = browser_cpu_seconds()
    own = _spin(0.6, 60.0, tmp_path / "own")
    try:
        assert own.pid in _descendants(os.getpid())
        assert stranger not in _descendants(os.getpid())
        _wait_for(tmp_path / "stranger", tmp_path / "own")  # both have spun their 0.6 s of CPU and sleep
        used = browser_cpu_seconds() - before
        # the own spinner's 0.6 s, not the stranger's as well (1.2 s)
        assert 0.45 <= used <= 0.9, used
    finally:
        own.kill()
        own.wait()
        os.kill(stranger, 9)


def test_a_stranger_chromium_that_exits_between_readings_cannot_make_the_reading_fall(tmp_path):
    stranger = _spin(0.5, 0.0, tmp_path / "stranger", detached=True)  # spins, then exits during the reading
    before = browser_cpu_seconds()
    _wait_for(tmp_path / "stranger")
    time.sleep(0.2)
    assert browser_cpu_seconds() - before >= 0.0
    try:
        os.kill(stranger, 9)
    except ProcessLookupError:
        pass
