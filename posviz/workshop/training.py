"""Training a visitor's formula on the server (the Workshop page): one run at a time, the rest queued, and one run
for everyone who asks for the same one.

A ``Trainer`` is one per server process: it keeps a queue of ``Job`` s and a worker thread that runs them in order
with the quick recipe (``posviz.training.quick.QUICK_RECIPE``), reporting each step to the job, stopping when every
visitor who asked for it has cancelled it, and ending early at ``WORKSHOP_MAX_TRAIN_SECONDS``.

A run is keyed on what determines its result (``run_key``: the formula as parsed, its parameters' initial values and
floors, the whole recipe; the code's version, torch's and the device's are the store's edition). A second visitor who
presses Train on the same key joins the queued or running job, or gets its finished checkpoint at once from the
``RunStore``: one folder per key (safetensors, config.json, metrics.json, run.json; never pickle), beside the labs'
result files, at most ``WORKSHOP_STORED_RUNS`` of them. The six examples are trained into it ahead
(``train_examples``: ``make store`` and the Docker build). No Streamlit here.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import io
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import torch

from posviz.errors import PosvizError
from posviz.limits import (WORKSHOP_MAX_TRAIN_SECONDS, WORKSHOP_QUEUE, WORKSHOP_STORED_RUNS,
                           WORKSHOP_TRAININGS_AT_ONCE)
from posviz.models.checkpoint_files import CONFIG, METRICS, WEIGHTS, read_config, write_metrics

# A deployer on a slow host (and the tests) may shorten the page's runs: recipe fields as JSON, e.g.
# {"tokens": 8192, "eval_bytes": 4096}, laid over the quick recipe (unknown keys are an error).
RECIPE_ENV = "POSVIZ_WORKSHOP_RECIPE"
RUN = "run.json"  # a stored run's label, formula, scores and how it ended: what a joining visitor is shown
TYPICAL_RUN_SECONDS = 180.0  # a quick run on 2 cores (docs/workshop.md), until this server has timed its own


def page_recipe(position_options: dict):
    """The recipe of a run the page starts: the quick recipe, with ``$POSVIZ_WORKSHOP_RECIPE`` laid over it."""
    from posviz.config import strict_from_dict
    from posviz.training.quick import QUICK_RECIPE
    from posviz.training.train import TrainConfig

    try:
        changes = json.loads(os.environ.get(RECIPE_ENV) or "{}")
    except json.JSONDecodeError as exc:
        raise PosvizError(f"${RECIPE_ENV} is not JSON ({exc}); e.g. {{\"tokens\": 500000}}") from None
    changes = {k: v for k, v in dict(changes).items() if k not in ("method", "position_options")}
    values = {**QUICK_RECIPE, **changes, "method": "formula", "position_options": position_options}
    return strict_from_dict(TrainConfig, values, f"${RECIPE_ENV}")


def run_key(cfg) -> str:
    """What determines a run's result, as a digest: the recipe (``cfg``, a ``TrainConfig``) with its formula as parsed
    (the syntax tree: spaces, brackets and comments do not matter) and its parameters as the method reads them."""
    from posviz.positions.formula import FormulaOptions
    from posviz.positions.formula_language import parse_formula

    options = FormulaOptions(**cfg.position_options)  # normalised: "1" and 1.0 are one initial value
    recipe = dataclasses.asdict(cfg)
    recipe["position_options"] = {"formula": ast.dump(_Canonical().visit(parse_formula(options.formula).tree)),
                                  "parameters": options.parameters}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:32]


class _Canonical(ast.NodeTransformer):
    """A parsed formula written one way where the walk reads it one way: every number as a float (-1 * d is -1.0 * d)
    and a one-name index as that name (a[h,] is a[h])."""

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        return ast.Constant(float(node.value))

    def visit_Subscript(self, node: ast.Subscript) -> ast.Subscript:
        index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        names = [ast.Name(n.id, ast.Load()) for n in index]
        return ast.Subscript(ast.Name(node.value.id, ast.Load()), names[0] if len(names) == 1 else
                             ast.Tuple(names, ast.Load()), ast.Load())


class RunStore:
    """Finished runs, one folder per ``run_key`` under ``root``: the examples trained ahead, and at most ``max_runs``
    visitors' runs (the least recently used goes first). A run is written into a temporary folder and renamed into place once
    whole, so a reader never sees half of one."""

    def __init__(self, root: str | Path | None = None, max_runs: int = WORKSHOP_STORED_RUNS):
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="posviz-workshop-runs-"))
        self.max_runs = max_runs
        self._lock = threading.Lock()

    def folder(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str, touch: bool = True) -> dict | None:
        """The stored run's record (``RUN``), with its folder, or None; ``touch``: count it as used (a visitor gets
        it), not only looked at (the page's button label, on every rerun)."""
        try:
            record = json.loads((self.folder(key) / RUN).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or not (self.folder(key) / CONFIG).is_file():
            return None
        if touch:
            os.utime(self.folder(key) / RUN)  # used: the last to go
        return {**record, "folder": str(self.folder(key))}

    def labels(self) -> set[str]:
        out = set()
        for run in self.root.glob(f"*/{RUN}") if self.root.is_dir() else ():
            try:
                out.add(json.loads(run.read_text())["label"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def scratch(self, key: str) -> Path:
        """A new folder to train ``key`` into, beside the store (renamed into it by ``put``)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=self.root, prefix=f".{key}-"))

    def put(self, key: str, scratch: Path, record: dict) -> dict:
        (scratch / RUN).write_text(json.dumps(record, indent=2) + "\n")
        with self._lock:
            target = self.folder(key)
            earlier = self.get(key)
            if earlier is not None and earlier.get("complete", True):  # finished twice (two servers, one store)
                shutil.rmtree(scratch, ignore_errors=True)
            else:  # new, or in place of a run the time cap cut short
                shutil.rmtree(target, ignore_errors=True)
                os.replace(scratch, target)
            self._prune()
        return self.get(key) or {**record, "folder": str(target)}

    def _prune(self) -> None:
        runs = []
        for run in self.root.glob(f"*/{RUN}"):
            try:
                keep = bool(json.loads(run.read_text()).get("example"))
                runs.append((run.stat().st_mtime, keep, run.parent))
            except (OSError, ValueError, AttributeError):
                continue
        removable = sorted((mtime, folder) for mtime, keep, folder in runs if not keep)
        for _, folder in removable[:max(0, len(removable) - self.max_runs)]:
            shutil.rmtree(folder, ignore_errors=True)


@dataclasses.dataclass(eq=False)
class Job:
    label: str  # what the labs list it as, after "yours: "
    options: dict  # the formula method's options
    key: str  # run_key of its recipe: visitors who ask for the same key share this job
    recipe: object = None  # the TrainConfig it trains with, fixed when it was asked for
    folder: Path | None = None  # its checkpoint, once done (in the store)
    status: str = "queued"  # queued, running, done, cancelled, failed
    step: int = 0
    steps: int = 0
    seconds: float = 0.0
    message: str = ""  # why it failed, or how it ended early
    scores: dict = dataclasses.field(default_factory=dict)  # {multiple: bits per byte} once done
    example: bool = False  # one of the page's examples: kept in the store for good
    visitors: int = 1  # sessions waiting on it; it is cancelled when the last one cancels
    cancel_requested: bool = False
    deterministic: bool = False  # failed for a reason the same run would meet again (told at once to the next visitor)
    queued_at: float = dataclasses.field(default_factory=time.monotonic)
    ended_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("done", "cancelled", "failed")

    def record(self) -> dict:
        # complete: not cut short by the time cap, which a busy server's speed decides, not the run: the next visitor
        # of the key trains it again, and the whole run takes this one's place
        return {"label": self.label, "formula": self.options["formula"], "scores": {f"{m:g}": v for m, v in self.scores.items()},
                "message": self.message, "example": self.example, "seconds": round(self.seconds, 1),
                "complete": not self.message}

    @classmethod
    def from_store(cls, key: str, record: dict) -> "Job":
        return cls(record["label"], {"formula": record["formula"]}, key, folder=Path(record["folder"]), status="done",
                   message=record.get("message", ""), scores={float(m): v for m, v in record["scores"].items()},
                   example=bool(record.get("example")), seconds=float(record.get("seconds", 0.0)), ended_at=time.monotonic())


class Trainer:
    """The server's training queue: ``submit`` a run (or join the same one), read its ``place`` and progress,
    ``cancel`` it."""

    FAILED_KEPT = 64  # failed runs remembered by key: the same formula fails the same way, said at once

    def __init__(self, store: RunStore | None = None, queue_size: int = WORKSHOP_QUEUE,
                 max_seconds: float = WORKSHOP_MAX_TRAIN_SECONDS):
        self.store = store or RunStore()
        self.queue_size, self.max_seconds = queue_size, max_seconds
        self._lock = threading.Condition()
        self._waiting: list[Job] = []
        self._running: list[Job] = []
        self._failed: dict[str, Job] = {}
        self._durations: list[float] = []  # seconds of this server's finished runs: how long the next will take
        self.runs_started = 0
        self._workers = [threading.Thread(target=self._work, daemon=True, name=f"workshop-trainer-{n}")
                         for n in range(WORKSHOP_TRAININGS_AT_ONCE)]
        for worker in self._workers:
            worker.start()

    def submit(self, label: str, options: dict, example: bool = False) -> Job:
        """The job for this run: the stored result when it has been trained, the queued or running job when another
        visitor asked for it, else a new one at the back of the queue. Refused with words when the formula breaks at
        a length the run is scored at, or when the queue is full (saying when to come back)."""
        cfg = page_recipe(options)
        key = run_key(cfg)
        with self._lock:
            joined = self._join(key) or self._failed.get(key)
            if joined is not None:
                return joined
        stored = self.store.get(key)
        if stored is not None and stored.get("complete", True):
            return Job.from_store(key, stored)
        check_before_training(options, cfg)  # said now, not when its turn comes or after the whole run
        with self._lock:
            joined = self._join(key)  # asked for while this one was checked
            if joined is not None:
                return joined
            if len(self._waiting) >= self.queue_size:
                minutes = max(1, round(self._seconds_until_free() / 60))
                raise PosvizError(f"{len(self._waiting)} trainings are already waiting on this server (the most it "
                                  f"queues); try again in about {minutes} minute{'s' if minutes != 1 else ''}, when "
                                  "the queue has room.")
            if stored is not None:  # trained again in place of a run the time cap cut short: under its own name
                label, taken = stored["label"], set()
            else:
                taken = self.store.labels() | {j.label for j in self._running + self._waiting}
            job = Job(_unique(label, taken), options, key, cfg, example=example)
            self._waiting.append(job)
            self._lock.notify_all()
        return job

    def _join(self, key: str) -> Job | None:
        """Under the lock: the queued or running job of ``key``, with one more visitor waiting on it, or None."""
        for job in self._running + self._waiting:
            if job.key == key and not job.cancel_requested:
                job.visitors += 1
                return job
        return None

    def _seconds_until_free(self) -> float:
        """About how long until the first place in the queue frees up: what the running runs have left."""
        typical = statistics.median(self._durations[-9:]) if self._durations else TYPICAL_RUN_SECONDS
        left = [max(0.0, typical * (1 - job.step / job.steps)) if job.steps else typical for job in self._running]
        return min(left, default=typical)

    def place(self, job: Job) -> int:
        """0 while it runs (or has ended); k when k runs are ahead of it."""
        with self._lock:
            if job in self._waiting:
                return len(self._running) + self._waiting.index(job)
            return 0

    def cancel(self, job: Job) -> None:
        """This visitor no longer waits for ``job``: it stops (or leaves the queue) when no other visitor does."""
        with self._lock:
            if job.finished:
                return
            job.visitors -= 1
            if job.visitors > 0:
                return
            job.cancel_requested = True
            if job in self._waiting:
                self._waiting.remove(job)
                job.status, job.message = "cancelled", "cancelled before it started"
                self._lock.notify_all()

    def wait(self, job: Job, timeout: float) -> bool:
        """Block until ``job`` has finished or ``timeout`` seconds passed; whether it finished."""
        end = time.monotonic() + timeout
        with self._lock:
            while not job.finished and time.monotonic() < end:
                self._lock.wait(min(0.2, max(0.0, end - time.monotonic())))
            return job.finished

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._waiting:
                    self._lock.wait()
                job = self._waiting.pop(0)
                self._running.append(job)
                job.status = "running"
                self.runs_started += 1
            try:
                self._run(job)
            finally:
                with self._lock:
                    job.ended_at = time.monotonic()
                    self._running.remove(job)
                    if job.status == "failed" and job.deterministic:  # the same run would fail the same way
                        self._failed[job.key] = job
                        while len(self._failed) > self.FAILED_KEPT:
                            self._failed.pop(next(iter(self._failed)))
                    self._lock.notify_all()

    def _run(self, job: Job) -> None:
        from posviz.training.quick import quick_eval
        from posviz.training.train import TrainingCancelled, train

        cfg = job.recipe
        job.steps = cfg.steps
        scratch = self.store.scratch(job.key)

        def on_step(done: int, steps: int, seconds: float) -> bool:
            job.step, job.seconds = done, seconds
            return job.cancel_requested

        try:
            metrics = train(cfg, scratch, progress=False, on_step=on_step, max_seconds=self.max_seconds,
                            state_dir=scratch / "state")
            shutil.rmtree(scratch / "state", ignore_errors=True)
            config = read_config(scratch)
            config["workshop"] = {"label": job.label}  # what the labs list it as: "yours: <label>"
            (scratch / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
            metrics["eval"] = quick_eval(scratch, cfg)
            write_metrics(scratch, metrics)
            job.scores = {float(m): v for m, v in zip(metrics["eval"]["lengths_x_train"].values(),
                                                      metrics["eval"]["nonoverlapping_bpb"].values())}
            job.message = metrics.get("stopped_early", "")
            job.seconds = float(metrics.get("trained_on", {}).get("seconds", job.seconds))
            job.folder = Path(self.store.put(job.key, scratch, job.record())["folder"])
            self._durations.append(job.seconds)
            job.status = "done"
        except TrainingCancelled as exc:
            job.status, job.message = "cancelled", str(exc)
            shutil.rmtree(scratch, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001: a visitor's run must never take the worker down
            job.status, job.message = "failed", str(exc) if isinstance(exc, PosvizError) else f"{type(exc).__name__}: {exc}"
            job.deterministic = isinstance(exc, PosvizError)  # a refusal in words; not a full disk, which may pass
            shutil.rmtree(scratch, ignore_errors=True)


def _unique(label: str, taken: set[str]) -> str:
    """``label``, or ``label (2)``, ``(3)``...: two runs the labs list must not share a name."""
    out, k = label, 2
    while out in taken:
        out, k = f"{label} ({k})", k + 1
    return out


_CHECKED: dict[str, str | None] = {}  # run_key -> None (fine) or the refusal: one check per formula and recipe
_CHECKED_LOCK = threading.Lock()
# A check of a formula of i and j at 4,096 positions takes up to a few seconds of one core (BENCHMARKS.md): one at a
# time, as the server's heavy work is (HEAVY_SLOTS), so many visitors' checks queue instead of slowing every session.
_CHECKING = threading.Lock()
CHECKS_KEPT = 256


def check_before_training(options: dict, cfg=None) -> None:
    """Refuse, with words, options a run cannot train or score: a bad formula or option, or one that is no bias at
    some length up to the longest the run is scored at (``check_scored_lengths``). Remembered by run key, so the page's
    reruns and a crowd's submits of one formula check it once."""
    from posviz.training.quick import check_scored_lengths
    from posviz.training.train import initial_model

    cfg = cfg or page_recipe(options)
    key = run_key(cfg)
    with _CHECKED_LOCK:
        known = _CHECKED.get(key, "")
    if known == "":
        with _CHECKING:  # one check at a time on the server: twenty tabs typing formulas wait, not thrash the cores
            with _CHECKED_LOCK:
                known = _CHECKED.get(key, "")  # another visitor's check of the same run may have just finished
            if known == "":
                try:
                    with torch.random.fork_rng():  # the run's own initial values (a range's draw), not another draw
                        check_scored_lengths(initial_model(cfg).position, cfg)
                    known = None
                except PosvizError as exc:
                    known = str(exc)
                with _CHECKED_LOCK:
                    _CHECKED[key] = known
                    while len(_CHECKED) > CHECKS_KEPT:
                        _CHECKED.pop(next(iter(_CHECKED)))
    if known is not None:
        raise PosvizError(known)


def train_examples(store: RunStore, examples: dict, progress: bool = True) -> list[Job]:
    """Train each of ``examples`` ({name: Example}) into ``store`` ahead of any visitor (``make store``, the Docker
    build): a visitor who presses Train on one gets its result at once. Those already stored are not trained again."""
    trainer = Trainer(store, queue_size=len(examples) + 1)
    jobs = [trainer.submit(name, {"formula": e.formula, "parameters": e.parameters}, example=True)
            for name, e in examples.items()]
    for job in jobs:
        while not trainer.wait(job, 5.0):
            if progress:
                print(f"workshop example {job.label}: step {job.step:,} of {job.steps:,}", flush=True)
        if progress:
            print(f"workshop example {job.label}: {job.status} {job.message}".rstrip(), flush=True)
    return jobs


def checkpoint_zip(folder: str | Path) -> bytes:
    """The checkpoint's three files as one zip to download (safetensors, config.json, metrics.json)."""
    folder, buffer = Path(folder), io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in (WEIGHTS, CONFIG, METRICS):
            archive.write(folder / name, f"{folder.name}/{name}")
    return buffer.getvalue()
