"""Where a published model's files come from (a folder, or the Hugging Face hub only when asked for), and
the safety checks before anything runs: no remote code, safetensors only, the parameter count from the config.
"""
from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import torch

from posviz.errors import PosvizError
from posviz.models.hf.families import FAMILIES, sdpa_ok, supported_families


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$")


def is_transformers_folder(path: Path) -> bool:
    """A folder whose config.json is a transformers config (it names a ``model_type``)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config


def hub_error(ref: str, exc: Exception) -> PosvizError:
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, GatedRepoError):
        return PosvizError(f"{ref} is gated on the Hugging Face hub: accept its licence on its hub page and give this "
                           "server a token (HF_TOKEN), or choose another model. The shipped checkpoints keep working.")
    if isinstance(exc, RepositoryNotFoundError):
        return PosvizError(f"No model called {ref!r} on the Hugging Face hub (or it is private). Check the id, e.g. "
                           "openai-community/gpt2. The shipped checkpoints keep working.")
    if isinstance(exc, (LocalEntryNotFoundError, OSError)) or "offline" in str(exc).lower():
        return PosvizError(f"Cannot reach the Hugging Face hub to fetch {ref} (offline, or the network is down), and it "
                           "is not in the local cache. Give a local folder instead; the shipped checkpoints keep working.")
    return PosvizError(f"Cannot fetch {ref} from the Hugging Face hub: {exc}")


def hub_file(ref: str, filename: str, progress=None) -> Path:
    """One file of hub model ``ref`` (from the local cache when it is there)."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(ref, filename))
    except Exception as exc:  # every hub failure becomes words a page shows
        raise hub_error(ref, exc) from exc


def hub_listing(ref: str) -> list[str]:
    from huggingface_hub import list_repo_files

    if os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true"):
        raise hub_error(ref, OSError("offline"))
    try:
        return list(list_repo_files(ref))
    except Exception as exc:
        raise hub_error(ref, exc) from exc


def read_hf_config(ref: str) -> tuple[object, Path | None]:
    """(transformers config, local folder or None for a hub id), refusing remote code before anything else."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    folder = Path(ref) if Path(ref).is_dir() else None
    path = folder / "config.json" if folder is not None else hub_file(ref, "config.json")
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PosvizError(f"{path}: not a readable config.json ({exc}).") from exc
    model_type = raw.get("model_type")
    if "auto_map" in raw or model_type not in CONFIG_MAPPING:
        raise PosvizError(f"{ref} needs its own code to run (model_type {model_type!r}{', auto_map' if 'auto_map' in raw else ''}): "
                          f"posviz never runs remote code. Supported families: {supported_families()}.")
    # Qwen3.5's and Llama 4's published configs describe a vision-language model around a text model: the labs read
    # the text model, which AutoModelForCausalLM builds from the text config and the checkpoint's language-model weights
    text_type = (raw.get("text_config") or {}).get("model_type") if isinstance(raw.get("text_config"), dict) else None
    if model_type not in FAMILIES and text_type not in FAMILIES:
        raise PosvizError(f"{ref} is a {model_type!r} model, whose position method posviz does not read. "
                          f"Supported families: {supported_families()}.")
    try:
        config = AutoConfig.from_pretrained(str(Path(path).parent), trust_remote_code=False)
    except Exception as exc:
        raise PosvizError(f"{path}: transformers cannot read this config ({exc}).") from exc
    return (config if model_type in FAMILIES else config.get_text_config()), folder


def count_parameters(config) -> int:
    """Parameters the config describes, counted on the meta device: no memory, no download."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


class Engine:
    """The loaded weights of one published model, shared by its scaled variants (one lock: one pass at a time)."""

    def __init__(self, ref: str, folder: Path | None, config, device: torch.device, dtype: torch.dtype):
        self.ref, self.folder, self.config, self.device, self.dtype = ref, folder, config, device, dtype
        self.net = None
        self.lock = threading.RLock()

    @property
    def cache_argument(self) -> str:
        """What this transformers version calls the KV cache in ``forward``: ``cache`` from 5.24 on (where
        ``past_key_values`` is deprecated), ``past_key_values`` before."""
        import inspect

        if getattr(self, "_cache_argument", None) is None:
            self._cache_argument = ("cache" if "cache" in inspect.signature(self.load().forward).parameters
                                    else "past_key_values")
        return self._cache_argument

    def tokenizer_source(self) -> Path:
        """The folder transformers reads the tokenizer from (a hub model's: only its small files, fetched)."""
        return self.folder if self.folder is not None else Path(hub_file(self.ref, "tokenizer_config.json")).parent

    def load(self, progress=None):
        if self.net is not None:
            return self.net
        with self.lock:
            if self.net is None:
                self.net = self._load(progress)
        return self.net

    def _load(self, progress):
        from transformers import AutoModelForCausalLM

        source = self.folder
        if source is None:  # a hub id: refuse pickle-only weights before downloading any
            files = hub_listing(self.ref)
            if not any(f.endswith(".safetensors") for f in files):
                raise PosvizError(f"{self.ref} has no safetensors weights (only {', '.join(f for f in files if f.endswith(('.bin', '.pt', '.h5'))) or 'none'}): "
                                  "posviz loads safetensors only, never pickle. Choose another model.")
            source = self._download(progress)
        elif not any((source / f).is_file() for f in WEIGHT_FILES):
            pickled = [f for f in PICKLE_FILES if (source / f).is_file()]
            raise PosvizError(f"{source} has no safetensors weights ({', '.join(pickled) or 'no weights at all'}): "
                              "posviz loads safetensors only, never pickle. Convert it with transformers' "
                              "save_pretrained(safe_serialization=True).")
        try:
            net = AutoModelForCausalLM.from_pretrained(str(source), config=self.config, dtype=self.dtype,
                                                       use_safetensors=True, trust_remote_code=False,
                                                       attn_implementation="sdpa" if sdpa_ok(self.config) else "eager")
        except Exception as exc:
            raise PosvizError(f"{self.ref}: transformers cannot load its weights ({exc}).") from exc
        return net.to(self.device).eval()

    def _download(self, progress) -> Path:
        from huggingface_hub import snapshot_download

        tqdm_class = None
        if progress is not None:
            from tqdm.auto import tqdm

            class Reported(tqdm):  # the bytes downloaded so far, reported to the page's progress bar
                def update(self, n=1):
                    out = super().update(n)
                    if self.total:
                        progress(min(1.0, self.n / self.total))
                    return out
            tqdm_class = Reported
        try:
            return Path(snapshot_download(self.ref, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"],
                                          tqdm_class=tqdm_class))
        except Exception as exc:
            raise hub_error(self.ref, exc) from exc
