"""A hall of visitors on the Workshop (issue #55): twenty sessions open the page at once, each by a link to one of
three formulas picked at random, and press Train together; then one more visitor, with a formula no one else typed.

    python -m posviz_tools.workshop_crowd [--sessions 20] [--seed 0] [--recipe '{"tokens": 81920, ...}'] [--write]

Each visitor speaks Streamlit's own WebSocket protocol (``views._warm.ProtocolSession``, the load driver's sessions:
they draw nothing, so the server is measured, not a browser) and polls its progress once a second, as the page's
fragment does in a browser. The server runs the README's command on a fresh store, without its warm-up, with a short
recipe laid over the quick one (``$POSVIZ_WORKSHOP_RECIPE``). Printed: the trainings the server ran (one per
distinct formula, if runs are shared), and for each visitor the answers it got, the seconds from its press to its
result, and any error it saw. ``--write`` puts the report in BENCHMARKS.md between its markers.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from posviz_tools.loadtest import StreamlitServer
from views._warm import ProtocolSession, server_stream_url

FORMULAS = {  # what the crowd after a talk types: two of the page's examples, and one formula of their own
    "ALiBi (example)": "-(2**(-8*(h+1)/H))*d",
    "Hard cut at 64 (example)": "where(d < 64, 0, -inf)",
    "typed": "-0.3 * log(1 + d)",
}
LATE = "-0.02 * d - 0.5 * (d > 32)"  # a formula no one else typed, behind the crowd
# Twenty steps of the shipped shape, scored on 4 KiB: a run of seconds, so the crowd measures the queue and the
# sharing, not the recipe.
SHORT_RECIPE = {"tokens": 20 * 16 * 256, "eval_bytes": 4096}
POLL_S = 1.0  # the page's progress fragment runs every second in a browser
RESULT_HEADING = "Yours"  # the page's heading above a finished run


@dataclass
class Visitor:
    name: str
    formula: str
    answers: int = 0
    seconds_to_result: float | None = None
    shared_with: int = 0  # the most other visitors its progress line said were waiting on the same run
    errors: list[str] = field(default_factory=list)


def visit(url: str, visitor: Visitor, ready: threading.Barrier | None, timeout_s: float) -> None:
    """Open the Workshop at ``visitor.formula``'s link, press Train (with the others, at ``ready``), and poll until
    the result is shown."""
    query = urllib.parse.urlencode({"bias": visitor.formula})
    try:
        with ProtocolSession(url, "workshop", query_string=query, timeout_s=timeout_s) as session:
            opened = session.open()
            visitor.answers += 1
            _note(visitor, opened)
            if ready is not None:
                ready.wait(timeout=timeout_s)
            start = time.perf_counter()
            label = next((lab for lab in session.widgets if lab.startswith(("Train", "Show its run"))), None)
            if label is None:
                visitor.errors.append(f"no Train button; alerts: {opened.alerts}")
                return
            answer = session.press(label)
            while True:
                visitor.answers += 1
                _note(visitor, answer)
                if RESULT_HEADING in answer.texts:
                    visitor.seconds_to_result = time.perf_counter() - start
                    return
                if visitor.errors or time.perf_counter() - start > timeout_s:
                    visitor.errors = visitor.errors or [f"no result within {timeout_s:.0f} s"]
                    return
                time.sleep(POLL_S)
                progress = session.widgets.get("Cancel")  # in the progress fragment: rerun it alone, as a browser
                answer = session.rerun(progress.fragment_id if progress is not None and answer.status == "ok" else "")
    except Exception as exc:  # a visitor that cannot even talk to the server is an error to report, not a crash
        visitor.errors.append(f"{type(exc).__name__}: {exc}")


def _note(visitor: Visitor, answer) -> None:
    visitor.errors += answer.exceptions + answer.alerts
    if answer.status not in ("ok", "FINISHED_EARLY_FOR_RERUN"):
        visitor.errors.append(f"run ended {answer.status}")
    for text in answer.texts:
        if "other visitor" in text:
            visitor.shared_with = max(visitor.shared_with, int(text.split("(")[-1].split()[0]))


def crowd(sessions: int = 20, seed: int = 0, recipe: dict | None = None, timeout_s: float = 600.0) -> dict:
    rng = random.Random(seed)
    names = list(FORMULAS)
    picks = [names[k % len(names)] for k in range(len(names))]  # each formula at least once
    picks += [rng.choice(names) for _ in range(sessions - len(picks))]
    rng.shuffle(picks)
    visitors = [Visitor(f"visitor {k + 1}", FORMULAS[name]) for k, name in enumerate(picks)]
    late = Visitor("late visitor", LATE)
    store = Path(tempfile.mkdtemp(prefix="posviz-crowd-store-"))
    env = {**os.environ, "POSVIZ_STORE": str(store), "POSVIZ_WARM": "0",
           "POSVIZ_WORKSHOP_RECIPE": json.dumps(recipe or SHORT_RECIPE)}
    with StreamlitServer(env=env, torch_threads=None) as server:
        url = server_stream_url("127.0.0.1", server.port, None)
        ready = threading.Barrier(len(visitors))
        threads = [threading.Thread(target=visit, args=(url, v, ready, timeout_s)) for v in visitors]
        for thread in threads:
            thread.start()
        time.sleep(2.0)  # the crowd has pressed Train; the late visitor comes behind it
        visit(url, late, None, timeout_s)
        for thread in threads:
            thread.join()
        runs = sorted(p for p in store.glob("*/workshop-runs/*") if (p / "run.json").is_file())
    trained = [json.loads((run / "run.json").read_text()) for run in runs]
    return {"visitors": visitors, "late": late, "picks": picks, "trained": trained}


def report(result: dict) -> str:
    visitors, late = result["visitors"], result["late"]
    by_formula = {}
    for visitor, pick in zip(visitors, result["picks"]):
        by_formula.setdefault(pick, []).append(visitor)
    crowd_runs = [t for t in result["trained"] if t["formula"] in FORMULAS.values()]
    late_runs = [t for t in result["trained"] if t["formula"] == late.formula]
    runs = ", ".join(f"{t['label']} {t['seconds']:.0f} s" for t in crowd_runs)
    lines = [f"Trainings the server ran for the {len(visitors)} visitors: {len(crowd_runs)} ({runs} of training each); "
             f"for the late visitor: {len(late_runs)}. Runs in the store: {len(result['trained'])}.", "",
             "| formula | visitors | answers each (min–max) | seconds to result (min / median / max) | errors |",
             "|---|---:|---:|---:|---:|"]
    for pick, group in sorted(by_formula.items()):
        seconds = [v.seconds_to_result for v in group if v.seconds_to_result is not None]
        answers = [v.answers for v in group]
        timing = (f"{min(seconds):.1f} / {statistics.median(seconds):.1f} / {max(seconds):.1f}" if seconds else "—")
        lines.append(f"| {pick} `{FORMULAS[pick]}` | {len(group)} | {min(answers)}–{max(answers)} | {timing} | "
                     f"{sum(len(v.errors) for v in group)} |")
    late_time = f"{late.seconds_to_result:.1f}" if late.seconds_to_result is not None else "—"
    lines.append(f"| late, typed by no one else `{late.formula}` | 1 | {late.answers} | {late_time} | {len(late.errors)} |")
    errors = [f"{v.name}: {e}" for v in visitors + [late] for e in v.errors]
    lines += ["", "Errors: " + ("; ".join(errors[:10]) if errors else "none")]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe", default=json.dumps(SHORT_RECIPE), help="recipe fields laid over the quick recipe")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--write", action="store_true", help="put the report in BENCHMARKS.md")
    args = parser.parse_args(argv)
    recipe = json.loads(args.recipe)
    result = crowd(args.sessions, args.seed, recipe, args.timeout)
    text = report(result)
    print(text)
    if args.write:
        from posviz_tools.bench_report import write_marked

        head = ["## A hall on the Workshop: twenty visitors press Train at once (protocol sessions, no browser)", "",
                f"`python -m posviz_tools.workshop_crowd --write`: {args.sessions} sessions open `/workshop` by a link to "
                f"one of {len(FORMULAS)} formulas (seed {args.seed}) and press Train together; a new server on an empty "
                f"store, without its warm-up; the recipe `{json.dumps(recipe)}` laid over the quick one; each session "
                f"polls its progress every {POLL_S:g} s, as the page's fragment does. Then one more visitor, 2 s later, "
                "with a formula no one else typed. Seconds from the press to the result on the page.", ""]
        write_marked(Path(__file__).resolve().parent.parent / "BENCHMARKS.md", "workshop-crowd",
                     "\n".join(head) + text)


if __name__ == "__main__":
    main()
