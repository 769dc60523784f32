"""Stored measurements of published models past their context (``python -m posviz_tools.measure_published``): one
JSON file a model under ``results/published/`` (or ``$POSVIZ_PUBLISHED_RESULTS``), shaped as a checkpoint's
``metrics.json`` ``eval`` block: ``nonoverlapping_bpb``, ``rope_scalings``, ``rope_remaps``, ``effective_length``.
The scoreboard reads them for the published models a deployer lists; docs/published_models.md's table is written
from them (``posviz_tools.published_table``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def results_dir() -> Path:
    return Path(os.environ.get("POSVIZ_PUBLISHED_RESULTS") or ROOT / "results" / "published")


def result_file(ref: str) -> Path:
    """Where the results of ``ref`` are stored: its file or folder name, or a hub id with ``--`` for ``/`` (a GGUF
    file on the hub, ``owner/name/file.gguf``, by its file name, as the same file opened locally)."""
    path = Path(ref)
    if path.exists() or ref.lower().endswith(".gguf"):
        name = path.name
    else:
        name = ref.replace("/", "--")
    return results_dir() / f"{name}.json"


def read_results(ref: str) -> dict:
    """The stored record of ``ref``, {} when there is none or it cannot be read (a page says "not measured")."""
    try:
        record = json.loads(result_file(ref).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
