"""Training a visitor's formula on the server (the Workshop page): one run at a time, the rest queued.

A ``Trainer`` is one per server process: it keeps a queue of ``Job`` s and a worker thread that runs them in order
with the quick recipe (``posviz.training.quick.QUICK_RECIPE``), reporting each step to the job, stopping when the
job is cancelled, and ending early at ``WORKSHOP_MAX_TRAIN_SECONDS``. A finished job's checkpoint lies in its
session's ``SessionFolder``, removed when the session's state is collected or the server exits: a visitor's formula
and checkpoint never outlive the session unless downloaded. No Streamlit here.
"""
from __future__ import annotations

import atexit
import dataclasses
import io
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
import zipfile
from pathlib import Path

from posviz.errors import PosvizError
from posviz.limits import WORKSHOP_MAX_TRAIN_SECONDS, WORKSHOP_QUEUE, WORKSHOP_TRAININGS_AT_ONCE
from posviz.models.checkpoint_files import CONFIG, METRICS, WEIGHTS, read_config, write_metrics

# A deployer on a slow host (and the tests) may shorten the page's runs: recipe fields as JSON, e.g.
# {"tokens": 8192, "eval_bytes": 4096}, laid over the quick recipe (unknown keys are an error).
RECIPE_ENV = "POSVIZ_WORKSHOP_RECIPE"
_ROOT = Path(tempfile.gettempdir()) / f"posviz-workshop-{os.getpid()}"
atexit.register(shutil.rmtree, _ROOT, True)


class SessionFolder:
    """A folder for one session's checkpoints, removed with the object (the session's state) or at exit."""

    def __init__(self):
        _ROOT.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(dir=_ROOT, prefix="session-"))
        weakref.finalize(self, shutil.rmtree, str(self.path), True)


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


@dataclasses.dataclass(eq=False)
class Job:
    label: str  # what the labs list it as, after "yours: "
    options: dict  # the formula method's options
    folder: Path  # where its checkpoint is written
    status: str = "queued"  # queued, running, done, cancelled, failed
    step: int = 0
    steps: int = 0
    seconds: float = 0.0
    message: str = ""  # why it failed, or how it ended early
    scores: dict = dataclasses.field(default_factory=dict)  # {multiple: bits per byte} once done
    cancel_requested: bool = False

    @property
    def finished(self) -> bool:
        return self.status in ("done", "cancelled", "failed")


class Trainer:
    """The server's training queue: ``submit`` a job, read its ``place`` and progress, ``cancel`` it."""

    def __init__(self, queue_size: int = WORKSHOP_QUEUE, max_seconds: float = WORKSHOP_MAX_TRAIN_SECONDS):
        self.queue_size, self.max_seconds = queue_size, max_seconds
        self._lock = threading.Condition()
        self._waiting: list[Job] = []
        self._running: list[Job] = []
        self._workers = [threading.Thread(target=self._work, daemon=True, name=f"workshop-trainer-{n}")
                         for n in range(WORKSHOP_TRAININGS_AT_ONCE)]
        for worker in self._workers:
            worker.start()

    def submit(self, label: str, options: dict, folder: Path) -> Job:
        """Queue a run; refused with words when the queue is full."""
        from posviz.positions import ModelShape, build_position_method

        cfg = page_recipe(options).model_config()  # a bad formula or option: said now, not when its turn comes
        build_position_method(cfg.position, ModelShape(cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd,
                                                       cfg.train_length), cfg.position_options)
        with self._lock:
            if len(self._waiting) >= self.queue_size:
                raise PosvizError(f"{len(self._waiting)} trainings are already waiting on this server (the most it "
                                  "queues); try again in a few minutes.")
            job = Job(label, options, Path(folder))
            self._waiting.append(job)
            self._lock.notify_all()
        return job

    def place(self, job: Job) -> int:
        """0 while it runs (or has ended); k when k runs are ahead of it."""
        with self._lock:
            if job in self._waiting:
                return len(self._running) + self._waiting.index(job)
            return 0

    def cancel(self, job: Job) -> None:
        with self._lock:
            job.cancel_requested = True
            if job in self._waiting:
                self._waiting.remove(job)
                job.status, job.message = "cancelled", "cancelled before it started"

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
            try:
                self._run(job)
            finally:
                with self._lock:
                    self._running.remove(job)
                    self._lock.notify_all()

    def _run(self, job: Job) -> None:
        from posviz.training.quick import quick_eval
        from posviz.training.train import TrainingCancelled, train

        cfg = page_recipe(job.options)
        job.steps = cfg.steps

        def on_step(done: int, steps: int, seconds: float) -> bool:
            job.step, job.seconds = done, seconds
            return job.cancel_requested

        try:
            metrics = train(cfg, job.folder, progress=False, on_step=on_step, max_seconds=self.max_seconds,
                            state_dir=job.folder / "state")
            shutil.rmtree(job.folder / "state", ignore_errors=True)
            config = read_config(job.folder)
            config["workshop"] = {"label": job.label}  # what the labs list it as: "yours: <label>"
            (job.folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
            metrics["eval"] = quick_eval(job.folder, cfg)
            write_metrics(job.folder, metrics)
            job.scores = {float(m): v for m, v in zip(metrics["eval"]["lengths_x_train"].values(),
                                                      metrics["eval"]["nonoverlapping_bpb"].values())}
            job.message = metrics.get("stopped_early", "")
            job.status = "done"
        except TrainingCancelled as exc:
            job.status, job.message = "cancelled", str(exc)
            shutil.rmtree(job.folder, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001: a visitor's run must never take the worker down
            job.status, job.message = "failed", str(exc) if isinstance(exc, PosvizError) else f"{type(exc).__name__}: {exc}"
            shutil.rmtree(job.folder, ignore_errors=True)


def checkpoint_zip(folder: str | Path) -> bytes:
    """The checkpoint's three files as one zip to download (safetensors, config.json, metrics.json)."""
    folder, buffer = Path(folder), io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in (WEIGHTS, CONFIG, METRICS):
            archive.write(folder / name, f"{folder.name}/{name}")
    return buffer.getvalue()
