"""``python -m posviz_tools.train_all``: a set trained with one recipe, resumable across sessions, with progress."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from posviz.training.train import TrainConfig
from posviz_tools.train_all import Run, already_trained, progress_line, train_all

ROOT = Path(__file__).resolve().parent.parent
TINY = {"n_layer": 1, "n_embd": 32, "train_length": 32, "batch_size": 4, "tokens": 4 * 32 * 30,
        "eval_bytes": 1024, "warmup_steps": 2, "checkpoint_every": 10, "precision": "fp32",
        "repeat_probability": 0.5, "repeat_min_bytes": 4, "repeat_max_bytes": 12}


def test_a_set_trains_reports_progress_skips_what_is_done_and_survives_a_failed_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the runs' states and logs go to ./runs
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    failed = train_all(["nope", "alibi", "no-such-method"], TINY, tmp_path / "set", jobs=2, threads=1,
                       log_dir=tmp_path / "runs", every=0.5)
    out = capsys.readouterr().out
    assert failed == 1 and "FAILED no-such-method" in out
    assert "trained nope" in out and "trained alibi" in out
    assert "2/3 trained · step 60 of 90" in out.splitlines()[-1]  # the failed run's 30 steps are not done
    assert "Unknown position method" in (tmp_path / "runs" / "train-no-such-method.log").read_text()
    for method in ("nope", "alibi"):
        config = json.loads((tmp_path / "set" / method / "config.json").read_text())
        assert config["train"]["repeat_probability"] == 0.5 and config["train"]["method"] == method
        assert json.loads((tmp_path / "runs" / f"{method}.state" / "state.json").read_text())["step"] == 30

    # a second call (another session) finds both checkpoints made with this recipe and trains nothing
    before = (tmp_path / "set" / "nope" / "model.safetensors").stat().st_mtime_ns
    assert train_all(["nope", "alibi"], TINY, tmp_path / "set", jobs=2, threads=1, log_dir=tmp_path / "runs", every=0.5) == 0
    out = capsys.readouterr().out
    assert "skipped: nope, alibi" in out and "2/2 trained" in out
    assert (tmp_path / "set" / "nope" / "model.safetensors").stat().st_mtime_ns == before
    # ... but another recipe is another set
    assert already_trained(tmp_path / "set" / "nope", TrainConfig(method="nope", **TINY))
    assert not already_trained(tmp_path / "set" / "nope", TrainConfig(method="nope", **{**TINY, "lr": 1e-3}))
    # a checkpoint written before a recipe field existed (first_byte) was trained with the value then in effect
    path = tmp_path / "set" / "nope" / "config.json"
    config = json.loads(path.read_text())
    del config["train"]["first_byte"]
    path.write_text(json.dumps(config))
    assert already_trained(tmp_path / "set" / "nope", TrainConfig(method="nope", **TINY))
    assert not already_trained(tmp_path / "set" / "nope", TrainConfig(method="nope", **{**TINY, "first_byte": 2}))


def test_progress_line_gives_the_time_left_at_the_measured_speed(tmp_path):
    recipe = TrainConfig(method="rope", tokens=4096 * 100, batch_size=16, train_length=256)  # 100 steps of 4,096 bytes
    run = Run("rope", recipe, tmp_path / "rope")
    line = progress_line([run], bytes_per_second=4096.0)
    assert "0/1 trained · step 0 of 100 (0.0 %)" in line and "about 2 min left" in line  # 409,600 bytes at 4 kB/s
    run.finished = True
    assert "1/1 trained · step 100 of 100 (100.0 %)" in progress_line([run], None)


def test_a_running_run_counts_the_steps_its_progress_bar_shows(tmp_path):
    recipe = TrainConfig(method="rope", tokens=4096 * 100, batch_size=16, train_length=256)
    run = Run("rope", recipe, tmp_path / "rope", log=tmp_path / "train-rope.log")
    run.log.write_text("train rope:  41%|####      | 41/100 [00:30<00:44, 1.3step/s]\\rtrain rope:  42%|####      | 42/100 [00:31")
    assert run.steps_done() == 0  # not running: only saved states count
    run.process = object()  # running (the progress line only reads whether it is set)
    assert run.steps_done() == 42


def test_stopping_the_set_stops_its_runs(tmp_path):
    """`kill` on train_all must not leave its training processes running on their own: a rerun would
    then start a second process on the same state."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "set"
    settings = [f"{k}={v}" for k, v in {**TINY, "tokens": 4 * 32 * 100_000}.items()]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    boss = subprocess.Popen([sys.executable, "-m", "posviz_tools.train_all", "--methods", "nope", "--out-dir", str(out),
                             "--every", "1", "--set", *settings], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "runs" / "train-nope.log"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.is_file() and "train nope" in log.read_text(errors="replace")):
        time.sleep(0.5)
    assert "train nope" in log.read_text(errors="replace"), "the run never started"
    running = lambda: subprocess.run(["pgrep", "-f", "--", f"--out {out}/nope"], capture_output=True).returncode == 0
    assert running()
    boss.send_signal(signal.SIGTERM)
    assert boss.wait(timeout=60) == 128 + signal.SIGTERM
    assert not running()


def test_speed_is_over_the_recent_window_and_forgets_what_came_before_a_stop():
    from posviz_tools.train_all import Speed

    speed = Speed(window=600, gap=60)
    assert speed.rate() is None
    for t in range(0, 700, 5):  # 100 bytes/s for the first 300 s, then 200 bytes/s
        speed.add(t, 100 * min(t, 300) + 200 * max(0, t - 300))
    assert speed.rate() == pytest.approx((200 * 395 + 100 * 300 - 100 * 95) / 600, rel=0.02)  # the last 600 s only
    speed.add(695 + 900, 200 * 395 + 30_000)  # stopped for 15 minutes (SIGSTOP): the runs did nothing meanwhile
    assert speed.rate() is None  # not "20 bytes/s, hundreds of hours left"
    speed.add(695 + 900 + 40, 200 * 395 + 30_000 + 8_000)
    assert speed.rate() == pytest.approx(200)
