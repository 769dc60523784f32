"""A model a lab can run: the one interface every live lab talks to, and how a name becomes one.

The labs (Extrapolation, KV cache, Context extension, Far-context retrieval, Generation, Compare) never
ask which kind of model they run. They take a ``LabModel`` and use only what it answers here:

* who it is: ``name``, its position ``method``, its ``train_length`` in its own units (ids), its shape;
* text in its units, one way for every lab: ``tokenize(text)`` -> ``EncodedText`` (the ids *and* the bytes
  each id covers: one each for a byte model, a token's bytes for a tokenizer's), from which every lab
  counts lengths, caps, bits per byte and coloured text; ``encode`` / ``decode`` / ``bytes_per_id`` below
  it; ``id_axis`` (models on the same axis compare length for length) and ``vocab_size``;
* a forward pass, ``model(ids, positions=, cache=, attention_layer=, attention_head=)`` -> ``ModelOutput``
  (logits, and one layer's attention probabilities per head when asked), with a cache from ``new_cache``;
* what it cannot do, in words a page shows (``cannot_run``: a learned table past its rows;
  ``length_cap_reason``; ``context_known``: whether its trained context is stated or assumed);
* loading: ``needs_loading`` and ``load(progress)`` (a page shows a progress bar while weights arrive);
* what it stored when it was made: ``stored_metrics``, ``finetuned_from``;
* ``description``: what a model picker says after its name;
* ``length_cap`` on its device, ``position`` (the parameters the explore pages draw), ``device``, ``dtype``;
* ``key``: what the server's shared store keys a result on (identity, options and the weights' stamp).

``open_model(ref)`` resolves a name once (a shipped checkpoint's name or a folder) into a LabModel; the
same ref, options and weights give the same object, from a bounded LRU. Resolving is cheap: a kind reads
what it needs to describe the model, and loads weights on the first forward pass. A kind of model is one
class registered in ``MODEL_KINDS``; ``posviz.models.shipped`` is the shipped checkpoints' kind.

Shape legend as in ``byte_gpt.py``: B batch, T ids, H heads, V vocabulary.
"""
from __future__ import annotations

import hashlib
import importlib
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from posviz.errors import PosvizError
from posviz.limits import CACHE_ENTRIES, default_device, max_eval_length
from posviz.models.output import ModelOutput  # noqa: F401  (part of the interface: what a forward pass returns)


@dataclass(frozen=True)
class EncodedText:
    """A text in one model's ids, with the bytes of text each id covers: what every lab counts lengths in
    (ids), and what turns bits per id into bits per byte (a byte model: one byte per id)."""

    ids: torch.Tensor  # (T,) int64, on the CPU
    id_bytes: np.ndarray  # (T,) int64: bytes of text each id covers

    @property
    def n_ids(self) -> int:
        return int(self.ids.numel())

    @property
    def n_bytes(self) -> int:
        return int(self.id_bytes.sum())


_TOKENIZED_LOCK = threading.Lock()


class CheckedLength(int):
    """A length a lab checked once, where a request entered it (``LabModel.check_length``): past the length
    check, a plain ``int`` everywhere (arithmetic on it gives plain ints, which are checked again if asked)."""


class LabModel(ABC):
    """What every lab asks of a model (see the module docstring)."""

    name: str  # as the model picker lists it
    method: str  # position method, e.g. "rope", "alibi", "learned"
    train_length: int  # the context it was trained on, in its own ids
    n_layer: int
    n_head: int
    max_positions: int | None  # positions it can represent at all (None: any)
    is_absolute: bool  # positions are baked into the input or keys (a cache cannot relabel them)
    position_options: dict  # the method's options in effect (a RoPE scaling and its factor, ...)
    acts_on: str  # where positions enter: "input", "q/k", "logits", "weights" or "nothing"
    reads_content: bool = False  # what counts as far is computed from the text itself (FoX, CoPE, stick-breaking)
    key: tuple  # what a stored result depends on: identity, options and weights' stamp
    unit: str = "byte"  # what one id is, as pages say it: "byte" (our checkpoints) or "token" (a tokenizer's)
    vocab_size: int  # ids run 0..vocab_size - 1
    context_known: bool = True  # False: the trained context is assumed (its config states none)
    # the training-free RoPE remaps it can take (``positions.rope_remaps``): a checkpoint whose positions are RoPE's
    # rotation; none for a published model, which rotates inside transformers' own attention
    remaps: tuple = ()

    @property
    def id_axis(self) -> tuple:
        """What a length in this model's ids means. Models with the same axis compare length for length on one
        slider; models on different axes compare at the same multiple of each one's trained context."""
        return (self.unit, self.train_length)

    @property
    def description(self) -> str:
        """What a model picker adds after its name ("" for our checkpoints: their names say their method)."""
        return ""

    # -- text in the model's units ------------------------------------------------------------------
    @abstractmethod
    def encode(self, text: bytes) -> torch.Tensor:
        """(T,) int64 ids of ``text``, on the CPU."""

    @abstractmethod
    def decode(self, ids) -> bytes:
        """The bytes ``ids`` stand for."""

    @abstractmethod
    def bytes_per_id(self, ids) -> np.ndarray:
        """(T,) how many bytes of text each id covers (1 for a byte model)."""

    TOKENIZED_KEPT = 4  # texts whose encoding a model keeps: a page's text, and a few visitors' at once

    def tokenize(self, text: bytes) -> EncodedText:
        """``text`` in this model's ids with the bytes each covers: the one way a lab reads a text. Encoded once
        per text (the last few are kept), however many lengths, jobs and checks read it."""
        digest = hashlib.blake2b(text, digest_size=16).digest()
        kept = self.__dict__.setdefault("_tokenized", OrderedDict())
        with _TOKENIZED_LOCK:
            if digest in kept:
                kept.move_to_end(digest)
                return kept[digest]
        ids = self.encode(text)
        encoded = EncodedText(ids, np.asarray(self.bytes_per_id(ids), dtype=np.int64))
        with _TOKENIZED_LOCK:
            kept[digest] = encoded
            while len(kept) > self.TOKENIZED_KEPT:
                kept.popitem(last=False)
        return encoded

    def count_ids(self, text: bytes) -> int:
        """How many ids ``text`` is in this model's units."""
        return self.tokenize(text).n_ids

    def reads_alike(self, other: "LabModel", text: bytes) -> bool:
        """Whether ``other`` reads ``text`` as the same ids on the same axis, so that their losses and attention
        line up position by position."""
        return self.id_axis == other.id_axis and bool(np.array_equal(self.encode(text).numpy(),
                                                                     other.encode(text).numpy()))

    # -- running ------------------------------------------------------------------------------------
    @abstractmethod
    def __call__(self, ids: torch.Tensor, positions=None, cache=None, attention_layer: int | None = None,
                 attention_head: int | None = None):
        """The forward pass on ids (B, T): ``ModelOutput(logits (B, T, V), attention (B, H, T, Tk) or None)``."""

    @abstractmethod
    def load(self, progress=None) -> None:
        """Load the weights now (they load on the first forward pass anyway): a damaged file raises here.
        ``progress(fraction)`` hears how far a long load (a download) has come."""

    @property
    def needs_loading(self) -> bool:
        """Whether running it now would first wait on its weights long enough for a page to show a progress
        bar (a download, or gigabytes from disk); a shipped checkpoint loads in milliseconds: never."""
        return False

    @abstractmethod
    def new_cache(self, max_size: int | None = None, sinks: int = 0, for_maps: bool = False):
        """An empty KV cache for this model (keeping at most ``max_size`` positions, None: all; with ``sinks``,
        StreamingLLM's: the first ``sinks`` entries and the newest ``max_size - sinks``). ``for_maps``: a pass on it
        can return every layer's map of its queries (``attention_layer``), a recurrent layer's too (its keys kept)."""

    def shift_cache_front(self, cache, count: int, start: int) -> bool:
        """StreamingLLM's move without running the sinks again: turn the first ``count`` cached keys to the
        positions ``start``.. where the model's keys allow it (``PositionMethod.shift_cached_keys``) and say so;
        False (the default, and any model whose keys do not allow it): the caller runs the sink ids again."""
        return False

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @property
    @abstractmethod
    def position(self):
        """The position method's parameters, as the explore pages draw them."""

    @abstractmethod
    def is_shift_invariant(self) -> bool:
        """Whether scores depend on distances only, so a cached window equals re-encoding it."""

    @abstractmethod
    def with_position_options(self, overrides: Mapping) -> "LabModel":
        """The same weights with position options replaced, e.g. ``{"scaling": "yarn", "factor": 4}``."""

    def attention_all_layers(self, ids: torch.Tensor) -> torch.Tensor:
        """(L, H, T, T) float32: every layer's attention over ``ids`` (T,), in one call. By default one pass
        per layer (each computes the map of its own layer only); a model that can return every layer's map
        from one pass does so."""
        ids = self.ids_on_device(ids)
        return torch.stack([self(ids[None], attention_layer=layer).attention[0].float() for layer in range(self.n_layer)])

    def layer_kind(self, layer: int) -> str:
        """What mixes the bytes in ``layer``: "attention", or a recurrent layer's name, whose map is its implied
        matrix (signed, no softmax) rather than attention weights."""
        return "attention"

    def beside_kind(self, layer: int) -> str | None:
        """The kind of a second mixer that runs beside ``layer``'s attention on the same input, its output added
        (Falcon-H1's Mamba-2 in every layer); None where the layer has one mixer."""
        return None

    def beside_map(self, ids: torch.Tensor, layer: int) -> torch.Tensor:
        """(H, T, T): that mixer's implied matrix on ``ids`` (T,), drawn as a recurrent layer's map is."""
        raise PosvizError(f"layer {layer} has nothing beside its attention to draw")

    def cache_holds(self, layer: int) -> tuple[str, bool]:
        """What a KV cache keeps for ``layer``, in words, and whether that grows with the text: an attention layer's
        keys and values of every cached id do; a recurrent layer's state does not (a model with other layers says)."""
        if self.layer_kind(layer) == "attention":
            return f"keys and values of every cached {self.unit}", True
        return "a fixed-size state, the same at any length", False

    def cache_rows(self) -> list[dict]:
        """{layers, kind, holds, grows} per run of adjacent layers of one kind: what the KV cache lab tabulates."""
        rows: list[dict] = []
        for layer in range(self.n_layer):
            kind, (holds, grows) = self.layer_kind(layer), self.cache_holds(layer)
            if rows and rows[-1]["kind"] == kind and rows[-1]["layers"][-1] == layer - 1:
                rows[-1]["layers"].append(layer)
            else:
                rows.append({"layers": [layer], "kind": kind, "holds": holds, "grows": grows})
        return rows

    @abstractmethod
    def layer_layout(self) -> list[dict]:
        """What each layer does with positions: rows {layer, position, base, rotary share, window, sinks, options}
        (``positions.layers.layer_rows``; a published model's from its config alone)."""

    @abstractmethod
    def frequencies(self, seq_len: int):
        """(inv_freq, attention_factor) of a rotary model at ``seq_len``; None for other methods."""

    # -- what it can do -----------------------------------------------------------------------------
    def cannot_run(self, n_positions: int) -> str | None:
        """Why ``n_positions`` positions are out of this model's reach, in a page's words; None if they are not."""
        if self.max_positions is not None and n_positions > self.max_positions:
            return (f"{self.name} cannot run {n_positions:,} positions: its {self.method} table has "
                    f"{self.max_positions:,} rows (positions 0–{self.max_positions - 1:,}).")
        return None

    @property
    def length_cap(self) -> int:
        """Longest live evaluation length on its device (16 x train_length on a CPU)."""
        return max_eval_length(self.train_length, self.device)

    @property
    def length_cap_reason(self) -> str:
        """Why the cap is where it is, in a page's words."""
        return f"{self.length_cap // self.train_length} × its trained context on this device"

    def check_length(self, length: int, n_ids: int | None = None) -> "CheckedLength":
        """Reject lengths a lab will not run: too short, past the device cap, or longer than the text; return
        the length as a ``CheckedLength``, which the lab's inner steps (and the scorer) take as checked.

        A lab checks a request's length once, where the request enters it, and hands the ``CheckedLength`` on:
        ``checked`` below lets every inner function accept either a plain length (a caller of its own, checked
        here) or one already checked (passed through). A length the *method* cannot represent (learned past
        its table) is not rejected here: the forward pass raises its own PositionLimitError, which the labs
        show as it is.
        """
        cap = self.length_cap
        if not isinstance(length, (int, np.integer)) or length < 2:
            raise PosvizError(f"The evaluation length must be a whole number of at least 2 {self.unit}s, got {length!r}.")
        if length > cap:
            raise PosvizError(f"The evaluation length {length:,} is past this device's cap of {cap:,} {self.unit}s "
                              f"({cap // self.train_length} × the training length). Choose a shorter length.")
        if n_ids is not None and length + 1 > n_ids:
            raise PosvizError(f"The evaluation length {length:,} needs {length + 1:,} {self.unit}s of text, but the text has "
                              f"{n_ids:,} {self.unit}s. Choose a shorter length or a longer text.")
        return CheckedLength(length)

    def checked(self, length: int, n_ids: int | None = None) -> "CheckedLength":
        """``length`` as it came when a caller already checked it, else ``check_length``."""
        return length if isinstance(length, CheckedLength) else self.check_length(length, n_ids)

    def ids_on_device(self, ids) -> torch.Tensor:
        """(T,) ids, already encoded, on the model's device."""
        return torch.as_tensor(ids, dtype=torch.long).flatten().to(self.device)

    # -- what it stored when it was made (shipped checkpoints: metrics.json) -------------------------
    def stored_metrics(self) -> dict:
        """The evaluation stored with the model ({} when none)."""
        return {}

    def stored_seeds(self) -> list[dict]:
        """Other training seeds of the recipe that made it, as scores ({seed, eval: {...}} each, metrics.json's keys;
        posviz.training.seeds); [] when none was trained."""
        return []

    def finetuned_from(self) -> dict | None:
        """{checkpoint, train_length, tokens, position_options} when fine-tuned from another model."""
        return None


# ---------------------------------------------------------------------------------------------------
# Resolving a ref into a LabModel: the kinds, and a bounded cache of the models resolved
# ---------------------------------------------------------------------------------------------------
# A kind of model: does this ref name one of mine; the key of what it names now (cheap: no weights read,
# the weights' stamp included); build it (weights load on its first forward pass).
class ModelKind(ABC):
    @abstractmethod
    def recognises(self, ref: str) -> bool: ...

    @abstractmethod
    def identify(self, ref: str, position_overrides: Mapping) -> tuple: ...

    @abstractmethod
    def build(self, ref: str, position_overrides: Mapping, device: torch.device, key: tuple) -> LabModel: ...


MODEL_KINDS: dict[str, ModelKind] = {}  # filled by the modules below as they are imported

# The modules that register a kind, in the order refs are tried, imported by name when a ref is first
# resolved: the kinds depend on this interface, never the other way round, and the published models'
# kind (transformers is seconds to import) loads only when a ref is no shipped checkpoint.
KIND_MODULES = ("posviz.models.shipped", "posviz.models.hf.kinds")

_OPEN: OrderedDict[tuple, LabModel] = OrderedDict()
_OPEN_LOCK = threading.Lock()


def _kind_of(ref: str) -> ModelKind:
    for module in KIND_MODULES:
        importlib.import_module(module)  # registers its kind (once: Python keeps imported modules)
        for kind in MODEL_KINDS.values():
            if kind.recognises(ref):
                return kind
    raise PosvizError(f"No model called {ref!r}: give a shipped checkpoint's name, a checkpoint folder, a folder "
                      "holding a transformers model, or a Hugging Face hub id (owner/name).")


def open_model(ref: str | Path, position_overrides: Mapping | None = None,
               device: str | torch.device | None = None) -> LabModel:
    """The model ``ref`` names (a shipped checkpoint or a folder), with ``position_overrides`` applied.

    The same ref, overrides, device and weights give the same object (at most ``CACHE_ENTRIES`` are
    kept, least recently used dropped first), so a model's weights load once per server. Callers must
    not modify the model.
    """
    ref, overrides = str(ref), dict(position_overrides or {})
    device = torch.device(device) if device is not None else default_device()
    kind = _kind_of(ref)
    key = kind.identify(ref, overrides)
    with _OPEN_LOCK:
        if (key, str(device)) in _OPEN:
            _OPEN.move_to_end((key, str(device)))
            return _OPEN[(key, str(device))]
    model = kind.build(ref, overrides, device, key)
    with _OPEN_LOCK:
        model = _OPEN.setdefault((key, str(device)), model)  # another thread may have built it meanwhile
        _OPEN.move_to_end((key, str(device)))
        while len(_OPEN) > CACHE_ENTRIES:
            _OPEN.popitem(last=False)
    return model


def opened_models() -> list[tuple]:
    with _OPEN_LOCK:
        return list(_OPEN)


def forget_models() -> None:
    with _OPEN_LOCK:
        _OPEN.clear()
