"""Checkpoints: ``model.safetensors`` (16-bit weights) + ``config.json`` + ``metrics.json``.

Never pickle. Loading checks the config's keys and every tensor's name and shape, and a missing,
truncated or mismatched file gives an error that names the file and what is wrong.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from posviz.config import ModelConfig
from posviz.errors import CheckpointError, PosvizError
from posviz.models.byte_gpt import GPT

WEIGHTS, CONFIG, METRICS = "model.safetensors", "config.json", "metrics.json"
STORAGE_DTYPE = torch.float16  # 10 mantissa bits: evaluations of the stored weights match fp32 closely


def save_checkpoint(model: GPT, folder: str | Path, extra_config: Mapping[str, Any] | None = None,
                    metrics: Mapping[str, Any] | None = None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", STORAGE_DTYPE).contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to wte.weight: stored once
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt", "posviz": "1"})
    config = {"model": model.config.to_dict(), **dict(extra_config or {})}
    (folder / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")
    if metrics is not None:
        write_metrics(folder, metrics)
    return folder


def write_metrics(folder: str | Path, metrics: Mapping[str, Any]) -> None:
    (Path(folder) / METRICS).write_text(json.dumps(metrics, indent=2) + "\n")


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: file is missing. A checkpoint folder needs {WEIGHTS}, {CONFIG} and {METRICS}; "
                              "regenerate it with `make checkpoints` or `python -m posviz.train`.")
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}).") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object at the top level.")
    return value


def extends_context(finetuned_from: Mapping[str, Any] | None) -> bool:
    """Whether a checkpoint's ``finetuned_from`` record is a fine-tune for context (rope-ft4x: trained on at a longer
    length, what the Context extension lab sets before and after): every fine-tune but a recalibration without its
    base's positions (DroPE: ``dropped_positions``), which is a model of the training length in every table."""
    return bool(finetuned_from) and not finetuned_from.get("dropped_positions")


def read_config(folder: str | Path) -> dict:
    return read_json(Path(folder) / CONFIG)


def read_metrics(folder: str | Path) -> dict:
    return read_json(Path(folder) / METRICS)


SEEDS = "seeds.json"  # other training seeds of a checkpoint's recipe, their scores only (posviz.training.seeds)


def read_seeds(folder: str | Path) -> list[dict]:
    """The entries of ``folder``'s seeds.json ([] when it has none): one per training seed, {seed, ...scores}."""
    path = Path(folder) / SEEDS
    return read_json(path)["seeds"] if path.is_file() else []


def write_seeds(folder: str | Path, entries: list[dict]) -> None:
    (Path(folder) / SEEDS).write_text(json.dumps({
        "about": "Other training seeds of this checkpoint's recipe (python -m posviz.train --method NAME --seed S), "
                 "their scores kept, not their weights (python -m posviz.training.seeds).",
        "seeds": sorted(entries, key=lambda e: e["seed"])}, indent=1) + "\n")


def load_checkpoint(folder: str | Path, position_overrides: Mapping[str, Any] | None = None,
                    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> GPT:
    """Load ``folder`` into a GPT in eval mode.

    position_overrides: position options replaced at load time, e.g. ``{"scaling": "yarn", "factor": 4}``
    to apply a RoPE context-extension method to the ``rope`` checkpoint.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist; run `make checkpoints` to create the shipped set.")
    config = read_config(folder)
    if not isinstance(config.get("model"), dict):
        raise CheckpointError(f"{folder / CONFIG}: has no 'model' section (an object with the model's shape).")
    model_dict = dict(config["model"])
    try:
        model = GPT(ModelConfig.from_dict(model_dict))  # the file as stored must be valid on its own
    except PosvizError as exc:
        raise CheckpointError(f"{folder / CONFIG}: {exc}") from exc
    if position_overrides:  # a bad override is the caller's mistake, not the file's: plain PosvizError
        model_dict["position_options"] = {**model_dict.get("position_options", {}), **dict(position_overrides)}
        model = GPT(ModelConfig.from_dict(model_dict))  # built twice only then: a build is half of a load
    path = folder / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{path}: file is missing.")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot be read as safetensors (truncated or corrupt?): {exc}") from exc
    expected = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path}: tensors do not match {CONFIG}: missing {missing[:5]}, unexpected {unexpected[:5]}.")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(f"{path}: tensor {name} has shape {tuple(tensor.shape)}, "
                                  f"but {CONFIG} implies {tuple(expected[name].shape)}.")
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=False)
    return model.to(device=device, dtype=dtype).eval()


def models_dir() -> Path:
    """The shipped checkpoints: ``models/`` beside the package, or $POSVIZ_CHECKPOINTS (tests use small ones)."""
    import os

    return Path(os.environ.get("POSVIZ_CHECKPOINTS") or Path(__file__).resolve().parents[2] / "models")


def shipped_checkpoints(folder: str | Path | None = None) -> dict[str, Path]:
    """{name: folder} of every checkpoint folder (one with a config.json) under ``folder``, in display order."""
    from posviz.positions import method_names

    root = Path(folder) if folder is not None else models_dir()
    found = {p.name: p for p in sorted(root.iterdir()) if (p / CONFIG).is_file()} if root.is_dir() else {}
    order = {name: i for i, name in enumerate(method_names())}
    return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
