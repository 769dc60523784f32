"""Published language models (GPT-2, OPT, Pythia, SmolLM2, Qwen2.5, BLOOM, Falcon, MPT) as models a lab can run.

A published model is a causal language model in ``transformers`` whose position method posviz
recognises (``FAMILIES``), from a local folder or a Hugging Face hub id. Its numbers are transformers'
numbers: the labs run the model's own forward pass, with its own tokenizer and its own KV cache
(``DynamicCache``); nothing of GPT-2, Llama or BLOOM is re-implemented here. What posviz adds is what a
lab asks of every model (``posviz.lab_model.LabModel``):

* ids are the tokenizer's, and ``bytes_per_id`` says how many bytes of text each covers, so bits per
  byte compare with the byte-level checkpoints;
* attention probabilities come from eager attention, switched on for the one forward pass that asks
  for a map (and captured at the one layer asked for); otherwise the fastest implementation runs;
* a RoPE model's context extension is set through transformers' ``rope_parameters``, keeping its θ;
  the scaled variants share the loaded weights and differ only in their rotary module;
* what it cannot run is said in words: a learned table past its rows, MPT past ``max_seq_len``.

Safe on a public demo: safetensors only (a pickle-only model is refused), never ``trust_remote_code``,
a parameter cap (``POSVIZ_MAX_PARAMS``) checked from the config before any weight is downloaded, a
memory estimate before a long window or an attention map, and a clear error when the hub cannot be
reached or a model is gated. Nothing is downloaded unless a published model is asked for.

Shape legend as in ``model.py``: B batch, T new ids, Tk keys, H heads, V vocabulary.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

from .errors import PosvizError, PositionLimitError
from .lab_model import MODEL_KINDS, LabModel, ModelKind, open_model
from .limits import MAX_LENGTH_MULTIPLE_CPU, MAX_LENGTH_MULTIPLE_GPU
from .model import ModelOutput

# Resolved once, at this module's import (which Python serialises): transformers' lazy attributes,
# first touched by two threads at once (the server's warm-up and a visitor), raised "cannot import name
# 'AutoConfig'" in one of them.
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402,F401

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
DEFAULT_MAX_PARAMS = 2_000_000_000  # Falcon-RW-1B (1.3 B) fits; a 7 B model does not, on a shared demo
# Work one forward pass may take (multiply-adds x 2) on a CPU: ~20 s for GPT-2 small on 2 cores. It caps
# a published model's length on a CPU below 16 x its context (GPT-2 small: 8,192 tokens, not 16,384).
CPU_FLOP_BUDGET = 2e12
GPU_FLOP_BUDGET = 5e14
DEFAULT_MAX_WORK_BYTES = 6 * 2**30  # a forward pass's biggest temporaries (attention maps, ALiBi biases)


def forward_flops(tokens: int, n_params: int, n_layer: int, hidden: int) -> float:
    """Floating-point operations of one causal forward pass: 2 per weight per token, plus attention's
    q.k and weighted sum over half a T x T square per layer (2 x 2 x hidden per query-key pair)."""
    return 2 * n_params * tokens + 2 * n_layer * hidden * tokens * tokens


def tokens_within(budget: float, n_params: int, n_layer: int, hidden: int) -> int:
    """The longest pass whose ``forward_flops`` fit in ``budget`` (the positive root of the quadratic)."""
    a, b = 2 * n_layer * hidden, 2 * n_params
    return int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a))


def max_params() -> int:
    return int(float(os.environ.get("POSVIZ_MAX_PARAMS") or DEFAULT_MAX_PARAMS))


def max_work_bytes() -> int:
    return int(float(os.environ.get("POSVIZ_MAX_WORK_BYTES") or DEFAULT_MAX_WORK_BYTES))


def deployer_models() -> list[str]:
    """$POSVIZ_MODELS: the published models (hub ids or folders) a deployer lists in the model picker."""
    return [ref.strip() for ref in os.environ.get("POSVIZ_MODELS", "").split(",") if ref.strip()]


def any_model_allowed() -> bool:
    """$POSVIZ_ALLOW_ANY_MODEL=1: a visitor may type a hub id the deployer did not list."""
    return os.environ.get("POSVIZ_ALLOW_ANY_MODEL", "") in ("1", "true", "yes")


# ---------------------------------------------------------------------------------------------------
# Families: how posviz reads each architecture's position method from its config
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One transformers architecture: its position method and where its config keeps the facts."""

    method: Callable[[object], str]  # config -> "learned", "rope" or "alibi"
    context: Callable[[object], int | None]  # the trained context, in ids (None: not in the config)
    table_rows: Callable[[object], int | None] = lambda config: None  # positions it can represent at all
    table_name: str | None = None  # learned: the parameter holding the table
    table_offset: int = 0  # learned: rows before position 0 (OPT keeps 2)


def _attr(*names):
    return lambda config: next((int(getattr(config, n)) for n in names if getattr(config, n, None)), None)


FAMILIES: dict[str, Family] = {
    "gpt2": Family(lambda c: "learned", _attr("n_positions"), _attr("n_positions"), "transformer.wpe.weight"),
    "opt": Family(lambda c: "learned", _attr("max_position_embeddings"), _attr("max_position_embeddings"),
                  "model.decoder.embed_positions.weight", 2),
    "gpt_neox": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "llama": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "qwen2": Family(lambda c: "rope", _attr("max_position_embeddings")),
    "mistral": Family(lambda c: "rope", _attr("max_position_embeddings")),
    # BLOOM's config has no field for its context; bigscience's configs state it as seq_length (2,048)
    "bloom": Family(lambda c: "alibi", _attr("seq_length")),
    "falcon": Family(lambda c: "alibi" if c.alibi else "rope", _attr("max_position_embeddings")),
    "mpt": Family(lambda c: "alibi", _attr("max_seq_len"), _attr("max_seq_len")),
}
ACTS_ON = {"learned": "input", "rope": "q/k", "alibi": "logits"}


UNSTATED_CONTEXT = 2048  # the context of a model that states none anywhere (BLOOM's and Falcon-RW's)


def _stated_elsewhere(folder: Path | None) -> int | None:
    """A context the config leaves out, from the files beside it: posviz's export note, or the tokenizer's
    model_max_length (where it is a real length, not transformers' 1e30 for "none")."""
    if folder is None:
        return None
    for name, key in (("posviz_export.json", "train_length"), ("tokenizer_config.json", "model_max_length")):
        try:
            value = json.loads((folder / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and 1 < value < 10**7:
            return value
    return None


def supported_families() -> str:
    return ", ".join(sorted(FAMILIES))


# ---------------------------------------------------------------------------------------------------
# Where a ref's files are: a local folder, or the hub (fetched only when asked for)
# ---------------------------------------------------------------------------------------------------
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$")


def is_transformers_folder(path: Path) -> bool:
    """A folder whose config.json is a transformers config (it names a ``model_type``)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config


def _hub_error(ref: str, exc: Exception) -> PosvizError:
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
        raise _hub_error(ref, exc) from exc


def hub_listing(ref: str) -> list[str]:
    from huggingface_hub import list_repo_files

    if os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true"):
        raise _hub_error(ref, OSError("offline"))
    try:
        return list(list_repo_files(ref))
    except Exception as exc:
        raise _hub_error(ref, exc) from exc


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
    if model_type not in FAMILIES:
        raise PosvizError(f"{ref} is a {model_type!r} model, whose position method posviz does not read. "
                          f"Supported families: {supported_families()}.")
    try:
        config = AutoConfig.from_pretrained(str(Path(path).parent), trust_remote_code=False)
    except Exception as exc:
        raise PosvizError(f"{path}: transformers cannot read this config ({exc}).") from exc
    return config, folder


def count_parameters(config) -> int:
    """Parameters the config describes, counted on the meta device: no memory, no download."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------
# Text: the tokenizer's ids, and the bytes each covers
# ---------------------------------------------------------------------------------------------------
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves, the other
    68 are moved to code points from 256 up (the scheme of byte-level BPE, Radford et al. 2019)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenizerText:
    """encode / decode / bytes per id of a transformers tokenizer, exact for byte-level BPE tokenizers."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        backend = json.loads(tokenizer.backend_tokenizer.to_str()) if hasattr(tokenizer, "backend_tokenizer") else {}
        decoder = (backend.get("decoder") or {}).get("type")
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = set(tokenizer.all_special_ids)
        if decoder == "ByteLevel":  # every token is a string over the byte alphabet: its bytes exactly
            alphabet = _byte_level_alphabet()
            self.pieces = [b"" if i in special or tok is None else bytes(alphabet.get(ch, 63) for ch in tok)
                           for i, tok in enumerate(vocab)]
            self.exact = True
        else:  # other tokenizers: what each id decodes to on its own (a split character may be off)
            self.pieces = [b"" if i in special else tokenizer.decode([i]).encode("utf-8") for i in range(len(vocab))]
            self.exact = False
        self.sizes = np.array([len(p) for p in self.pieces], dtype=np.int64)

    def encode(self, text: bytes) -> torch.Tensor:
        string = text.decode("utf-8", errors="replace")
        ids = self.tokenizer(string, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids) -> bytes:
        ids = torch.as_tensor(ids).flatten().tolist()
        if self.exact:
            return b"".join(self.pieces[i] for i in ids)
        return self.tokenizer.decode(ids).encode("utf-8")

    def bytes_per_id(self, ids) -> np.ndarray:
        return self.sizes[torch.as_tensor(ids).flatten().cpu().numpy()]

    def round_trips(self, text: bytes) -> bool:
        return self.decode(self.encode(text)) == text


# ---------------------------------------------------------------------------------------------------
# The cache: transformers' own DynamicCache, with what the labs read of a cache
# ---------------------------------------------------------------------------------------------------
@dataclass
class PublishedCache:
    """A ``DynamicCache`` plus the positions of its keys, kept to at most ``max_size`` (a sliding window).

    The labs relabel ``positions`` (the shifted-cache strategy) and read ``len``; the keys keep whatever
    the model baked into them when they were computed, as in transformers.
    """

    max_size: int | None = None
    positions: torch.Tensor | None = None  # (Tk,)
    hf: object = field(default=None, repr=False)

    def __post_init__(self):
        from transformers import DynamicCache

        if self.max_size is not None and not (isinstance(self.max_size, int) and self.max_size >= 1):
            raise PosvizError(f"KV cache max_size must be a positive integer or None, got {self.max_size!r}")
        self.hf = DynamicCache()

    def __len__(self) -> int:
        return 0 if self.positions is None else int(self.positions.numel())

    def next_position(self) -> int:
        return 0 if self.positions is None or not len(self) else int(self.positions[-1]) + 1

    def keep_last(self, n: int) -> None:
        """Drop all but the newest ``n`` entries of every layer."""
        if len(self) <= n:
            return
        if n == 0:
            self.__post_init__()
            self.positions = None
            return
        for layer in self.hf.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[..., -n:, :], layer.values[..., -n:, :]
        self.positions = self.positions[-n:]


# ---------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------
SCALING_TO_ROPE_TYPE = {"linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3"}


def rope_parameters_for(own: Mapping, rotary_dims: int, train_length: int, overrides: Mapping) -> dict:
    """transformers' ``rope_parameters`` for posviz's scaling options (``{"scaling": "yarn", "factor": 4}``),
    keeping the model's own θ. "none" keeps the model's own parameters; "ntk" (static NTK-aware) is the
    default rotation with θ raised to θ s^(d/(d-2)), as transformers has no name for it."""
    scaling, factor = overrides.get("scaling", "none"), float(overrides.get("factor", 1.0))
    theta = float(own.get("rope_theta", 10000.0))
    kept = {k: own[k] for k in ("partial_rotary_factor",) if k in own}
    if scaling == "none" or (factor == 1.0 and scaling != "none"):
        return dict(own) if scaling == "none" else {"rope_type": "default", "rope_theta": theta, **kept}
    if scaling == "ntk":
        return {"rope_type": "default", "rope_theta": theta * factor ** (rotary_dims / (rotary_dims - 2)), **kept}
    if scaling not in SCALING_TO_ROPE_TYPE:
        raise PosvizError(f"Unknown RoPE scaling {scaling!r} for a published model. Known scalings: none, ntk, "
                          f"{', '.join(SCALING_TO_ROPE_TYPE)}.")
    params = {"rope_type": SCALING_TO_ROPE_TYPE[scaling], "rope_theta": theta, "factor": factor, **kept}
    if scaling in ("yarn", "llama3", "dynamic"):
        params["original_max_position_embeddings"] = int(overrides.get("original_length") or train_length)
    for ours, theirs in (("beta_fast", "beta_fast"), ("beta_slow", "beta_slow"), ("attention_factor", "attention_factor"),
                         ("low_freq_factor", "low_freq_factor"), ("high_freq_factor", "high_freq_factor")):
        if overrides.get(ours) is not None:
            params[theirs] = float(overrides[ours])
    if scaling == "llama3":
        params.setdefault("low_freq_factor", 1.0)
        params.setdefault("high_freq_factor", 4.0)
    return params


@dataclass
class PublishedPositions:
    """A published model's position parameters as the explore pages draw them, read from the model itself."""

    method: str
    family: str
    table: torch.Tensor | None = None  # learned: (rows, C), position 0 first
    inv_freq: torch.Tensor | None = None  # rope: (rotary_dims / 2,) from the model's rotary module
    attention_factor: float = 1.0
    rotary_dims: int | None = None
    head_dim: int | None = None
    slopes: torch.Tensor | None = None  # alibi: (H,) the bias per unit of distance, as the model adds it
    notes: list[str] = field(default_factory=list)  # where the model computes something else than its paper


class _Engine:
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
                                                       attn_implementation="sdpa" if _sdpa_ok(self.config) else "eager")
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
            raise _hub_error(self.ref, exc) from exc


# Families whose eager attention (the one that returns probabilities) computes something else than their
# default: transformers 5.x Falcon with ALiBi adds the bias twice in eager attention (once in its mask, once
# in the scores), measured as a 4e-2 logit difference on a tiny model. Their maps come from eager attention,
# their scores from the default pass.
EAGER_DIFFERS = {"falcon"}


def _sdpa_ok(config) -> bool:
    return config.model_type not in ("bloom", "mpt")  # these two run eager attention only


def _modeling_module(config):
    return importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")


def _decoder_layers(net) -> torch.nn.ModuleList:
    n = net.config.num_hidden_layers
    for module in net.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise PosvizError(f"cannot find the {n} decoder layers of {type(net).__name__}")


def _attention_module(layer) -> torch.nn.Module:
    for name in ("self_attn", "attn", "attention", "self_attention"):
        if isinstance(getattr(layer, name, None), torch.nn.Module):
            return getattr(layer, name)
    raise PosvizError(f"cannot find the attention of {type(layer).__name__}")


class PublishedModel(LabModel):
    """A published causal LM (see the module docstring)."""

    unit = "token"

    def __init__(self, ref: str, config, folder: Path | None, overrides: Mapping, device: torch.device, key: tuple,
                 engine: _Engine | None = None):
        self.ref, self.key, self._device, self._overrides = ref, key, device, dict(overrides)
        family = FAMILIES[config.model_type]
        self.family_name, self._family = config.model_type, family
        self.method = family.method(config)
        self.name = folder.name if folder is not None else ref
        context = family.context(config) if family.context(config) is not None else _stated_elsewhere(folder)
        self.context_known = context is not None
        self.train_length = int(context or UNSTATED_CONTEXT)
        self.n_layer, self.n_head = int(config.num_hidden_layers), int(config.num_attention_heads)
        self.max_positions = family.table_rows(config)
        self.acts_on = ACTS_ON[self.method]
        self.is_absolute = self.method == "learned"
        self.n_params = count_parameters(config)
        if self.n_params > max_params():
            raise PosvizError(f"{ref} has {self.n_params / 1e9:.2f} B parameters, over this server's cap of "
                              f"{max_params() / 1e9:.2f} B (POSVIZ_MAX_PARAMS). Choose a smaller model.")
        base_rope = dict(getattr(config, "rope_parameters", None) or {}) if self.method == "rope" else {}
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.n_head)
        self.hidden = int(config.hidden_size)
        self.rotary_dims = (int(self.head_dim * float(base_rope.get("partial_rotary_factor", 1.0))) // 2 * 2
                            if self.method == "rope" else None)
        if self._overrides and self.method != "rope":
            raise PosvizError(f"{self.name} uses {self.method} positions: RoPE scalings apply to rotary models only.")
        self.rope_parameters = (rope_parameters_for(base_rope, self.rotary_dims, self.train_length, self._overrides)
                                if self.method == "rope" else None)
        self.position_options = dict(self._overrides) if self._overrides else (
            {"scaling": "none", "rope_type": base_rope.get("rope_type", "default"),
             "base": float(base_rope.get("rope_theta", 10000.0))} if self.method == "rope" else {})
        self.config = config
        dtype = getattr(config, "dtype", None) or torch.float32
        self._dtype = dtype if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) else torch.float32
        self._engine = engine or _Engine(ref, folder, config, device, self._dtype)
        self._rotary = None  # this variant's rotary module (a scaled copy), made on first use
        self._text: TokenizerText | None = None
        self.folder = folder

    # -- text ---------------------------------------------------------------------------------------
    @property
    def text(self) -> TokenizerText:
        if self._text is None:
            from transformers import AutoTokenizer

            source = self.folder if self.folder is not None else Path(hub_file(self.ref, "tokenizer_config.json")).parent
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(source), trust_remote_code=False)
            except Exception as exc:
                raise PosvizError(f"{self.name}: its tokenizer cannot be loaded ({exc}).") from exc
            self._text = TokenizerText(tokenizer)
        return self._text

    def encode(self, text: bytes) -> torch.Tensor:
        return self.text.encode(text)

    def decode(self, ids) -> bytes:
        return self.text.decode(ids)

    def bytes_per_id(self, ids) -> np.ndarray:
        return self.text.bytes_per_id(ids)

    # -- running ------------------------------------------------------------------------------------
    @property
    def net(self):
        return self._engine.load()

    def load(self, progress=None) -> None:
        self._engine.load(progress)

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory (a page shows a progress bar while they load)."""
        return self._engine.net is not None

    def new_cache(self, max_size: int | None = None) -> PublishedCache:
        return PublishedCache(max_size=max_size)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def is_shift_invariant(self) -> bool:
        return self.method != "learned" and (self.rope_parameters or {}).get("rope_type") != "dynamic"

    def with_position_options(self, overrides: Mapping) -> LabModel:
        return open_model(self.ref, {**self._overrides, **dict(overrides)}, self._device)

    def work_bytes(self, n_keys: int, n_queries: int | None = None, attention_map: bool = False) -> int:
        """The biggest temporaries of one forward pass over ``n_keys`` positions: an ALiBi bias and eager
        attention's scores are (B, H, T, Tk) floats; sdpa's fused kernels keep none."""
        n_queries = n_keys if n_queries is None else n_queries
        per_map = self.n_head * n_queries * n_keys * 4
        if attention_map or not _sdpa_ok(self.config):
            return 3 * per_map  # scores, probabilities, and the mask or bias
        return per_map if self.method == "alibi" else 0

    def _check_work(self, n_keys: int, n_queries: int, attention_map: bool) -> None:
        need = self.work_bytes(n_keys, n_queries, attention_map)
        if need > max_work_bytes():
            raise PosvizError(f"{self.name} at {n_keys:,} tokens would need about {need / 2**30:.1f} GiB for "
                              f"{'an attention map' if attention_map else 'its attention biases'}, over this server's "
                              f"{max_work_bytes() / 2**30:.1f} GiB (POSVIZ_MAX_WORK_BYTES). Choose a shorter length.")

    @property
    def length_cap(self) -> int:
        """16 x the context on a CPU (32 on a GPU), and at most what one pass may cost in time."""
        multiple = MAX_LENGTH_MULTIPLE_GPU if self._device.type == "cuda" else MAX_LENGTH_MULTIPLE_CPU
        budget = GPU_FLOP_BUDGET if self._device.type == "cuda" else CPU_FLOP_BUDGET
        return max(min(multiple * self.train_length, tokens_within(budget, self.n_params, self.n_layer, self.hidden)),
                   min(self.train_length, 64))

    @property
    def length_cap_reason(self) -> str:
        multiple = MAX_LENGTH_MULTIPLE_GPU if self._device.type == "cuda" else MAX_LENGTH_MULTIPLE_CPU
        if self.length_cap < multiple * self.train_length:
            flops = forward_flops(self.length_cap, self.n_params, self.n_layer, self.hidden)
            return (f"time: one pass over {self.length_cap:,} tokens of a {self.n_params / 1e6:.0f} M-parameter model "
                    f"is about {flops / 1e12:.0f} TFLOP on this {self._device.type}")
        return f"{multiple} × its trained context on this {self._device.type}"

    def cannot_run(self, n_positions: int) -> str | None:
        if self.max_positions is not None and n_positions > self.max_positions:
            what = "max_seq_len" if self.family_name == "mpt" else f"{self.method} table"
            return (f"{self.name} cannot run {n_positions:,} positions: its {what} holds "
                    f"{self.max_positions:,} (positions 0–{self.max_positions - 1:,}).")
        return None

    @contextlib.contextmanager
    def _variant(self, eager: bool):
        """This variant's rotary module and attention implementation, in place for one forward pass."""
        net, swapped = self.net, None
        before = net.config._attn_implementation
        if self.method == "rope" and self._overrides:
            parent = next(m for m in net.modules() if isinstance(getattr(m, "rotary_emb", None), torch.nn.Module))
            swapped = (parent, parent.rotary_emb)
            parent.rotary_emb = self._rotary_module()
        if eager:
            net.config._attn_implementation_internal = "eager"
        try:
            yield net
        finally:
            net.config._attn_implementation_internal = before
            if swapped is not None:
                swapped[0].rotary_emb = swapped[1]

    def _rotary_module(self) -> torch.nn.Module:
        if self._rotary is None:
            self._rotary = self._new_rotary(self._device)
        return self._rotary

    def _new_rotary(self, device) -> torch.nn.Module:
        config = self.config.__class__.from_dict({**self.config.to_dict(), "rope_parameters": self.rope_parameters})
        cls = next(v for k, v in vars(_modeling_module(self.config)).items() if k.endswith("RotaryEmbedding")
                   and isinstance(v, type))
        return cls(config=config).to(device)

    @torch.inference_mode()
    def __call__(self, ids, positions=None, cache: PublishedCache | None = None, attention_layer=None,
                 attention_head=None) -> ModelOutput:
        ids = torch.as_tensor(ids, device=self._device)
        B, T = ids.shape
        start = cache.next_position() if cache is not None else 0
        if positions is None:
            pos = torch.arange(start, start + T, device=self._device)
        elif isinstance(positions, int):
            pos = torch.arange(positions, positions + T, device=self._device)
        else:
            pos = torch.as_tensor(positions, device=self._device).flatten()
        if cache is not None and cache.max_size is not None and T <= cache.max_size:
            cache.keep_last(cache.max_size - T)  # each query sees the max_size keys ending at itself, itself included
        held = len(cache) if cache is not None else 0
        if cache is not None and cache.max_size is not None and T > 1 and held + T > cache.max_size:
            # a chunk into a full window: each query must see only the window ending at itself
            outs = [self(ids[:, i:i + 1], positions=pos[i:i + 1], cache=cache, attention_layer=attention_layer,
                         attention_head=attention_head) for i in range(T)]
            return ModelOutput(torch.cat([o.logits for o in outs], 1), None)
        reach = int(pos.max()) + 1 if self.method == "learned" else held + T
        problem = self.cannot_run(reach)
        if problem:
            raise PositionLimitError(problem)
        self._check_work(held + T, T, attention_layer is not None)
        # Without a cache of ours the call is the bare one, the model's own use_cache default included: BLOOM's
        # pass without a cache took a slower mask path (1.2x its default at 2,048 tokens)
        kwargs = {"input_ids": ids}
        if self.method != "alibi":  # ALiBi families place keys by the attention mask, not by position ids
            kwargs["position_ids"] = pos[None].expand(B, T)
        if cache is not None:
            kwargs[self._engine.cache_argument] = cache.hf
            kwargs["attention_mask"] = torch.ones(B, held + T, dtype=torch.long, device=self._device)
            kwargs["cache_position"] = torch.arange(held, held + T, device=self._device)
        captured = {}
        with self._engine.lock, self._variant(attention_layer is not None) as net:
            hook = None
            if attention_layer is not None:
                if not 0 <= attention_layer < self.n_layer:
                    raise PosvizError(f"layer must be in 0..{self.n_layer - 1}, got {attention_layer}")
                module = _attention_module(_decoder_layers(net)[attention_layer])
                def keep_probs(module, args, out):  # returns None: the layer's output passes on unchanged
                    captured["probs"] = out[1]

                hook = module.register_forward_hook(keep_probs)
            try:
                logits = net(**kwargs).logits
            finally:
                if hook is not None:
                    hook.remove()
        if attention_layer is not None and cache is None and self.family_name in EAGER_DIFFERS:
            # the map is eager attention's; the scores come from the implementation the model runs by default
            logits = self(ids, positions=pos).logits
        if cache is not None:
            cache.positions = pos if cache.positions is None else torch.cat((cache.positions, pos))
            if cache.max_size is not None:
                cache.keep_last(cache.max_size)
        probs = captured.get("probs")
        if probs is not None:
            probs = probs.float()
            if attention_head is not None:
                probs = probs[:, attention_head]
        return ModelOutput(logits, probs)

    # -- positions, as the explore pages draw them ----------------------------------------------------
    def frequencies(self, seq_len: int):
        """(inv_freq, attention_factor) from transformers' own rotary module for this variant; None unless RoPE."""
        if self.method != "rope":
            return None
        rotary = self._new_rotary(torch.device("cpu"))
        if self.rope_parameters.get("rope_type") == "dynamic":  # its speeds follow the longest position seen
            rotary(torch.zeros(1, dtype=torch.float32), torch.arange(seq_len)[None])
        return rotary.inv_freq.detach().double().cpu(), float(rotary.attention_scaling)

    @property
    def position(self) -> PublishedPositions:
        out = PublishedPositions(self.method, self.family_name, head_dim=self.head_dim, rotary_dims=self.rotary_dims)
        if self.method == "learned":
            table = dict(self.net.named_parameters())[self._family.table_name].detach().float().cpu()
            out.table = table[self._family.table_offset:]
            if self._family.table_offset:
                out.notes.append(f"{self.family_name} keeps {self._family.table_offset} rows before position 0 "
                                 f"(its table has {table.shape[0]:,} rows for {table.shape[0] - self._family.table_offset:,} positions).")
        elif self.method == "rope":
            out.inv_freq, out.attention_factor = self.frequencies(self.train_length)
            if self.rotary_dims < self.head_dim:
                out.notes.append(f"Only {self.rotary_dims} of each head's {self.head_dim} dimensions rotate "
                                 f"({self.rotary_dims / self.head_dim:.0%}); the rest carry no position.")
        else:
            out.slopes, notes = alibi_slopes_as_added(self.config, self.n_head)
            out.notes.extend(notes)
        return out

    def stored_metrics(self) -> dict:
        return {}


def alibi_slopes_as_added(config, n_head: int) -> tuple[torch.Tensor, list[str]]:
    """(H,) the bias per unit of distance the model adds to its attention logits (after the 1/sqrt(d)
    scaling), from the family's own bias builder; and what differs from the ALiBi paper."""
    module, notes = _modeling_module(config), []
    n = 8
    if config.model_type == "mpt":
        bias = module.build_mpt_alibi_tensor(n_head, n, alibi_bias_max=config.attn_config.alibi_bias_max)  # (H, 1, n)
        slopes = (bias[:, 0, -1] - bias[:, 0, -2]).float()
    else:
        mask = torch.ones(1, n, dtype=torch.long)
        bias = module.build_alibi_tensor(mask, n_head, torch.float32).reshape(n_head, n)
        slopes = (bias[:, 1] - bias[:, 0]).float()
        if config.model_type == "falcon":
            head_dim = config.hidden_size // n_head
            slopes = slopes / math.sqrt(head_dim)
            notes.append(f"Falcon divides its ALiBi bias by √(head dim) = √{head_dim} along with q·k, so its slopes "
                         f"are the paper's / {math.sqrt(head_dim):.2f}, and it builds the bias in bfloat16.")
            notes.append("Falcon's eager attention, the one that returns attention maps, adds this bias twice "
                         "(transformers 5.x): its maps are sharper than what its default attention computes.")
    return slopes, notes


# ---------------------------------------------------------------------------------------------------
# The kind: refs of published models
# ---------------------------------------------------------------------------------------------------
def _folder_stamp(folder: Path) -> tuple[int, ...]:
    return tuple((folder / f).stat().st_mtime_ns if (folder / f).is_file() else 0
                 for f in ("config.json", *WEIGHT_FILES, "tokenizer.json"))


class TransformersKind(ModelKind):
    """A folder holding a transformers model, or a hub id (``owner/name``)."""

    def recognises(self, ref: str) -> bool:
        path = Path(ref)
        if path.is_dir():
            return is_transformers_folder(path)
        return bool(HUB_ID.match(ref)) and "/" in ref

    def identify(self, ref: str, position_overrides: Mapping) -> tuple:
        path = Path(ref)
        where = (str(path.resolve()),) + _folder_stamp(path.resolve()) if path.is_dir() else (ref,)
        return ("transformers",) + where + (tuple(sorted(position_overrides.items())),)

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


MODEL_KINDS["transformers"] = TransformersKind()
