"""The bench's protocol-session measurements: the server's own cost, with no browser on the same cores.

A protocol session (``views/_warm.ProtocolSession``) speaks Streamlit's WebSocket protocol as a
visitor's browser does and draws nothing, so the server's CPU (``/proc/<pid>/stat``) is the server's:

* ``measure_slider_answer``: one move of the Extrapolation lab's length slider whose results are all
  stored, over its stops from 64 to 3,072;
* ``measure_pages_cpu`` (``python -m posviz_tools.bench --pages-cpu``): the same for every page of
  the app and its main widget (``views/_warm.main_widget``, the one the warm-up and the load test drag).
"""
from __future__ import annotations

import os

SLIDER_ANSWER_GOAL_S = 0.1  # server CPU per slider answer whose results are all stored


def measure_slider_answer(models_dir=None, rounds: int = 3) -> dict | None:
    """The server's CPU for one move of the Extrapolation lab's length slider whose results are all
    stored, as a visitor's browser asks for it (a protocol session, ``views/_warm.ProtocolSession``, so
    no browser draws on the same cores): the slider's stops from 64 to 3,072 are each computed once, then
    visited ``rounds`` times more; {cpu_s, wall_s, messages, bytes} per answer (means), or None when the
    server could not be measured."""
    from views._warm import ProtocolSession

    from .loadtest import StreamlitServer, stream_url
    from .process_meter import cpu_seconds

    label = "Evaluation length (bytes)"
    env = {**os.environ, "POSVIZ_WARM": "0"}  # the answers alone on the server
    with StreamlitServer(models=models_dir, env=env, torch_threads=None) as server:
        with ProtocolSession(stream_url(server), "extrapolation") as session:
            session.open()
            slider = session.widgets[label]
            stops = slider.options[8:-1]
            for stop in stops:  # each computed once: from here on every answer is stored
                session.move(label, stop)
            cpu0, answers = cpu_seconds(server.process.pid), []
            for _ in range(rounds):
                answers += [session.move(label, stop) for stop in stops]
            cpu = cpu_seconds(server.process.pid) - cpu0
    if not all(a.ok for a in answers):
        return None
    n = len(answers)
    out = {"cpu_s": cpu / n, "wall_s": sum(a.seconds for a in answers) / n,
           "messages": sum(a.messages for a in answers) / n, "bytes": sum(a.bytes for a in answers) / n}
    print(f"  stored slider answer: server CPU {out['cpu_s']:.3f} s, {out['messages']:.0f} messages, "
          f"{out['bytes'] / 1e3:.0f} kB", flush=True)
    return out


PAGE_ANSWER_GOAL_S = 0.1  # server CPU per answer whose results are all stored, on every page


def measure_pages_cpu(models_dir=None, rounds: int = 4, timeout_s: float = 300.0) -> dict:
    """Server CPU seconds per stored answer on every page of the app (``loadtest.app_pages``).

    One server with no warm-up (``POSVIZ_WARM=0``: nothing else runs on it while it is measured). Per
    page, a protocol session opens the page and waits until its default view is computed, moves its
    main widget once to the next stop (computing that answer) and back (stored), then moves it back and
    forth ``rounds`` times between the two: every one of those ``2 * rounds`` answers is a stored one,
    and the server's CPU over them, divided by their number, is the page's cost of a stored answer.
    {url_path: {"widget", "stops", "cpu_s", "wall_s", "messages", "bytes", "answers", "problem"}}."""
    from views._warm import ProtocolSession, main_widget, next_stops

    from .loadtest import StreamlitServer, app_pages, stream_url
    from .process_meter import cpu_seconds

    out = {}
    env = {**os.environ, "POSVIZ_WARM": "0"}  # the answers alone on the server
    with StreamlitServer(models=models_dir, env=env, torch_threads=None) as server:
        for entry in app_pages():
            page = "" if entry.default else entry.url_path
            row = {"widget": None, "stops": [], "cpu_s": float("nan"), "wall_s": float("nan"), "messages": 0,
                   "bytes": 0, "answers": 0, "problem": None}
            out[entry.url_path] = row
            try:
                with ProtocolSession(stream_url(server), page, timeout_s=timeout_s) as session:
                    first = session.open()
                    widget = main_widget(session) if first.ok else None
                    if widget is None:
                        row["problem"] = (f"the default view: {first.status} {first.exceptions[:1]}" if not first.ok
                                          else "no widget to move")
                        continue
                    stops = next_stops(widget, 2)
                    row["widget"], row["stops"] = widget.label, stops
                    for value in (stops[1], stops[0]):  # each computed once, if it was not yet
                        session.move(widget.label, value)
                    cpu0, answers = cpu_seconds(server.process.pid), []
                    for _ in range(rounds):
                        answers += [session.move(widget.label, value) for value in (stops[1], stops[0])]
                    cpu = cpu_seconds(server.process.pid) - cpu0
            except Exception as exc:  # a page that cannot be measured says why; the others go on
                row["problem"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            bad = [a for a in answers if not a.ok]
            n = len(answers)
            row.update(cpu_s=cpu / n, wall_s=sum(a.seconds for a in answers) / n, answers=n,
                       messages=sum(a.messages for a in answers) / n, bytes=sum(a.bytes for a in answers) / n,
                       problem=f"{len(bad)} answers not ok: {bad[0].status} {bad[0].exceptions[:1]}" if bad else None)
            print(f"  stored answer {entry.url_path:>18} ({widget.label} {stops[1]!r} <-> {stops[0]!r}): server CPU "
                  f"{row['cpu_s']:.3f} s, wall {row['wall_s']:.2f} s, {row['messages']:.0f} messages, "
                  f"{row['bytes'] / 1e3:.0f} kB" + (f"  PROBLEM: {row['problem']}" if row["problem"] else ""), flush=True)
    return out
