"""Live work shared by every session of this server, queued (``posviz.serving``): the one store of
results, the one work queue, the progress and place in line a visitor sees meanwhile, and the
server's warm-up.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import streamlit as st

from posviz.models.checkpoint_files import shipped_checkpoints


@st.cache_resource(show_spinner=False)
def shared_results():
    """The server's one store of live results (bounded in entries and bytes, see posviz.limits), backed by
    the result files (``result_files``): what the warm-up computed on an earlier start is read back."""
    from posviz.serving import SharedResults

    return SharedResults(files=result_files())


STORE_ENV = "POSVIZ_STORE"  # where results are kept between starts; "0" keeps them in memory only


def result_files():
    """The folder of results kept between server starts (``posviz.result_files``): ``$POSVIZ_STORE``, else
    ``.posviz-store/`` beside app.py; None when ``POSVIZ_STORE=0``."""
    import os
    from pathlib import Path

    from posviz.limits import default_device
    from posviz.result_files import ResultFiles

    where = os.environ.get(STORE_ENV, "")
    if where == "0":
        return None
    return ResultFiles(where or Path(__file__).resolve().parent.parent / ".posviz-store", default_device().type)


@st.cache_resource(show_spinner=False)
def work_queue():
    """The server's one queue of heavy computations (``HEAVY_SLOTS`` at once)."""
    from posviz.serving import WorkQueue

    return WorkQueue()


DRAGGED_STOPS = 2  # stops after each page's default that the warm-up drags its main widget to
# The warm-up opens its next page only once no visitor's page has run for this long: a visitor's browser
# is still drawing the page for a few seconds after its script has finished, on the same 2 cores (a new
# server's first visitor of the Sinusoidal & learned page took 8.9 s beside the warm-up, 6.8 s alone).
QUIET_S = 3.0


class _VisitorRuns:
    """How many visitors' page scripts are running now, and when the last one ended (``visitor_run``)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.last_end = time.monotonic()

    def quiet_for(self) -> float:
        """Seconds since the last visitor's run ended; 0 while one is running."""
        with self.lock:
            return 0.0 if self.running else time.monotonic() - self.last_end


@st.cache_resource(show_spinner=False)
def visitor_runs() -> _VisitorRuns:
    return _VisitorRuns()


@contextmanager
def visitor_run():
    """Around a page's run (app.py): counted as a visitor's unless it is the warm-up's own session, so
    that the warm-up waits for every visitor's page (``wait_for_visitors``)."""
    if _warming():
        yield
        return
    runs = visitor_runs()
    with runs.lock:
        runs.running += 1
    try:
        yield
    finally:
        with runs.lock:
            runs.running -= 1
            runs.last_end = time.monotonic()


def wait_for_visitors(runs: _VisitorRuns, quiet_s: float = QUIET_S, poll_s: float = 0.2) -> None:
    """Return once no visitor's page has run for ``quiet_s`` seconds."""
    while (quiet := runs.quiet_for()) < quiet_s:
        time.sleep(max(poll_s, quiet_s - quiet) if quiet else poll_s)


@st.cache_resource(show_spinner=False)
def warm_the_store(pages: tuple[str, ...]):
    """Once per server, from the first visitor's run (app.py calls it on every run; Streamlit runs it
    once): a background thread that makes the server its own first visitor. It opens each of
    ``pages`` (URL paths, in this order) at its default settings in a session of its own
    (``views/_warm.py``), so every page's default view is in the shared store before most visitors
    arrive; then it computes the Extrapolation lab's default view at every other slider stop, and moves
    every page's main widget (``views/_warm.main_widget``) to its ``DRAGGED_STOPS`` next stops, as a crowd
    after a talk drags the same slider. All of it is background work of the work queue: a visitor's
    computation always goes first.

    ``POSVIZ_WARM=0`` turns it off (the bench does, to time a first visitor on a server that has
    computed nothing). Not under ``AppTest``, which has no server to visit.
    """
    import os

    if os.environ.get("POSVIZ_WARM", "1") == "0" or not st.context.headers.get("Host"):
        return None
    from views._warm import server_stream_url

    url = server_stream_url(st.get_option("server.address"), int(st.get_option("server.port")),
                            st.get_option("server.baseUrlPath"))
    results, queue, runs = shared_results(), work_queue(), visitor_runs()

    def warm():
        # Everything the warm-up needs is read here, in its own thread, once the first visitor's page has been
        # drawn: the imports of the labs (2.5 s) and the documents would otherwise run in that visitor's run.
        wait_for_visitors(runs)
        from posviz.labs import extrapolation
        from posviz.labs.inputs import prepare_text
        from posviz.positions import POSITION_METHODS
        from posviz.training.data import load_corpus
        from views._warm import visit

        shipped = {name: folder for name, folder in shipped_checkpoints().items() if name in POSITION_METHODS}
        # the lab's default choice, in its order (the first is the one it inspects)
        folders = [str(shipped[name]) for name in extrapolation.FIRST_VIEW if name in shipped] or \
            [str(folder) for folder in shipped.values()]
        documents = list(load_corpus().eval_documents)  # what views._text.validation_documents reads
        start = time.perf_counter()
        for page in pages:
            wait_for_visitors(runs)  # each visitor's page first, drawn in its browser, then the next of ours
            try:
                how = visit(url, page)
            except Exception as exc:  # a page that fails is the page's to report to its visitors; go on
                how = repr(exc)
            if how != "ok":
                print(f"posviz: warm-up: page /{page} did not finish: {how}", flush=True)
        print(f"posviz: warm-up: every page's default view computed in {time.perf_counter() - start:.1f} s "
              f"({len(results)} results, {results.bytes / 2**20:.0f} MiB stored)", flush=True)
        from posviz.slide_font import slide_font, slide_font_source

        # the slide PNG's type, cut once a machine (about 8 s), before a speaker asks for a first slide
        print(f"posviz: warm-up: slide font {slide_font()} ({slide_font_source()})", flush=True)
        try:
            if folders and documents:
                extrapolation.warm_default_view(_Keeping(results), queue, folders, prepare_text(documents[0]).as_bytes())
        except Exception as exc:  # a broken checkpoint is the pages' to report; the server goes on
            print(f"posviz: warm-up: the Extrapolation lab's slider stops stopped: {exc!r}", flush=True)
        for page in pages:  # after a talk, a crowd drags each page's main slider to its next stops
            wait_for_visitors(runs)
            try:
                how = visit(url, page, drag=DRAGGED_STOPS)
            except Exception as exc:
                how = repr(exc)
            if how != "ok":
                print(f"posviz: warm-up: dragging /{page}'s main widget did not finish: {how}", flush=True)
        files = results.files
        kept = ("" if files is None else f"; result files: {files.reads} read, {files.writes} written in {files.folder}"
                + "".join(f"; {name} kept in memory only ({why})" for name, why in files.unstorable.items()))
        print(f"posviz: warm-up done in {time.perf_counter() - start:.1f} s ({len(results)} results, "
              f"{results.bytes / 2**20:.0f} MiB stored{kept})", flush=True)

    thread = threading.Thread(target=warm, name="posviz-warm", daemon=True)
    thread.start()
    return thread


class _Keeping:
    """The shared store as the warm-up's own computations use it: what they compute or find is also
    written to the result files, like everything the warm-up's session asks for (``keep``)."""

    def __init__(self, results):
        self._results = results

    def get_or_compute(self, key, compute, *args, **kwargs):
        return self._results.get_or_compute(key, compute, *args, keep=True, **kwargs)

    def __getattr__(self, name):
        return getattr(self._results, name)


def _warming() -> bool:
    """True in the server's own warm-up session, whose computations wait behind every visitor's."""
    from views._warm import WARM_HEADER

    return st.context.headers.get(WARM_HEADER) == "1"


def stored_result(name: str, key: tuple):
    """(found, value) from the store ``compute_once`` uses, for results a page computes itself
    (e.g. streamed to the page as they are produced) and keeps with ``store_result``."""
    return shared_results().get((name, key))


def store_result(name: str, key: tuple, value) -> None:
    shared_results().put((name, key), value, keep=_warming())


def shared(name: str, key: tuple, build):
    """``build()`` once per server for ``key`` (no queue, no progress bar): for what a page derives
    from live results to show them (chart specs, coloured text), which every visitor of the same
    result would otherwise rebuild on every run."""
    return shared_results().get_or_compute((name, key), build, keep=_warming())


def _queue_turn(label: str, slot):
    """This session's turn in the server's work queue, its place in line shown in ``slot`` meanwhile
    (the warm-up's own session waits behind every visitor's)."""
    def in_line(ahead: int) -> None:
        slot.progress(0.0, text=f"{label} Waiting in line: {ahead} computation{'' if ahead == 1 else 's'} for "
                                "other visitors ahead of this one (this server runs one at a time so that each "
                                "finishes sooner).")
    return work_queue().turn(in_line, background=_warming())


@contextmanager
def heavy_turn(label: str, slot=None):
    """Hold the server's work queue for a heavy computation the page runs itself (not through
    ``compute_once``), showing this visitor's place in line in ``slot`` (or a new one) meanwhile."""
    own = slot is None
    slot = st.empty() if own else slot
    try:
        with _queue_turn(label, slot):
            if own:
                slot.empty()
            yield
    finally:
        if own:
            slot.empty()


def compute_once(name: str, key: tuple, compute, label: str):
    """``compute(progress)`` once per ``key`` for the whole server, in the work queue, with a progress bar.

    Every session gets the same stored result (``posviz.serving.SharedResults``): a key that another
    session is computing right now is waited for, not computed twice. While the computation waits
    for its turn in the server's queue, the bar says how many are ahead. ``progress`` takes the
    fraction done (0..1). Exceptions are not stored: bad input is re-checked on every run.
    """
    results, keep = shared_results(), _warming()  # what the warm-up computes or finds is kept on disk too
    found, value = results.get((name, key))
    if found:
        if keep:
            results.keep((name, key), value)
        return value
    slot = st.empty()

    def run():
        with _queue_turn(label, slot):
            slot.progress(0.0, text=label)
            return compute(lambda f: slot.progress(min(max(float(f), 0.0), 1.0), text=label))

    try:
        return results.get_or_compute((name, key), run, lambda: slot.progress(
            0.0, text=f"{label} Another visitor asked for the same just now: waiting for that result."), keep=keep)
    finally:
        slot.empty()
