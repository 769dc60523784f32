"""GGUF model files (the format llama.cpp, Ollama and LM Studio keep models in) as published models.

A GGUF file opens through transformers' own GGUF loader (``from_pretrained(folder, gguf_file=...)``),
which dequantises every tensor to float32. That takes tens of seconds (SmolLM2-135M: about 20 s on 2
cores), so the result is kept on disk as an ordinary transformers folder (config.json, model.safetensors,
the tokenizer) beside a stamp of the GGUF file (``posviz_gguf.json``): the next open reads that folder
in seconds, like any published model. A changed file (size or modification time) gets a new folder.

Safety as for every published model, before anything is dequantised: the parameter count is summed
from the tensor shapes in the file's header (``n_params``), against the same cap; the architecture
must be one transformers' GGUF loader and posviz both read; no code runs. A truncated or corrupt file
is a ``PosvizError`` that says so.

Refs: a path to a ``.gguf`` file, a folder holding exactly one (and no config.json), or
``owner/name/file.gguf`` on the Hugging Face hub.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from posviz.errors import PosvizError
from posviz.models.hf.hub import Engine, hub_file

SUFFIX = ".gguf"
STAMP_FILE = "posviz_gguf.json"
HUB_GGUF = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})/([^/]{1,200}\.gguf)$",
                      re.IGNORECASE)
_CONVERTING = threading.Lock()  # one dequantisation at a time: each holds the whole model in float32


def local_file(ref: str) -> Path | None:
    """The GGUF file ``ref`` names on this machine: the file itself, or a folder's only ``.gguf`` file
    (a folder with a config.json is a transformers folder, not this)."""
    path = Path(ref)
    if path.is_file() and path.suffix.lower() == SUFFIX:
        return path.resolve()
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
        if len(found) == 1:
            return found[0].resolve()
    return None


def is_gguf_ref(ref: str) -> bool:
    return local_file(ref) is not None or bool(HUB_GGUF.match(ref)) and not Path(ref).exists()


@dataclass(frozen=True)
class Header:
    """What the file's header says, read without dequantising anything."""

    path: Path
    architecture: str  # llama.cpp's name ("llama", "qwen2", "gpt2", ...)
    n_params: int  # elements of every tensor in the file (a tied output matrix is stored once)
    quantization: str  # the tensor type holding most parameters ("Q4_1", "Q8_0", "F16", ...)
    name: str


def read_header(path: Path) -> Header:
    """The file's header; for a file already dequantised, what its stamp kept of it (the reader parses every
    metadata field, the whole vocabulary included: seconds)."""
    kept = _kept(path)
    if kept is not None:
        try:
            return Header(path, kept["architecture"], int(kept["n_params"]), kept["quantization"], kept["name"])
        except (KeyError, TypeError, ValueError):
            pass  # a stamp of another version: read the file itself
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise PosvizError("Opening a GGUF file needs the gguf package: pip install -r requirements.txt.") from exc
    try:
        reader = GGUFReader(str(path))
        fields = reader.fields
        architecture = str(fields["general.architecture"].contents())
        name = str(fields["general.name"].contents()) if "general.name" in fields else path.stem
        by_type: Counter = Counter()
        for tensor in reader.tensors:
            by_type[tensor.tensor_type.name] += int(tensor.n_elements)
    except PosvizError:
        raise
    except Exception as exc:  # a truncated file, a wrong magic number, a header that does not parse
        raise PosvizError(f"{path.name} is not a readable GGUF file ({type(exc).__name__}: {exc}). It may be "
                          "truncated or corrupt: download it again. The other models keep working.") from exc
    if not by_type:
        raise PosvizError(f"{path.name} holds no tensors: not a model file.")
    return Header(path, architecture, sum(by_type.values()), by_type.most_common(1)[0][0], name)


# llama.cpp's architecture names that transformers' legacy GGUF loader builds as a config of another model_type: a
# Gemma 3 GGUF file holds the text model alone, which that loader builds as ``gemma3_text``. (The newer loader says
# its own model_types: ``_new_loader_types``.)
GGUF_FAMILIES = {"gemma3": "gemma3_text"}


class _AnyMetadata(dict):
    """Metadata for asking the newer loader's config functions which model_type they build, without a file: every
    key the function requires reads as 1 (a count, a size, a rate: all it divides or compares), and as [1] where it is
    iterated (rope sections, per-layer head counts); an optional key (``.get``) is absent."""

    class _One(int):
        def __iter__(self):
            return iter((1,))

    def __missing__(self, key):
        return self._One(1)


@functools.lru_cache(maxsize=1)
def _new_loader_types() -> dict[str, str]:
    """Architecture -> model_type for transformers' newer GGUF loader (``transformers.integrations.gguf``, 5.25 on:
    ``qwen35`` -> ``qwen3_5_text``, ...), as its own config functions assign it; {} where the installed transformers
    has no such loader. An architecture counts where its config and its weights both load that way."""
    try:
        from transformers.integrations.gguf.gguf_config_mapping import GGUF_CONFIG_ARCHS
    except ImportError:
        return {}
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
    except ImportError:
        def is_gguf_arch_supported(architecture):  # noqa: E306  (no separate weights table: the config's says it)
            return True
    types = {}
    for architecture, build in GGUF_CONFIG_ARCHS.items():
        try:
            model_type = build(_AnyMetadata({"general.architecture": architecture}), ())["model_type"]
        except Exception:  # a config function that wants more of a file than the probe gives: not claimed
            continue
        if isinstance(model_type, str) and is_gguf_arch_supported(architecture):
            types[architecture] = model_type
    return types


def readable_architectures() -> dict[str, str]:
    """llama.cpp architecture name -> the model_type transformers builds from it, for each architecture the installed
    transformers reads in a GGUF file (its legacy loader, ``integrations.ggml``, and its newer one, which transformers
    itself prefers where both claim a name), and posviz's families read."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from posviz.models.hf.families import FAMILIES

    types = {a: GGUF_FAMILIES.get(a, a) for a in GGUF_CONFIG_MAPPING}
    types.update(_new_loader_types())
    return {a: t for a, t in sorted(types.items()) if t in FAMILIES}


def check(header: Header) -> None:
    """Refuse, in words, what posviz cannot or must not open: over the parameter cap, or an architecture
    transformers' GGUF loaders or posviz's families do not read."""
    from posviz.models.hf.families import supported_families
    from posviz.models.hf.settings import max_params, parameters_in_words as words

    if header.n_params > max_params():
        raise PosvizError(f"{header.path.name} has {words(header.n_params)} parameters, over this server's cap of "
                          f"{words(max_params())} (POSVIZ_MAX_PARAMS). Choose a smaller model.")
    readable = sorted(readable_architectures())
    if header.architecture not in readable:
        raise PosvizError(f"{header.path.name} is a {header.architecture!r} GGUF model: posviz opens GGUF files of "
                          f"{', '.join(readable)} (transformers' GGUF loader and posviz's families: "
                          f"{supported_families()}).")


def file_stamp(path: Path) -> dict:
    """What tells one version of the file from another: its path, size and modification time."""
    stat = path.stat()
    return {"file": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cache_root() -> Path:
    """Where dequantised models are kept: ``$POSVIZ_GGUF_CACHE``, else ~/.cache/posviz/gguf."""
    return Path(os.environ.get("POSVIZ_GGUF_CACHE") or Path.home() / ".cache" / "posviz" / "gguf")


def converted_folder(path: Path) -> Path:
    digest = hashlib.sha1(json.dumps(file_stamp(path), sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / f"{path.stem}-{digest}"


def _kept(path: Path) -> dict | None:
    """The stamp file of the dequantised copy of this version of ``path``, or None (not converted yet)."""
    try:
        kept = json.loads((converted_folder(path) / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and kept.get("stamp") == file_stamp(path) else None


def is_converted(path: Path) -> bool:
    return _kept(path) is not None


def read_config(path: Path):
    """transformers' config for the file (its GGUF metadata mapped to config fields; seconds, no tensors)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise PosvizError(f"{path.name}: transformers cannot read its GGUF metadata ({type(exc).__name__}: {exc}).") from exc


@contextlib.contextmanager
def _one_tensor_name_map():
    """transformers (5.24) builds gguf's tensor-name map anew for every module of the model it maps (397 times for
    SmolLM2-135M: 10 of a 30 s conversion); the map depends on the architecture and layer count alone, so within a
    conversion each is built once. transformers imports ``get_tensor_name_map`` from gguf at each call, which is
    what makes it swappable here; where a version does otherwise this changes nothing."""
    import gguf

    built = getattr(gguf, "get_tensor_name_map", None)
    if built is None:
        yield
        return
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(built)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = built


def _save_tokenizer(tokenizer, folder: Path) -> None:
    """Keep the tokenizer transformers built from the file's vocabulary so that the folder reloads it as built. A
    model's own tokenizer class may rebuild its pre-tokenizer and normaliser from the class when reloaded (transformers
    5.25's Qwen3_5Tokenizer: Qwen's split regex and NFC, whatever the file stated); where the reloaded one differs,
    the folder names the generic class instead, which reads tokenizer.json as written."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(folder)
    built = tokenizer.backend_tokenizer.to_str()
    if AutoTokenizer.from_pretrained(str(folder)).backend_tokenizer.to_str() == built:
        return
    settings = folder / "tokenizer_config.json"
    kept = json.loads(settings.read_text())
    kept["tokenizer_class"] = "TokenizersBackend"
    settings.write_text(json.dumps(kept, indent=2))
    if AutoTokenizer.from_pretrained(str(folder)).backend_tokenizer.to_str() != built:
        raise PosvizError("transformers does not reload the tokenizer it built from the file as it built it.")


def convert(path: Path, header: Header, config=None, progress=None) -> Path:
    """Dequantise ``path`` once into ``converted_folder(path)`` (written aside, then renamed into place, so a
    half-written folder is never read) and return that folder."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = converted_folder(path)
    report = progress or (lambda fraction: None)
    with _CONVERTING:
        if is_converted(path):
            return folder
        work = folder.with_name(f"{folder.name}.part-{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        try:
            work.mkdir(parents=True)
            report(0.05)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            report(0.25)
            with _one_tensor_name_map():  # (under _CONVERTING: one conversion swaps it at a time)
                net = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype="float32",
                                                           config=config)  # the config read already: not parsed again
            report(0.85)
            config = net.config
            if hasattr(config, "quantization_config"):  # the weights are float32 now: nothing is quantised
                del config.quantization_config
            config.save_pretrained(work)
            save_model(net, str(work / "model.safetensors"))  # tied matrices stored once, as safetensors does
            _save_tokenizer(tokenizer, work)
            (work / STAMP_FILE).write_text(json.dumps(
                {"stamp": file_stamp(path), "architecture": header.architecture, "n_params": header.n_params,
                 "quantization": header.quantization, "name": header.name}, indent=1))
            shutil.rmtree(folder, ignore_errors=True)  # a stale or half-removed earlier copy
            os.replace(work, folder)
        except PosvizError:
            raise
        except OSError as exc:
            raise PosvizError(f"{path.name}: cannot keep its dequantised copy in {folder.parent} ({exc}); "
                              "free some disk space or set POSVIZ_GGUF_CACHE.") from exc
        except Exception as exc:
            raise PosvizError(f"{path.name}: transformers cannot dequantise it ({type(exc).__name__}: {exc}).") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        report(1.0)
    return folder


def hub_download(ref: str) -> Path:
    """``owner/name/file.gguf`` from the hub (or its local cache)."""
    match = HUB_GGUF.match(ref)
    if match is None:
        raise PosvizError(f"{ref!r} is not a GGUF file here, nor owner/name/file.gguf on the hub.")
    return hub_file(match.group(1), match.group(2))


class GGUFEngine(Engine):
    """The weights of a GGUF file: dequantised once into ``converted_folder`` (under the page's progress
    bar), then loaded from that folder as any published model's."""

    def __init__(self, header: Header, folder: Path, config, device, dtype):
        super().__init__(str(header.path), folder, config, device, dtype)
        self.header = header

    def _converted(self, progress=None) -> Path:
        if not is_converted(self.header.path):
            convert(self.header.path, self.header, self.config, progress)
        return self.folder

    def tokenizer_source(self) -> Path:
        return self._converted()

    def _load(self, progress):
        self._converted(progress)
        return super()._load(None)
