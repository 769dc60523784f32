"""The shipped checkpoints as models a lab can run (``posviz.models.interface.LabModel``).

A checkpoint folder (``model.safetensors``, ``config.json``, ``metrics.json``) holds a byte-level GPT
(``posviz.models.byte_gpt``): ids are bytes, so every id covers one byte. Resolving one reads its config.json and
the weights file's stamp, enough for a page to lay out its widgets; the weights load on the first
forward pass (or the first look at its trained position parameters).
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.models.checkpoint_files import (CONFIG, METRICS, WEIGHTS, load_checkpoint, models_dir, read_config, read_metrics,
                                           read_seeds)
from posviz.config import ModelConfig
from posviz.errors import CheckpointError, PosvizError
from posviz.models.interface import MODEL_KINDS, LabModel, ModelKind
from posviz.models.byte_gpt import GPT
from posviz.models.kv_cache import KVCache
from posviz.positions import ModelShape, build_position_method


def checkpoint_stamp(folder: str | Path) -> tuple[int, ...]:
    """Changes whenever one of the folder's files is rewritten, so a retrained or re-evaluated checkpoint
    is read again (0 for a missing file)."""
    paths = (Path(folder) / name for name in (WEIGHTS, CONFIG, METRICS))
    return tuple(p.stat().st_mtime_ns if p.is_file() else 0 for p in paths)


class CheckpointModel(LabModel):
    """One of our byte-level checkpoints (see the module docstring)."""

    def __init__(self, folder: Path, position_overrides: Mapping, device: torch.device, key: tuple):
        self.folder, self.key, self._device = folder, key, device
        self._overrides = dict(position_overrides)
        self.config = read_config(folder)  # the whole config.json: model, training recipe, lineage
        model_dict = self.config.get("model") if isinstance(self.config.get("model"), dict) else {}
        try:
            ModelConfig.from_dict(model_dict)  # the file as stored must be valid on its own
        except PosvizError as exc:
            raise CheckpointError(f"{folder / CONFIG}: {exc}") from exc
        # a bad override is the caller's mistake, not the file's: plain PosvizError
        cfg = ModelConfig.from_dict({**model_dict, "position_options": {**model_dict.get("position_options", {}),
                                                                        **self._overrides}})
        if not (folder / WEIGHTS).is_file():
            raise CheckpointError(f"{folder / WEIGHTS}: file is missing.")
        self.model_config, self.position_options = cfg, dict(cfg.position_options)
        self.name, self.method, self.train_length = folder.name, cfg.position, cfg.train_length
        workshop = self.config.get("workshop")  # a formula a visitor trained in the Workshop: the labs' "yours: …"
        if isinstance(workshop, dict) and isinstance(workshop.get("label"), str):
            self.name = f"yours: {workshop['label'][:60]}"
        if self._overrides.get("remap", "none") != "none":  # as the labs list it: the checkpoint and its remap
            self.name = f"{folder.name}+{self._overrides['remap']}"
        self.n_layer, self.n_head, self.vocab_size = cfg.n_layer, cfg.n_head, cfg.vocab_size
        # The method as configured, without weights: what it can represent, and its frequencies.
        self._described = build_position_method(cfg.position, ModelShape(cfg.n_layer, cfg.n_head, cfg.head_dim,
                                                                         cfg.n_embd, cfg.train_length),
                                                cfg.position_options)
        self.max_positions = self._described.max_positions
        self.is_absolute, self.acts_on = self._described.is_absolute, self._described.acts_on
        self.reads_content = self._described.reads_content
        self.remaps = tuple(ROPE_REMAPS) if self._described.takes_remaps else ()
        self._net: GPT | None = None
        self._loading = threading.Lock()
        self._metrics: dict | None = None

    @property
    def net(self) -> GPT:
        """The GPT itself, loaded on first use (once, whichever thread asks first)."""
        if self._net is None:
            with self._loading:
                if self._net is None:
                    self._net = load_checkpoint(self.folder, self._overrides or None, device=self._device)
        return self._net

    # -- text: ids are bytes ------------------------------------------------------------------------
    def encode(self, text: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(text), dtype=torch.uint8).long() if text else torch.zeros(0, dtype=torch.long)

    def decode(self, ids) -> bytes:
        return bytes(int(i) for i in ids)

    def bytes_per_id(self, ids) -> np.ndarray:
        return np.ones(len(ids), dtype=np.int64)

    def count_ids(self, text: bytes) -> int:
        return len(text)

    @property
    def id_axis(self) -> tuple:
        return ("byte",)  # a byte is a byte whatever the context it was trained on: every checkpoint shares one axis

    # -- running ------------------------------------------------------------------------------------
    def __call__(self, ids, positions=None, cache=None, attention_layer=None, attention_head=None):
        return self.net(ids, positions=positions, cache=cache, attention_layer=attention_layer,
                        attention_head=attention_head)

    def load(self, progress=None) -> None:
        self.net

    def new_cache(self, max_size: int | None = None, sinks: int = 0, for_maps: bool = False) -> KVCache:
        return KVCache(self.n_layer, max_size=max_size, sinks=sinks, for_maps=for_maps)

    def shift_cache_front(self, cache, count: int, start: int) -> bool:
        return cache.shift_front(count, start, self.net.position.shift_cached_keys)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def position(self):
        return self.net.position

    def is_shift_invariant(self) -> bool:
        return self._described.is_shift_invariant()

    def layer_kind(self, layer: int) -> str:
        # from the config alone, as the layout: asking what a layer is never opens (or fails on) the weights
        return self._described.at_layer(layer).layer_kind(layer)

    def layer_layout(self) -> list[dict]:
        from posviz.positions.layers import layer_rows

        return layer_rows(self._described, self.n_layer)

    def frequencies(self, seq_len: int):
        frequencies = getattr(self._described, "frequencies", None)
        return None if frequencies is None else frequencies(seq_len)

    def with_position_options(self, overrides: Mapping) -> LabModel:
        from posviz.models.interface import open_model

        return open_model(self.folder, {**self._overrides, **dict(overrides)}, self._device)

    # -- what it stored -----------------------------------------------------------------------------
    def stored_metrics(self) -> dict:
        """metrics.json, read once (the model's key changes with the file, so a new one is a new model). Nothing
        for the checkpoint under other position options (a scaling, a remap): its file holds the model as trained."""
        if self._overrides:
            return {}
        if self._metrics is None:
            try:
                self._metrics = read_metrics(self.folder)
            except PosvizError:
                self._metrics = {}
        return self._metrics

    def stored_seeds(self) -> list[dict]:
        """seeds.json beside the weights (``posviz.training.seeds``); nothing under other position options."""
        if self._overrides:
            return []
        try:
            return read_seeds(self.folder)
        except (PosvizError, OSError, ValueError, KeyError, TypeError):  # damaged: no band, the model still runs
            return []

    def finetuned_from(self) -> dict | None:
        return self.config.get("finetuned_from") or None


class CheckpointKind(ModelKind):
    """Refs of the shipped checkpoints: a name under ``models/`` (or $POSVIZ_CHECKPOINTS), or a folder."""

    @staticmethod
    def folder(ref: str) -> Path:
        path = Path(ref)
        return (path if path.is_dir() else models_dir() / ref).resolve()

    def recognises(self, ref: str) -> bool:
        path = Path(ref) if Path(ref).is_dir() else models_dir() / ref
        if not path.is_dir():
            return False
        try:  # a transformers model's folder is the published models' kind (its config names a model_type)
            return "model_type" not in json.loads((path / CONFIG).read_text())
        except (OSError, ValueError, TypeError):  # ours, damaged (opening it says what is wrong), unless it holds
            return not any(path.glob("*.gguf"))  # a GGUF file and no config: the published models' GGUF kind

    def identify(self, ref: str, position_overrides: Mapping) -> tuple:
        folder = self.folder(ref)
        return ("checkpoint", str(folder), _frozen(position_overrides)) + checkpoint_stamp(folder)

    def build(self, ref: str, position_overrides: Mapping, device: torch.device, key: tuple) -> LabModel:
        return CheckpointModel(self.folder(ref), position_overrides, device, key)


MODEL_KINDS["checkpoint"] = CheckpointKind()


def _frozen(value):
    """``value`` as a hashable key: mappings as sorted (key, value) tuples and lists as tuples, all the way down
    (a remap's options are a mapping inside the position options)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def as_lab_model(net: GPT, name: str | None = None) -> LabModel:
    """A GPT built in memory (tests, training) as a LabModel, keyed on its identity."""
    return InMemoryModel(net, name or net.config.position)


class InMemoryModel(CheckpointModel):
    """A GPT that was never saved: the shipped kind, without a folder."""

    def __init__(self, net: GPT, name: str):  # not super().__init__: that one reads a folder
        cfg = net.config
        self.folder, self.config, self.model_config, self._overrides = None, {"model": cfg.to_dict()}, cfg, {}
        self.position_options = dict(cfg.position_options)
        self.key = ("in-memory", id(net))
        self.name, self.method, self.train_length = name, cfg.position, cfg.train_length
        self.n_layer, self.n_head, self.vocab_size = cfg.n_layer, cfg.n_head, cfg.vocab_size
        self._described = net.position
        self.max_positions, self.is_absolute = net.position.max_positions, net.position.is_absolute
        self.acts_on, self.reads_content = net.position.acts_on, net.position.reads_content
        self.remaps = tuple(ROPE_REMAPS) if net.position.takes_remaps else ()
        self._net, self._loading, self._device = net, threading.Lock(), net.device

    @property
    def device(self) -> torch.device:
        return self._net.device

    def with_position_options(self, overrides: Mapping) -> LabModel:
        cfg = self.model_config.to_dict()
        cfg["position_options"] = {**cfg.get("position_options", {}), **dict(overrides)}
        net = GPT(ModelConfig.from_dict(cfg)).to(self.device)
        net.load_state_dict(self._net.state_dict())
        return InMemoryModel(net.eval(), self.name)

    def stored_metrics(self) -> dict:
        return {}
