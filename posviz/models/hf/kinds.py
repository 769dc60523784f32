"""The published models' kinds: which refs are a transformers folder or hub id, which a GGUF file, and how each
is opened as a ``PublishedModel`` (registered in ``MODEL_KINDS`` at import).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

import torch

from posviz.errors import PosvizError
from posviz.models.interface import MODEL_KINDS, LabModel, ModelKind, open_model
from posviz.models.hf.hub import HUB_ID, WEIGHT_FILES, is_transformers_folder, read_hf_config
from posviz.models.hf.model import PublishedModel, run_dtype
from posviz.models.shipped import _frozen
from posviz.models.hf import gguf


def _folder_stamp(folder: Path) -> tuple[int, ...]:
    return tuple((folder / f).stat().st_mtime_ns if (folder / f).is_file() else 0
                 for f in ("config.json", *WEIGHT_FILES, "tokenizer.json"))


class TransformersKind(ModelKind):
    """A folder holding a transformers model, or a hub id (``owner/name``)."""

    def recognises(self, ref: str) -> bool:
        if ref.lower().endswith(".gguf"):  # a GGUF file, local or on the hub: posviz.models.hf.gguf's kind
            return False
        path = Path(ref)
        if path.is_dir():
            return is_transformers_folder(path)
        return bool(HUB_ID.match(ref)) and "/" in ref

    def identify(self, ref: str, position_overrides: Mapping) -> tuple:
        path = Path(ref)
        where = (str(path.resolve()),) + _folder_stamp(path.resolve()) if path.is_dir() else (ref,)
        return ("transformers",) + where + (_frozen(position_overrides),)

    # A hub id that just failed (offline, gated, unknown) fails again at once for this long, so that every
    # page run of every visitor does not wait on the network for the same answer.
    FAILURE_MEMORY_S = 60.0

    def __init__(self):
        self._failed: dict[str, tuple[float, PosvizError]] = {}

    def build(self, ref: str, position_overrides: Mapping, device: torch.device, key: tuple) -> LabModel:
        path = Path(ref)
        ref = str(path.resolve()) if path.is_dir() else ref
        if not path.is_dir():
            failed = self._failed.get(ref)
            if failed is not None and time.monotonic() - failed[0] < self.FAILURE_MEMORY_S:
                raise failed[1]
            try:
                config, folder = read_hf_config(ref)
            except PosvizError as exc:
                self._failed[ref] = (time.monotonic(), exc)
                raise
        else:
            config, folder = read_hf_config(ref)
        engine = None
        if position_overrides:  # the scaled variants share the weights of the model as published
            engine = open_model(ref, None, device)._engine
        return PublishedModel(ref, config, folder, position_overrides, device, key, engine)


class GGUFKind(ModelKind):
    """A GGUF model file (``posviz.models.hf.gguf``): a ``.gguf`` path, a folder holding one, or ``owner/name/file.gguf``."""

    def recognises(self, ref: str) -> bool:
        return gguf.is_gguf_ref(ref)

    def identify(self, ref: str, position_overrides: Mapping) -> tuple:
        path = gguf.local_file(ref)
        where = tuple(gguf.file_stamp(path).values()) if path is not None else (ref,)  # path, size, mtime
        return ("gguf",) + where + (_frozen(position_overrides),)

    def build(self, ref: str, position_overrides: Mapping, device: torch.device, key: tuple) -> LabModel:
        local = gguf.local_file(ref)
        path = local or gguf.hub_download(ref)
        header = gguf.read_header(path)
        gguf.check(header)  # the cap and the architecture, before anything is dequantised
        if position_overrides:  # the scaled variants share the weights of the model as published
            engine = open_model(ref, None, device)._engine
            config = engine.config
        elif gguf.is_converted(path):
            config, _ = read_hf_config(str(gguf.converted_folder(path)))
            engine = None
        else:
            config, engine = gguf.read_config(path), None
        folder = gguf.converted_folder(path)
        if engine is None:
            engine = gguf.GGUFEngine(header, folder, config, device, run_dtype(config, device))
        model = PublishedModel(ref, config, folder, position_overrides, device, key, engine)
        model.name = (path.name if local is not None else ref) + (f"+{model.remap.name}" if model.remap else "")
        model.weights_note = f"GGUF {header.quantization}"
        return model


MODEL_KINDS["transformers"] = TransformersKind()
MODEL_KINDS["gguf"] = GGUFKind()
