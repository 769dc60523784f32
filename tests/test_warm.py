"""The server's warm-up (views/_serving.warm_the_store, views/_warm.py): it opens every page itself at its
defaults, so a visitor of a server that has been up a while finds every lab's default view computed."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from browser_support import OUTPUT, StreamlitServer, browser, exception_texts, new_tab, wait_rendered  # noqa: F401
from posviz_tools.loadtest import WARM_DONE, app_pages
from views._warm import ProtocolSession, server_stream_url

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("address, port, base, url", [
    (None, 8501, None, "ws://127.0.0.1:8501/_stcore/stream"),
    ("", 8501, "", "ws://127.0.0.1:8501/_stcore/stream"),
    ("0.0.0.0", 7860, None, "ws://127.0.0.1:7860/_stcore/stream"),  # the Docker Space listens on every interface
    ("::", 7860, None, "ws://127.0.0.1:7860/_stcore/stream"),
    ("10.1.2.3", 80, "/demo/posviz/", "ws://10.1.2.3:80/demo/posviz/_stcore/stream"),
    ("::1", 8501, "app", "ws://[::1]:8501/app/_stcore/stream"),
])
def test_the_warm_up_reaches_its_own_server(address, port, base, url):
    assert server_stream_url(address, port, base) == url


def test_no_warm_up_without_a_server(tiny_models):
    """Under AppTest there is no server to visit (and a test's process must not compute in the background)."""
    at = AppTest.from_file(str(ROOT / "menu.py"), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title, "the home page did not render"
    assert not [t for t in threading.enumerate() if t.name == "posviz-warm"]


@pytest.mark.browser
def test_a_warm_server_has_every_labs_default_view_ready(tiny_models_dir, browser):
    """One visit starts the warm-up; once it is done, a new session on a lab computes nothing: its run draws no
    progress bar (each computation draws one for as long as it runs), and the page is complete. The bars are read
    from what the server sends (a session that speaks Streamlit's protocol): on the tiny checkpoints a computation
    ends before a browser could paint its bar. The first visit, on a lab of a server that has computed nothing, is
    sent its bars: what a visitor would get if the warm-up had left work for them."""
    labs = [p for p in app_pages() if p.section == "Live labs"]
    as_shipped = {**os.environ, "POSVIZ_WARM": "1"}  # conftest.py turns it off for every other test server
    with StreamlitServer(models=tiny_models_dir, log=OUTPUT / "server-warm.log", env=as_shipped) as server:
        stream = server_stream_url("127.0.0.1", server.port, None)
        with ProtocolSession(stream, labs[0].url.lstrip("/")) as first:  # a visitor: it starts the warm-up
            cold = first.open()
        assert cold.ok and cold.progress, f"{labs[0].url_path}: a cold server's first visit computed nothing ({cold})"
        server.wait_warm(timeout=300)
        log = server.log_tail(1 << 16)
        assert "every page's default view computed" in log and WARM_DONE in log, log
        assert "did not finish" not in log and "stopped" not in log, log
        for entry in labs:
            with ProtocolSession(stream, entry.url.lstrip("/")) as session:
                answer = session.open()
            assert answer.ok and answer.texts, (entry.url_path, answer.status, answer.exceptions)
            assert not answer.progress, f"{entry.url_path}: computed for its visitor after the warm-up: {answer.progress}"
        tab = new_tab(browser)  # and a browser's tab finds a lab whole
        try:
            tab.goto(server.url + labs[-1].url)
            wait_rendered(tab)
            assert not exception_texts(tab), (labs[-1].url_path, exception_texts(tab))
        finally:
            tab.close()


def test_a_server_prepares_every_checkpoint_before_its_first_visit_and_skips_a_broken_one(tiny_models_dir, tmp_path,
                                                                                         monkeypatch, capsys):
    """app.py's lifespan (views/_startup.prepare_server): every page helper and first-use library imported, every
    shipped checkpoint read and run once (kept by open_model, the objects the pages then get), and a checkpoint
    that cannot be read is named in the log and skipped: the server still starts, and the pages say why."""
    import shutil
    import sys

    from posviz.models.interface import forget_models, opened_models
    from views import _startup

    models = tmp_path / "models"
    shutil.copytree(tiny_models_dir, models)
    (models / "rope" / "model.safetensors").write_bytes(b"not safetensors")
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(models))
    forget_models()
    seconds = _startup.prepare_server()
    log = capsys.readouterr().out
    assert seconds > 0 and "server prepared" in log
    assert f"{models / 'rope'} not prepared" in log
    assert f"{len(list(models.iterdir())) - 1} shipped checkpoints read and run once" in log, log
    assert len(opened_models()) == len(list(models.iterdir()))  # rope opened too; its weights failed on its first pass
    assert {"views._charts", "views._serving", "pandas.io.formats.style", "streamlit.emojis"} <= set(sys.modules)
    assert not any(name.startswith("views.") and not name.split(".")[1].startswith("_") for name in sys.modules), \
        "a page script was imported (it would have drawn outside any visit)"
    forget_models()
