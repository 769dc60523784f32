"""The shipped checkpoints as the pages read them: their config and metrics files, their validation
bits per byte for the sidebar, and their models, each read once per change on disk (training may
rewrite them while the app runs); their trained parameters through the model interface. Nothing is drawn here.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from posviz.display import display_name
from posviz.explore.about import VAL_BPB
from posviz.models.checkpoint_files import read_metrics, shipped_checkpoints
from posviz.errors import PosvizError
from posviz.limits import CACHE_ENTRIES


# VAL_BPB (posviz.explore.about) is metrics.json's val_bpb_at_train_length: the training run's own final check, on
# the first eval_bytes (64 KiB) of the long held-out validation documents (Corpus.eval_stream), in windows of the
# training length: docs/results.md's "first 64 KiB of the long validation documents" column. Not its "whole
# validation split" column, nor the "bits/byte @ 1×" of Home, the Scoreboard and the labs (the evaluation's 128 KiB,
# metrics.json's eval block). One quantity, one name: "final bits/byte", the same here, in the help and in the docs.
VAL_BPB_HELP = ("Final bits/byte: the training run's own last check, bits per byte on the first 64 KiB of the long "
                "held-out validation documents, at the training length; lower is better. Home, the Scoreboard and "
                "the labs' “bits/byte @ 1×” score 128 KiB of those documents, and docs/results.md also gives the "
                "whole validation split, so those numbers differ.")


def folder_stamp(folder: str | Path) -> tuple:
    """(name, size, mtime) of each file in a checkpoint folder: a cache key that changes on rewrite."""
    folder = Path(folder)
    if not folder.is_dir():
        return ()
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file())

@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
def _checkpoint_summary(folders: tuple[tuple[str, str], ...], stamps: tuple) -> pd.DataFrame:
    rows = []
    for name, folder in folders:
        try:
            m = read_metrics(folder)
            rows.append({"checkpoint": display_name(name), VAL_BPB: m.get("val_bpb_at_train_length"),
                         "parameters": m.get("parameters")})
        except PosvizError as exc:
            rows.append({"checkpoint": display_name(name), VAL_BPB: None, "parameters": None, "problem": str(exc)})
    return pd.DataFrame(rows)


def checkpoint_summary() -> pd.DataFrame:
    """Validation bpb and size of every shipped checkpoint; recomputed when the models folder
    (``$POSVIZ_CHECKPOINTS``) or any of its files change."""
    folders = tuple((name, str(folder)) for name, folder in shipped_checkpoints().items())
    return _checkpoint_summary(folders, tuple(folder_stamp(folder) for _, folder in folders))

@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
def _checkpoint_json(folder: str, stamp: tuple) -> tuple[dict | None, dict | None, str | None]:
    from posviz.models.checkpoint_files import read_config

    try:
        return read_config(folder), read_metrics(folder), None
    except PosvizError as exc:
        return None, None, str(exc)


def shipped_checkpoint_json() -> dict[str, tuple[dict | None, dict | None, str | None]]:
    """{name: (config.json, metrics.json, problem)} of every shipped checkpoint, in display order.

    A missing or corrupt file gives (None, None, message) for that checkpoint; the others still load.
    """
    return {name: _checkpoint_json(str(folder), folder_stamp(folder)) for name, folder in shipped_checkpoints().items()}


def shipped_lab_model(name: str):
    """(LabModel, None) for the shipped checkpoint ``name`` with its weights loaded, through the model
    interface (``open_model``: one object per server for the checkpoint as it is on disk), or (None,
    message saying what to do)."""
    folder = shipped_checkpoints().get(name)
    if folder is None:
        from posviz.models.checkpoint_files import models_dir

        return None, (f"No '{name}' checkpoint in {models_dir()}. "
                      "Run `make checkpoints` to train the shipped set.")
    from posviz.models.interface import open_model

    try:
        model = open_model(str(folder))
        model.load()  # a damaged weights file says so here, not in the middle of a chart
        return model, None
    except PosvizError as exc:
        return None, f"{exc} Run `make checkpoints` (or `python -m posviz.train --method {name}`) to rebuild it."
