"""One display name for each thing the app shows: position methods, RoPE scalings and remaps, KV-cache
strategies, shipped checkpoints and the series built from them ("rope+yarn", "rope+dca").

Each name is kept with its registry entry (a method's ``display_name``, the name given to
``rope_scaling.register`` / ``rope_remaps.register``, ``labs.kv_cache.STRATEGY_TITLES``), so a new method
file shows up by its own name on every page. Ids stay what links (query parameters), CSV files and
configs use; every picker, legend, table and caption shows ``display_name(id)``. A name nothing here
knows (a published model's hub id, a Workshop run's "yours: …" label) is shown as it is.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Iterable

SEPARATOR = " + "  # a checkpoint under a scaling or a remap: "RoPE + YaRN", "RoPE + dual chunk attention"


def method_name(method: str) -> str | None:
    from posviz.positions import method_display_name

    return method_display_name(method)


def scaling_name(scaling: str) -> str | None:
    from posviz.positions.rope_scaling import ROPE_SCALINGS

    fn = ROPE_SCALINGS.get(scaling)
    return getattr(fn, "display_name", scaling) if fn is not None else None


def remap_name(remap: str) -> str | None:
    from posviz.positions.rope_remaps import ROPE_REMAPS

    entry = ROPE_REMAPS.get(remap)
    return entry.display_name if entry is not None else None


def strategy_name(strategy: str) -> str | None:
    from posviz.labs import generation, kv_cache

    return kv_cache.STRATEGY_TITLES.get(strategy) or generation.STRATEGY_TITLES.get(strategy)


def _own_name(ident: str) -> str | None:
    """The name a registry keeps for ``ident`` itself (no "+" series), or None."""
    return (method_name(ident) or checkpoint_name(ident) or remap_name(ident) or scaling_name(ident)
            or strategy_name(ident))


# A method's own option switched on at inference (what follows "+" in "nope+temperature"): the shipped checkpoint run
# as the method trained with it runs (posviz.positions.nope_temperature), without retraining.
INFERENCE_SWITCHES = {"temperature": "temperature, no retraining"}


def _variant_name(variant: str) -> str | None:
    """A scaling's, a remap's or an inference switch's name (what follows "+" in "rope+yarn", "nope+temperature")."""
    return (remap_name(variant) or (scaling_name(variant) if variant not in ("none", "") else None)
            or INFERENCE_SWITCHES.get(variant))


@functools.lru_cache(maxsize=256)
def _config_name(config_path: str, stamp: float) -> str | None:
    """A checkpoint's name from its config.json: its method, the scaling it was trained or fine-tuned with,
    and the length it was fine-tuned at as a multiple of the one it started from ("RoPE + YaRN, fine-tuned at 4×")."""
    try:
        config = json.loads(Path(config_path).read_text())
        model = config["model"]
        method = method_name(model["position"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if method is None:
        return None
    options = model.get("position_options") or {}
    scaling = options.get("scaling") if isinstance(options, dict) else None
    name = method + (SEPARATOR + scaling_name(scaling) if isinstance(scaling, str) and scaling != "none"
                     and scaling_name(scaling) else "")
    tuned = config.get("finetuned_from")
    if isinstance(tuned, dict):
        dropped = tuned.get("dropped_positions")
        if isinstance(dropped, str) and method_name(dropped):  # recalibrated without its base's positions
            return f"DroPE (from {method_name(dropped)})"
        start = _start_length(Path(config_path).parent, tuned, options)
        length = model.get("train_length")
        if start and isinstance(length, int) and length % start == 0:
            return f"{name}, fine-tuned at {length // start}×"
        return f"{name}, fine-tuned"
    return name


def _base_config(folder: Path, tuned: dict) -> dict:
    """The config.json of the checkpoint a fine-tuned one started from, where it is beside it (or at its recorded
    path); {} where it is not."""
    base = tuned.get("checkpoint")
    if isinstance(base, str):
        for candidate in (folder.parent / Path(base).name / "config.json", Path(base) / "config.json"):
            try:
                config = json.loads(candidate.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(config, dict):
                return config
    return {}


def _start_length(folder: Path, tuned: dict, options: dict) -> int | None:
    """The training length a fine-tuned checkpoint started from: its base's config where it is beside it,
    else the scaling's original length."""
    try:
        return int(_base_config(folder, tuned)["model"]["train_length"])
    except (KeyError, ValueError, TypeError):
        pass
    original = options.get("original_length") if isinstance(options, dict) else None
    return int(original) if isinstance(original, (int, float)) and original > 0 else None


def checkpoint_name(name: str) -> str | None:
    """A shipped checkpoint's display name, from its config (None: no shipped checkpoint has this name)."""
    from posviz.models.checkpoint_files import models_dir

    path = models_dir() / name / "config.json"
    try:
        stamp = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return _config_name(str(path), stamp)


def _is_remap(variant: str) -> bool:
    from posviz.positions.rope_remaps import ROPE_REMAPS

    return variant in ROPE_REMAPS


def display_name(ident: str) -> str:
    """What every page shows for ``ident``: a method, a scaling, a remap, a KV-cache strategy, a shipped checkpoint
    (its name from its config), a series "<checkpoint or method>+<scaling or remap>"; else ``ident`` itself
    (a published model's hub id, a Workshop run's label)."""
    ident = str(ident)
    found = _own_name(ident)
    if found:
        return found
    if "+" in ident:
        base, _, variant = ident.rpartition("+")
        shown = _variant_name(variant)
        if shown and (method_name(base) or checkpoint_name(base) or _is_remap(variant)):
            # a published model under a remap ("HuggingFaceTB/SmolLM2-135M+dca") keeps its own name before it
            return display_name(base) + SEPARATOR + shown
    return ident


def display_names(idents: Iterable[str]) -> dict[str, str]:
    """{id: display name} for ``idents``, in their order."""
    return {i: display_name(i) for i in dict.fromkeys(idents)}


def aliases(idents: Iterable[str]) -> dict[str, str]:
    """{display name: id}: what ``views._charts.method_scales`` takes to colour a chart whose series are shown
    by display name with each id's own colour (``posviz.palette`` is keyed on ids)."""
    return {display_name(i): i for i in dict.fromkeys(idents)}


def known_ids() -> dict[str, str]:
    """{id: display name} of every registered id whose display name differs from it: the ids a page must not
    show where it means the thing (the check of tests/test_display_names.py)."""
    from posviz.labs import generation, kv_cache
    from posviz.models.checkpoint_files import shipped_checkpoints
    from posviz.positions import POSITION_METHODS
    from posviz.positions.rope_remaps import ROPE_REMAPS
    from posviz.positions.rope_scaling import ROPE_SCALINGS

    ids = [*POSITION_METHODS, *ROPE_SCALINGS, *ROPE_REMAPS, *kv_cache.STRATEGIES, *generation.STRATEGIES]
    try:
        checkpoints = list(shipped_checkpoints())
    except OSError:
        checkpoints = []
    # the series the pages build: the rope checkpoint under a scaling or a remap ("rope+yarn", "rope+dca")
    series = [f"rope+{v}" for v in [*ROPE_SCALINGS, *ROPE_REMAPS] if v != "none"] + ["nope+temperature"]
    out = {}
    for ident in dict.fromkeys(ids + checkpoints + series):
        shown = _own_name(ident)
        if shown is None and "+" in ident:
            base, _, variant = ident.rpartition("+")
            shown = display_name(base) + SEPARATOR + (_variant_name(variant) or variant)
        if shown and shown != ident:
            out[ident] = shown
    return out


def ids_by_name() -> dict[str, str]:
    """{display name: id} of every registered id: how a chart whose series are shown by name finds each one's
    colour (``posviz.palette`` is keyed on ids)."""
    return {shown: ident for ident, shown in known_ids().items()}


def for_export(table):
    """``table`` (a pandas DataFrame) as a CSV file gives it: every column that holds ids shows their display names,
    and keeps the ids in a column of its own beside it (``"<column> (id)"``) for a script to join on. A column's other
    values (a published model's hub id, a Workshop run's label) are kept as they are."""
    out = table
    for column in table.columns:
        values = table[column]
        if values.dtype.kind in "biufcmM":  # numbers, booleans and times hold no id
            continue
        distinct = [v for v in dict.fromkeys(values.dropna()) if isinstance(v, str)]
        shown = {v: display_name(v) for v in distinct}
        if all(shown[v] == v for v in distinct):
            continue
        if out is table:
            out = table.copy()
        at = list(out.columns).index(column)
        out.insert(at + 1, f"{column} (id)", values)
        out[column] = values.map(lambda v: shown.get(v, v) if isinstance(v, str) else v)
    return out
