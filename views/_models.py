"""The live labs' model list: the shipped checkpoints, then the published models the deployer lists in
``$POSVIZ_MODELS`` (and, where ``$POSVIZ_ALLOW_ANY_MODEL=1``, those a visitor adds by hub id or folder).

A published model is listed by its name with its position method and trained context, read from its
config (a folder's, or a hub model's config.json already in the local cache); a hub model whose config
is not cached yet is listed by its id alone and fetched only when a visitor picks it. Its weights are
loaded when it is picked, under a progress bar (``ModelList.ready``). A published model that cannot be
opened gets an error box saying what to do, and the page goes on with the rest. Published models are
never selected by default. Nothing is drawn here but those boxes, bars and the visitor's text input.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from posviz.display import display_name
from posviz.errors import PosvizError
from posviz.models.hf.settings import any_model_allowed, deployer_models, download_size
from posviz.positions.nope_temperature import INFERENCE_TEMPERATURE
from posviz.limits import max_eval_length
from posviz.models.interface import LabModel
from views._page import error_box, plain, usable_checkpoints

ADD_KEY = "w_add_model"
LABELS_KEY = "_model_labels"  # {name: label} as this session's pickers first showed them


def _deployer_models() -> list[str]:
    return deployer_models()  # posviz.models.hf.settings imports nothing heavy: no transformers here


def _any_model_allowed() -> bool:
    return any_model_allowed()


def _is_local(ref: str) -> bool:
    return Path(ref).exists()  # a folder, or a GGUF file


def _config_cached(ref: str) -> bool:
    """Whether hub model ``ref``'s config.json (a hub GGUF ref's file: owner/name/file.gguf) is in the local
    Hugging Face cache (no network)."""
    repo, filename = ref.rsplit("/", 1) if ref.lower().endswith(".gguf") else (ref, "config.json")
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, filename), str)
    except Exception:  # a malformed id: opening it says what is wrong
        return True


def _unfetched(ref: str) -> str:
    """A hub model's label before anything of it is fetched: what picking it downloads, where we know it."""
    size = download_size(ref)
    return f" — published, {size} download when picked" if size else " — published (fetched when picked)"


def described_without_download(ref: str) -> bool:
    """A folder, a GGUF file here, or a hub model whose config is in the local cache: it can be opened (and
    described) without the network. Any other hub model is fetched only when a visitor picks it."""
    return _is_local(ref) or _config_cached(ref)


def _open(read, ref: str) -> LabModel:
    """``read(ref)``. A hub id that failed a moment ago fails again at once with the same words: the
    published models' kind remembers it (``TransformersKind.FAILURE_MEMORY_S``), not each page."""
    return read(ref)


@dataclass
class ModelList:
    """Every model a lab page can pick, in the picker's order: the shipped checkpoints first, then the models
    the deployer lists (``$POSVIZ_MODELS``) or a visitor adds, which may be described only once picked."""

    refs: dict[str, str]  # name -> ref (a shipped checkpoint's folder, a hub id or a folder)
    models: dict[str, LabModel]  # name -> model, for those resolved (every shipped one; a listed one once described)
    listed: list[str] = field(default_factory=list)  # names added from the deployer's list or by a visitor, in order
    read: object = None  # what resolves a ref (open_model)
    remapped: list[str] = field(default_factory=list)  # a checkpoint under a training-free remap ("rope+dca"): on request
    yours: list[str] = field(default_factory=list)  # this session's formulas trained in the Workshop ("yours: …")

    @property
    def names(self) -> list[str]:
        return list(self.refs)

    @property
    def shipped(self) -> list[str]:
        """The shipped checkpoints as trained (no published model, no remapped variant)."""
        return [n for n in self.refs if n not in self.listed and n not in self.remapped and n not in self.yours]

    def say(self, ours: str, any_model: str) -> str:
        """A picker's words: ``ours`` while it lists only our checkpoints ("Checkpoints"), else ``any_model``."""
        return any_model if self.listed else ours

    def label(self, name: str) -> str:
        """What the picker shows: the display name (``posviz.display``) and the model's ``description`` (a published model's position method
        and trained context, "openai-community/gpt2 — learned, 1,024 tokens").

        A session keeps the label a model first had: a picker's value is its label, so a hub model listed
        by its id alone and described once fetched must not change label under the visitor's selection.
        """
        labels = st.session_state.setdefault(LABELS_KEY, {})
        if name not in labels:
            model = self.models.get(name)
            labels[name] = display_name(name) + (model.description if model is not None else _unfetched(self.refs[name]))
        return labels[name]

    def add_input(self, where=None) -> None:
        """Where any model is allowed, a text input for a hub id or a folder (added to the list)."""
        if not _any_model_allowed():
            return
        (where or st).text_input(
            "Add a published model (hub id, folder or GGUF file)", key=ADD_KEY, placeholder="openai-community/gpt2",
            help="A causal language model of a supported family (GPT-2, OPT, Pythia, Llama, Qwen2, Qwen3, Gemma 2 and 3, "
                 "Phi-3, BLOOM, Falcon, MPT) in safetensors, or a .gguf file of one (owner/name/file.gguf on the hub). It joins the model "
                 "list; pick it there. Commas separate several.")

    def caption(self, where=None) -> None:
        """A line on what published models are, shown only when some are listed."""
        if self.listed:
            (where or st).caption(
                "Published models run through transformers with their own tokenizer: their lengths are in tokens, "
                "their scores in bits per byte of text, comparable with the byte-level checkpoints. They load "
                "when picked.")

    def ready(self, chosen: list[str], where=None) -> list[str]:
        """``chosen`` without the models that cannot be opened or loaded (each gets an error box); each chosen
        model not resolved yet is resolved now, and one whose weights take a while loads now under a progress bar."""
        where = where or st
        out = []
        for name in chosen:
            try:
                model = self.models.get(name)
                if model is None:  # listed by its hub id only: fetch its config now
                    with where.spinner(f"Fetching {name}'s config from the Hugging Face hub…"):
                        model = self.models[name] = _open(self.read, self.refs[name])
                if model.needs_loading:
                    bar = where.progress(0.0, text=f"Loading {name}…")
                    try:
                        model.load(progress=lambda f, bar=bar, name=name: bar.progress(
                            min(max(float(f), 0.0), 1.0), text=f"Loading {name}: downloading or dequantising its weights…"))
                    finally:
                        bar.empty()
            except PosvizError as exc:
                error_box(PosvizError(f"Published model {name!r} cannot be used: {exc}"),
                          "The other models keep working.")
                continue
            out.append(name)
        return out


def usable_models(read) -> ModelList:
    """The shipped checkpoints ``read`` can open (as ``usable_checkpoints``: error boxes for the others,
    a stop when there is none), then the published models (``add_published``)."""
    checkpoints, models = usable_checkpoints(read)
    refs = {name: str(folder) for name, folder in checkpoints.items() if name in models}
    models, remapped = dict(models), []
    for name, model in list(models.items()):  # the rope checkpoint under each training-free remap, covering the
        if model.method == "rope" and not model.finetuned_from():  # longest length a lab runs (16x on a CPU)
            for remap in model.remaps:
                remapped.append(f"{name}+{remap}")
                refs[remapped[-1]] = refs[name]
                models[remapped[-1]] = read(refs[name], {"remap": remap, "factor": float(max_eval_length(1, model.device))})
        if model.method == "nope" and not model.finetuned_from():  # NoPE with nope_temperature's temperature, untrained
            remapped.append(f"{name}+temperature")
            refs[remapped[-1]] = refs[name]
            models[remapped[-1]] = read(refs[name], INFERENCE_TEMPERATURE)
    listing = ModelList(refs, models, [], read, remapped)
    add_yours(listing)
    return add_published(listing)


def add_yours(listing: ModelList) -> None:
    """The formulas this session trained in the Workshop, after the shipped checkpoints, as "yours: <label>"."""
    from views._workshop import yours

    for name, folder in yours().items():
        try:
            model = listing.read(folder)
        except PosvizError as exc:
            # its name is the label a visitor's formula made: quoted, as every lab quotes it
            error_box(PosvizError(f"Your Workshop model {plain(repr(name))} cannot be opened: {exc}"),
                      "Train it again there.")
            continue
        listing.refs[name], listing.models[name] = folder, model
        listing.yours.append(name)


def add_published(listing: ModelList) -> ModelList:
    """``listing`` with the published models of ``$POSVIZ_MODELS`` and any a visitor added after its own.

    A published model that cannot be opened gets an error box and is left out; nothing is downloaded
    but a hub model's config.json where the hub is reachable and it is not cached, and that only when
    it is picked (``ModelList.ready``).
    """
    published = _deployer_models()
    typed = st.session_state.get(ADD_KEY) or ""
    if typed and _any_model_allowed():
        published += [r.strip() for r in typed.split(",") if r.strip() and r.strip() not in published]
    for ref in published:
        if not described_without_download(ref):  # offline too: a pick says the hub cannot be reached
            name = ref  # described once picked: nothing is fetched for a model nobody asked for
            model = None
        else:
            try:
                model = _open(listing.read, ref)
            except PosvizError as exc:
                error_box(PosvizError(f"Published model {ref!r} cannot be opened: {exc}"),
                          "The shipped checkpoints and the other models keep working.")
                continue
            name = model.name
        if name in listing.refs:  # a folder named like a shipped checkpoint: listed by its full ref
            name = ref
            if name in listing.refs:
                continue
        listing.refs[name] = ref
        listing.listed.append(name)
        if model is not None:
            listing.models[name] = model
            add_remapped(listing, name, ref, model)
    return listing


def add_remapped(listing: ModelList, name: str, ref: str, model: LabModel) -> None:
    """A published RoPE model under each training-free remap, listed under its name as the rope checkpoint's are
    ("model+self_extend"), its defaults covering the longest length a lab runs it at on this device."""
    factor = max(1.0, model.length_cap / model.train_length)
    for remap in model.remaps:
        try:
            variant = model.with_position_options({"remap": remap, "factor": factor})
        except PosvizError as exc:  # a remap its options refuse at this length: said once, the rest go on
            error_box(PosvizError(f"{display_name(remap)} on {name!r} cannot be listed: {exc}"), "The model runs without it.")
            continue
        remapped = f"{name}+{remap}"
        listing.refs[remapped] = ref
        listing.listed.append(remapped)
        listing.remapped.append(remapped)
        listing.models[remapped] = variant
