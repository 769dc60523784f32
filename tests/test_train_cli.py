"""The training CLI end to end: one process, and two processes under torchrun (DDP, gloo on CPU).

These run the real ``python -m posviz.train`` in a subprocess on a few thousand bytes of the real
corpus, so they check what a contributor running the README command gets.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from posviz.models.checkpoint_files import load_checkpoint
from posviz.config import ModelConfig
from posviz.models.byte_gpt import GPT
from posviz.training.train import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
PYTHON = Path(sys.executable)
TORCHRUN = PYTHON.parent / "torchrun"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def run(command: list[str], timeout: int = 180, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run from ``cwd``: a run that saves states writes them to ./runs, which must not be the project's."""
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_cli_trains_and_writes_a_complete_checkpoint(tmp_path):
    out = tmp_path / "alibi"
    recipe = ["tokens=8192", "n_embd=32", "n_layer=1", "train_length=32", "batch_size=4", "eval_bytes=4096", "log_every=1",
              "checkpoint_every=16"]
    run([str(PYTHON), "-m", "posviz.train", "--method", "alibi", "--out", str(out), "--set", *recipe], cwd=tmp_path)
    assert (tmp_path / "runs" / "alibi.state" / "state.json").is_file()  # resumable states go to ./runs

    assert sorted(p.name for p in out.iterdir()) == ["config.json", "metrics.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert set(config) == {"model", "train", "corpus", "trained_on", "versions"}
    model_config = ModelConfig.from_dict(config["model"])  # strict: no stray keys
    assert (model_config.position, model_config.n_embd, model_config.n_layer, model_config.train_length) == ("alibi", 32, 1, 32)
    assert set(config["train"]) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert config["train"]["tokens"] == 8192 and config["train"]["batch_size"] == 4
    assert config["trained_on"]["processes"] == 1 and config["trained_on"]["device"] == "cpu"
    assert {"train_files", "validation_files", "file_list_sha256"} <= set(config["corpus"])
    assert set(config["versions"]) == {"python", "torch"}

    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"train_curve", "copy_curve", "final_train_bpb", "steps", "tokens", "parameters",
                            "val_bpb_at_train_length"}
    # the copy check at every saved state (steps 16, 32, 48, 64): when copying forms, for the set's metrics
    assert [(p["step"], p["tokens"]) for p in metrics["copy_curve"]] == [(s, s * 4 * 32) for s in (16, 32, 48, 64)]
    assert all(0 < p["ratio"] < 5 and 0 < p["gain"] < 5 for p in metrics["copy_curve"])
    steps = 8192 // (4 * 32)
    assert metrics["steps"] == steps and metrics["tokens"] == 8192
    curve = metrics["train_curve"]
    assert [point["step"] for point in curve] == list(range(steps))  # log_every=1: every step
    assert all(set(point) == {"step", "tokens", "train_bpb", "seconds"} for point in curve)
    assert curve[-1]["tokens"] == 8192 and metrics["final_train_bpb"] == curve[-1]["train_bpb"]
    assert curve[0]["train_bpb"] > 7.5  # a random byte model starts near log2(256) = 8 bits
    assert metrics["final_train_bpb"] < curve[0]["train_bpb"] - 1.0  # and 64 steps teach it something
    assert 0 < metrics["val_bpb_at_train_length"] < curve[0]["train_bpb"]

    model = load_checkpoint(out)
    assert metrics["parameters"] == model.num_parameters() == GPT(model_config).num_parameters()


def test_torchrun_on_two_processes_matches_one_process(tmp_path):
    """DDP splits each global batch of 4 into 2 + 2 and averages the gradients, which is the mean over
    the 4 sequences, so it must train the same weights as one process. Not bit-for-bit: the all-reduce
    adds the two halves' float32 gradients in another order than one backward pass over 4 rows, and
    the stored weights are fp16, so such a last-bit difference can round to a neighbouring fp16 value.
    Hence: equal to 1 fp16 step (2^-10 relative), and almost every weight bit-identical. bf16 autocast
    is off: its per-shape rounding of matmuls would differ between batches of 2 and 4 by itself."""
    recipe = ["tokens=768", "n_embd=32", "n_layer=2", "train_length=32", "batch_size=4", "eval_bytes=4096",
              "log_every=1", "precision=fp32", "repeat_probability=0.5", "repeat_min_bytes=4", "repeat_max_bytes=12"]
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    run([str(PYTHON), "-m", "posviz.train", "--method", "shaw", "--out", str(single), "--set", *recipe])
    run([str(TORCHRUN), "--standalone", "--nproc_per_node", "2", "-m", "posviz.train", "--method", "shaw",
         "--out", str(ddp), "--set", *recipe])

    config_single = json.loads((single / "config.json").read_text())
    config_ddp = json.loads((ddp / "config.json").read_text())
    assert config_single["trained_on"]["processes"] == 1 and config_ddp["trained_on"]["processes"] == 2
    assert config_ddp["train"] == config_single["train"] and config_ddp["model"] == config_single["model"]

    a, b = load_file(str(single / "model.safetensors")), load_file(str(ddp / "model.safetensors"))
    assert set(a) == set(b)
    identical = total = 0
    for name in a:
        torch.testing.assert_close(b[name].float(), a[name].float(), rtol=2**-10, atol=1e-6, msg=name)
        identical += int((a[name] == b[name]).sum())
        total += a[name].numel()
    assert identical / total > 0.999, f"only {identical}/{total} weights identical"
    # training moved the weights: the comparison is not between two copies of the same init
    with torch.random.fork_rng():
        torch.manual_seed(config_single["train"]["seed"])  # the recipe's initial weights
        init = GPT(ModelConfig.from_dict(config_single["model"]))
    assert not torch.allclose(a["blocks.0.attn.c_attn.weight"].float(), init.blocks[0].attn.c_attn.weight.half().float())

    # rank 0 logs the loss of the whole global batch, so the curves agree too
    curve_single = json.loads((single / "metrics.json").read_text())["train_curve"]
    curve_ddp = json.loads((ddp / "metrics.json").read_text())["train_curve"]
    assert len(curve_single) == len(curve_ddp) == 6
    for p, q in zip(curve_single, curve_ddp):
        assert (p["step"], p["tokens"]) == (q["step"], q["tokens"])
        assert q["train_bpb"] == pytest.approx(p["train_bpb"], abs=2e-4)


def small_recipe(**overrides) -> TrainConfig:
    return TrainConfig(**{"method": "kerple", "n_layer": 1, "n_embd": 32, "train_length": 32, "batch_size": 4,
                          "tokens": 4 * 32 * 12, "warmup_steps": 2, "eval_bytes": 1024, "log_every": 1,
                          "checkpoint_every": 5, "precision": "fp32", "repeat_probability": 0.5,
                          "repeat_min_bytes": 4, "repeat_max_bytes": 12, **overrides})


def test_a_stopped_run_resumes_to_exactly_the_weights_of_an_uninterrupted_one(tmp_path):
    from posviz.training.train import train

    cfg = small_recipe()
    whole = train(cfg, tmp_path / "whole", progress=False, state_dir=tmp_path / "whole.state")
    stopped = train(cfg, tmp_path / "parts", progress=False, state_dir=tmp_path / "parts.state", stop_after=7)
    assert stopped["stopped_at_step"] == 7 and not (tmp_path / "parts").exists()  # nothing shipped yet
    assert json.loads((tmp_path / "parts.state" / "state.json").read_text())["step"] == 7
    resumed = train(cfg, tmp_path / "parts", progress=False, resume=True, state_dir=tmp_path / "parts.state")
    assert [r["train_bpb"] for r in resumed["train_curve"]] == [r["train_bpb"] for r in whole["train_curve"]]
    assert resumed["copy_curve"] == whole["copy_curve"] and len(whole["copy_curve"]) == 2  # steps 5 and 10, kept across the stop
    a, b = load_file(str(tmp_path / "whole" / "model.safetensors")), load_file(str(tmp_path / "parts" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_state_made_with_another_recipe(tmp_path):
    from posviz.errors import PosvizError
    from posviz.training.train import train

    train(small_recipe(), tmp_path / "m", progress=False, state_dir=tmp_path / "s", stop_after=3)
    with pytest.raises(PosvizError, match=r"another recipe \(differs in: lr\)"):
        train(small_recipe(lr=1e-4), tmp_path / "m", progress=False, resume=True, state_dir=tmp_path / "s")


def test_a_short_run_in_each_precision_trains_and_records_it(tmp_path):
    """One short run in fp32 and one under bf16 autocast, same seed and data: each lowers the loss and
    records the precision it ran in; bf16 really ran (its rounded matmuls give other weights)."""
    from posviz.training.train import train

    weights, curves = {}, {}
    for precision in ("fp32", "bf16"):
        metrics = train(small_recipe(precision=precision, tokens=4 * 32 * 6, warmup_steps=1), tmp_path / precision,
                        progress=False, state_dir=tmp_path / f"{precision}.state")
        trained_on = json.loads((tmp_path / precision / "config.json").read_text())["trained_on"]
        assert trained_on["precision"] == precision and trained_on["asked"] == precision
        curves[precision] = [row["train_bpb"] for row in metrics["train_curve"]]
        assert all(math.isfinite(b) for b in curves[precision]) and curves[precision][-1] < curves[precision][0]
        weights[precision] = load_checkpoint(tmp_path / precision).state_dict()
    largest = max(float((weights["fp32"][k].float() - weights["bf16"][k].float()).abs().max()) for k in weights["fp32"])
    assert largest > 1e-4, "the bf16 run gave the fp32 run's weights: autocast did not act"


def test_finetuning_at_a_longer_length_starts_from_the_checkpoint_and_records_it(tmp_path):
    from posviz.training.evaluate import bits_per_byte
    from posviz.training.data import load_corpus

    base = tmp_path / "rope"
    recipe = ["n_embd=32", "n_layer=1", "train_length=32", "batch_size=8", "eval_bytes=4096", "precision=fp32"]
    run([str(PYTHON), "-m", "posviz.train", "--method", "rope", "--out", str(base), "--set", "tokens=40960", *recipe])
    tuned = tmp_path / "rope-linear-ft2x"
    run([str(PYTHON), "-m", "posviz.train", "--method", "rope", "--out", str(tuned), "--option", "scaling=linear",
         "factor=2.0", "original_length=32", "--set", "tokens=16384", "train_length=64", "lr=0.001", "warmup_steps=2",
         f"finetune_from={base}", *recipe[:2], "batch_size=8", "eval_bytes=4096", "precision=fp32"])
    config = json.loads((tuned / "config.json").read_text())
    assert config["finetuned_from"] == {"checkpoint": str(base), "tokens": 16384, "train_length": 64,
                                        "position_options": {"scaling": "linear", "factor": 2.0, "original_length": 32}}
    assert config["model"]["train_length"] == 64 and config["model"]["position_options"]["scaling"] == "linear"
    data = load_corpus().eval_stream(1 << 14)
    before = bits_per_byte(load_checkpoint(base, {"scaling": "linear", "factor": 2.0, "original_length": 32}), data, 64)
    after = bits_per_byte(load_checkpoint(tuned), data, 64)
    assert after < before - 0.05  # fine-tuning at the new length pays off there


def test_finetuning_refuses_another_method(tmp_path):
    base = tmp_path / "alibi"
    recipe = ["n_embd=32", "n_layer=1", "train_length=32", "batch_size=4", "eval_bytes=4096", "precision=fp32", "tokens=256"]
    run([str(PYTHON), "-m", "posviz.train", "--method", "alibi", "--out", str(base), "--set", *recipe])
    result = subprocess.run([str(PYTHON), "-m", "posviz.train", "--method", "rope", "--out", str(tmp_path / "x"),
                             "--set", *recipe, f"finetune_from={base}"], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert result.returncode == 1 and "fine-tuning a 'alibi' checkpoint" in result.stderr


def test_a_rope_checkpoint_recalibrated_as_nope_is_drope_and_nothing_else_changes_method(tmp_path):
    """DroPE (arXiv 2512.12167): a RoPE model fine-tuned with its rotation removed. Every weight carries over (RoPE holds
    none of its own), the config says what it came from; a method holding weights (FIRE's MLP) may not be dropped, and nope may not turn into rope."""
    from posviz.training.train import drops_positions

    base = tmp_path / "rope"
    recipe = ["n_embd=32", "n_layer=1", "train_length=32", "batch_size=4", "eval_bytes=4096", "precision=fp32"]
    run([str(PYTHON), "-m", "posviz.train", "--method", "rope", "--out", str(base), "--set", "tokens=1024", *recipe])
    dropped = tmp_path / "rope-drope"
    run([str(PYTHON), "-m", "posviz.train", "--method", "nope", "--out", str(dropped), "--set", "tokens=256", "lr=0.0003",
         f"finetune_from={base}", *recipe])
    config = json.loads((dropped / "config.json").read_text())
    assert config["model"]["position"] == "nope" and config["finetuned_from"]["checkpoint"] == str(base)
    assert config["finetuned_from"]["dropped_positions"] == "rope"  # a recalibration, not a fine-tune for context
    from posviz.models.checkpoint_files import extends_context

    assert not extends_context(config["finetuned_from"]) and extends_context({"checkpoint": "models/rope"})
    start, after = load_checkpoint(base), load_checkpoint(dropped)
    assert set(start.state_dict()) == set(after.state_dict())  # the same weights, recalibrated
    assert drops_positions(start, "nope") and not drops_positions(start, "alibi")
    fire = tmp_path / "fire"
    run([str(PYTHON), "-m", "posviz.train", "--method", "fire", "--out", str(fire), "--set", "tokens=256", *recipe])
    assert not drops_positions(load_checkpoint(fire), "nope")  # FIRE's MLP is weights: dropping it is no DroPE
    result = subprocess.run([str(PYTHON), "-m", "posviz.train", "--method", "rope", "--out", str(tmp_path / "x"),
                             "--set", *recipe, "tokens=256", f"finetune_from={dropped}"], cwd=ROOT, env=ENV,
                            capture_output=True, text=True)
    assert result.returncode == 1 and "fine-tuning a 'nope' checkpoint" in result.stderr


def test_rows_that_begin_with_a_first_byte_still_predict_the_next_byte():
    """The sink experiment's rows (``first_byte``): the byte first, the text after it, every target the next byte."""
    from posviz.errors import ConfigError
    from posviz.training.data import begin_rows, get_batch
    from posviz.training.train import TrainConfig

    data = np.frombuffer(b"def f(x):\n    return x\n" * 4, dtype=np.uint8)
    x, y = get_batch(data, torch.tensor([0, 5]), 16)
    bx, by = begin_rows(x, y, 2)
    assert (bx[:, 0] == 2).all() and torch.equal(bx[:, 1:], x[:, :-1])
    assert torch.equal(by[:, :-1], bx[:, 1:]) and torch.equal(by[:, -1], y[:, -2])  # each target: the next byte
    with pytest.raises(ConfigError, match="first_byte"):
        TrainConfig(first_byte=256)


def test_training_a_preset_layout_stores_its_layers_written_out(tmp_path, monkeypatch):
    """The recipe keeps the name it asked for ({}); the model's config gets every layer as built, so a preset edited
    after training changes nothing the checkpoint loads."""
    from posviz.positions import POSITION_METHODS
    from posviz.training.train import train

    cfg = small_recipe(method="local_global", n_layer=2)
    train(cfg, tmp_path / "m", progress=False, state_dir=tmp_path / "s")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["train"]["position_options"] == {}
    layers = config["model"]["position_options"]["layers"]
    assert [(la["method"], la["options"]["base"], la["window"], la["sinks"]) for la in layers] == [
        ("rope", 10_000.0, cfg.train_length // 4, False), ("rope", 10_000.0, cfg.train_length // 4, False)]
    idx = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = load_checkpoint(tmp_path / "m")(idx).logits
        monkeypatch.setattr(POSITION_METHODS["local_global"], "preset_layers",
                            classmethod(lambda cls, shape: [{"method": "rope", "options": {"base": 7.0}}]))
        torch.testing.assert_close(load_checkpoint(tmp_path / "m")(idx).logits, before, rtol=0, atol=0)
