"""Train a whole set with one recipe, a few runs at a time, with one progress line and an ETA.

``python -m posviz_tools.train_all [--methods rope alibi] [--jobs 2] [--out-dir models] [--set KEY=VALUE ...]``

Each method is a separate ``python -m posviz.train --resume`` process (one thread each by default:
at this model size two one-thread runs train twice as many bytes per second as one two-thread run),
so a stopped set continues where every run left off, and a run that fails does not stop the others.
A method whose checkpoint in ``--out-dir`` was already trained with this very recipe is skipped, so
rerunning the command after a stop (even in another session) only does what is left.

Progress comes from the state every run saves (``runs/<name>.state/state.json``): steps done of the
set's total, bytes per second over the last minutes, and the time left at that speed, where the runs
still to start are counted at the speed of those that ran.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from posviz.config import strict_from_dict
from posviz.errors import PosvizError
from posviz.positions import method_names
from posviz.training.command_line import parse_pairs
from posviz.training.train import STATE_JSON, TrainConfig, as_recorded, recipe_differences, state_dir_for


@dataclasses.dataclass
class Run:
    method: str
    recipe: TrainConfig
    out: Path
    process: subprocess.Popen | None = None
    finished: bool = False
    failed: int | None = None  # exit status of a failed run

    @property
    def state(self) -> Path:
        return state_dir_for(self.out)

    log: Path | None = None  # the run's output, whose progress bar says its step between saved states

    def steps_done(self) -> int:
        if self.finished:
            return self.recipe.steps
        saved = 0
        try:
            info = json.loads((self.state / STATE_JSON).read_text())
            saved = 0 if recipe_differences(info.get("recipe", {}), self.recipe) else int(info.get("step", 0))
        except (OSError, ValueError):
            pass
        return max(saved, self._bar_step()) if self.process is not None else saved

    def _bar_step(self) -> int:
        """The step the running process's progress bar last printed ("| 812/3906 ["), 0 if none yet."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                tail = f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return 0
        found = re.findall(rf"\| *(\d+)/{self.recipe.steps} \[", tail)
        return int(found[-1]) if found else 0


def already_trained(out: Path, recipe: TrainConfig) -> bool:
    """Whether ``out`` holds a finished checkpoint of exactly this recipe (its config.json says so)."""
    try:
        config = json.loads((out / "config.json").read_text())
        metrics = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        return False
    return as_recorded(config.get("train") or {}) == dataclasses.asdict(recipe) and "val_bpb_at_train_length" in metrics


def format_duration(seconds: float) -> str:
    minutes = int(round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def progress_line(runs: list[Run], bytes_per_second: float | None) -> str:
    total = sum(r.recipe.steps for r in runs)
    done = sum(r.steps_done() for r in runs)
    left_bytes = sum((r.recipe.steps - r.steps_done()) * r.recipe.batch_size * r.recipe.train_length for r in runs)
    trained = sum(r.finished for r in runs)
    running = ", ".join(r.method for r in runs if r.process is not None and r.process.poll() is None) or "none"
    line = f"[{time.strftime('%H:%M:%S')}] {trained}/{len(runs)} trained · step {done:,} of {total:,} ({100 * done / max(1, total):.1f} %) · running: {running}"
    if bytes_per_second:
        line += f" · {bytes_per_second:,.0f} bytes/s · about {format_duration(left_bytes / bytes_per_second)} left"
    return line


def train_all(methods: list[str], overrides: dict, out_dir: Path, jobs: int, threads: int,
              log_dir: Path, every: float = 60.0, python: str = sys.executable) -> int:
    """Train every method in ``methods``; returns the number of runs that failed."""
    runs = []
    for method in methods:
        recipe = strict_from_dict(TrainConfig, {**overrides, "method": method}, "training recipe")
        run = Run(method, recipe, out_dir / method)
        run.finished = already_trained(run.out, recipe)
        runs.append(run)
    skipped = [r.method for r in runs if r.finished]
    if skipped:
        print(f"already trained with this recipe, skipped: {', '.join(skipped)}", flush=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    settings = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in overrides.items()]
    queue = [r for r in runs if not r.finished]

    def bytes_done() -> int:
        return sum(r.steps_done() * r.recipe.batch_size * r.recipe.train_length for r in runs)

    main_thread = threading.current_thread() is threading.main_thread()  # only it may set a signal handler
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None  # `kill` runs the finally
    try:
        return _supervise(runs, queue, jobs, every, python, settings, env, log_dir, bytes_done)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        for run in runs:  # a stopped set stops its runs too (each keeps its last saved state)
            if run.process is not None and run.process.poll() is None:
                run.process.terminate()
                run.process.wait()


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


class Speed:
    """Bytes per second of the set over the last ``window`` seconds, from (time, bytes done) samples.

    A gap between two samples far longer than the polling interval means the supervisor itself was
    stopped (a paused job, a debugger): the runs were stopped too, so the samples before the gap say
    nothing about the speed now, and keeping them would show an ETA of hundreds of hours.
    """

    def __init__(self, window: float = 600.0, gap: float = 60.0):
        self.window, self.gap = window, gap
        self.samples: list[tuple[float, int]] = []

    def add(self, now: float, done: int) -> None:
        if self.samples and now - self.samples[-1][0] > self.gap:
            self.samples.clear()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.pop(0)

    def rate(self) -> float | None:
        """None until 30 s of samples with progress in them."""
        if not self.samples:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 - t0 >= 30 and b1 > b0 else None


def _supervise(runs, queue, jobs, every, python, settings, env, log_dir, bytes_done) -> int:
    speed = Speed()  # bytes done by the set over the last minutes
    last_print = 0.0
    while True:
        for run in runs:
            if run.process is not None and run.process.poll() is not None:
                code, run.process = run.process.returncode, None
                if code == 0:
                    run.finished = True
                    print(f"trained {run.method} -> {run.out}", flush=True)
                else:
                    run.failed = code
                    print(f"FAILED {run.method} (exit {code}); see {log_dir / f'train-{run.method}.log'}", flush=True)
        active = [r for r in runs if r.process is not None]
        while queue and len(active) < jobs:
            run = queue.pop(0)
            command = [python, "-m", "posviz.train", "--method", run.method, "--out", str(run.out), "--resume"]
            if settings:
                command += ["--set", *settings]
            run.log = log_dir / f"train-{run.method}.log"
            log = open(run.log, "w")
            run.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            log.close()
            active.append(run)
        now = time.monotonic()
        speed.add(now, bytes_done())
        if not active and not queue:
            break
        if now - last_print >= every:
            print(progress_line(runs, speed.rate()), flush=True)
            last_print = now
        time.sleep(min(5.0, every))
    print(progress_line(runs, None), flush=True)
    return sum(r.failed is not None for r in runs)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="*", default=None, help="position methods (default: every registered one)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", 2)), help="runs at a time (default 2)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("CPU_THREADS", 1)), help="threads per run (default 1)")
    ap.add_argument("--out-dir", default="models", help="where the checkpoints go (default models/)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="recipe overrides, as for posviz.training.train")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between progress lines")
    args = ap.parse_args(argv)
    methods = args.methods or method_names()
    try:
        failed = train_all(methods, parse_pairs(args.set), Path(args.out_dir), max(1, args.jobs), max(1, args.threads),
                           Path("runs"), every=args.every)
    except PosvizError as exc:
        raise SystemExit(f"error: {exc}") from None
    if failed:
        raise SystemExit(f"{failed} run(s) failed")


if __name__ == "__main__":
    main()
