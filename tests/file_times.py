"""How long each test file takes: the table in docs/testing.md, kept to hold the suite to 10 minutes on 2 cores.

Every run of the whole suite (``make test``) writes ``test-output/test-times.json`` (conftest.py): per test file,
the seconds its tests took (setup, call and teardown, summed over the two pytest-xdist workers that share them)
and how many ran, with the session's wall-clock seconds. ``python tests/file_times.py`` writes that run's table
into docs/testing.md between its markers; ``tests/test_file_times.py`` checks the table names every test file.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "test-output" / "test-times.json"
DOC = ROOT / "docs" / "testing.md"
BEGIN, END = "<!-- file-times: begin -->", "<!-- file-times: end -->"


class Recorder:
    """The pytest plugin conftest.py registers: sums each report's duration by file; writes them at the end."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.tests: dict[str, set] = {}
        self.started = time.time()

    def pytest_runtest_logreport(self, report):
        where = report.nodeid.split("::", 1)[0]
        self.seconds[where] = self.seconds.get(where, 0.0) + report.duration
        self.tests.setdefault(where, set()).add(report.nodeid)

    def pytest_sessionfinish(self, session, exitstatus):
        config = session.config
        # the whole suite only (pytest.ini's testpaths, no file or -k named), and once: on the controller
        whole = config.args_source == config.ArgsSource.TESTPATHS and not config.option.keyword
        if not whole or hasattr(config, "workerinput") or not self.seconds:
            return
        TIMES.parent.mkdir(parents=True, exist_ok=True)
        TIMES.write_text(json.dumps({
            "finished": time.strftime("%Y-%m-%d %H:%M"), "wall_s": round(time.time() - self.started, 1),
            "workers": getattr(config.option, "numprocesses", None) or 1,
            "files": {f: {"seconds": round(s, 1), "tests": len(self.tests[f])} for f, s in sorted(self.seconds.items())},
        }, indent=1))


def table(times: dict, not_run: list[str] = ()) -> str:
    """The run's table, slowest first; ``not_run``: test files none of whose tests ran (the `cuda` checks)."""
    files = sorted(times["files"].items(), key=lambda kv: -kv[1]["seconds"])
    total = sum(f["seconds"] for _, f in files)
    lines = [f"`make test` finished {times['finished']}: {times['wall_s'] / 60:.1f} min of wall clock with "
             f"{times['workers']} pytest-xdist worker(s); {total / 60:.1f} min of test time in all "
             f"({sum(f['tests'] for _, f in files):,} tests). Per file, slowest first:", "",
             "| file | tests | seconds | share |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {f['tests']:,} | {f['seconds']:.1f} | {f['seconds'] / total:.1%} |" for name, f in files]
    lines += [f"| {name} | 0 | not run (`make gpu-check`: the `cuda` checks) | |" for name in sorted(not_run)]
    return "\n".join(lines)


def main() -> int:
    if not TIMES.is_file():
        print(f"{TIMES} is missing: run the whole suite first (make test)", file=sys.stderr)
        return 1
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    times = json.loads(TIMES.read_text())
    not_run = [f"tests/{p.name}" for p in sorted((ROOT / "tests").glob("test_*.py")) if f"tests/{p.name}" not in times["files"]]
    DOC.write_text(head + BEGIN + "\n" + table(times, not_run) + "\n" + END + tail)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
