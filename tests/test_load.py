"""Ten concurrent visitors on a live lab, bounded in time, against a server on 127.0.0.1 only.

One Chromium with ten contexts (ten Streamlit sessions) keeps moving the extrapolation lab's length
slider for LOAD_SECONDS (each move re-scores the text with every chosen checkpoint); every session must keep answering, no page may show an exception, the
server must stay healthy, and its peak resident memory (VmHWM from /proc) must stay bounded.
`make load` (python -m posviz_tools.loadtest) runs the same for a minute on the shipped checkpoints.
"""
from __future__ import annotations

import os

import pytest

from browser_support import OUTPUT, StreamlitServer, app_pages
from posviz_tools.loadtest import run_load

pytestmark = pytest.mark.browser
SESSIONS = 10
LOAD_SECONDS = float(os.environ.get("POSVIZ_LOAD_SECONDS", "15"))
# Three checkpoints (absolute, relative bias, rotary) keep a round of ten answers within a few
# seconds on 2 cores; `make load` runs all seven for a minute.
CHECKPOINTS = "sinusoidal,alibi,rope"
SLIDER = "Evaluation length"  # the lab's main control: every move re-scores every checkpoint
MAX_PEAK_RSS_MB = 3072  # tiny checkpoints; the app's memoised results are bounded by limits.CACHE_ENTRIES


def test_ten_sessions_on_the_extrapolation_lab(tiny_models_dir):
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
