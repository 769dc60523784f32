"""The Workshop's server-wide trainer and a session's trained formulas, which every lab lists as "yours: …".

A session's checkpoints live in its ``SessionFolder`` (removed with the session's state); the list of them is
``yours()`` ({label: folder}), read by ``views._models.usable_models`` so the labs pick them like shipped ones.
"""
from __future__ import annotations

import json
from pathlib import Path

import streamlit as st

from posviz.limits import WORKSHOP_RESULTS_PER_SESSION

RESULTS_KEY = "_workshop_results"  # [{"label", "folder", "formula", "scores", "message"}], oldest first
JOB_KEY = "_workshop_job"  # the session's queued or running job, if any
FOLDER_KEY = "_workshop_folder"  # the session's SessionFolder: removed when the session's state is


@st.cache_resource(show_spinner=False)
def trainer():
    """The server's one training queue (``WORKSHOP_TRAININGS_AT_ONCE`` at a time)."""
    from posviz.workshop.training import Trainer

    return Trainer()


def session_folder() -> Path:
    from posviz.workshop.training import SessionFolder

    if FOLDER_KEY not in st.session_state:
        st.session_state[FOLDER_KEY] = SessionFolder()
    return st.session_state[FOLDER_KEY].path


@st.cache_data(show_spinner=False)
def quick_baselines(stamp: int) -> dict[str, dict]:
    """{"alibi (quick)": {multiple: bits per byte}} of the quick baselines (posviz/workshop/quick_runs.json), read
    once per version of the file (``stamp``: its mtime), not on every rerun of the page."""
    from posviz.workshop import drawing

    path = Path(drawing.__file__).with_name("quick_runs.json")
    if not path.is_file():
        return {}
    return {f"{name} (quick)": run["bits_per_byte"] for name, run in json.loads(path.read_text()).items()
            if run.get("baseline")}


def quick_baselines_stamp() -> int:
    from posviz.workshop import drawing

    path = Path(drawing.__file__).with_name("quick_runs.json")
    return path.stat().st_mtime_ns if path.is_file() else 0


def results() -> list[dict]:
    return st.session_state.setdefault(RESULTS_KEY, [])


def keep(job) -> None:
    """A finished job's checkpoint among the session's results; past the cap the oldest is removed, files too."""
    import shutil

    kept = results()
    kept.append({"label": job.label, "folder": str(job.folder), "formula": job.options["formula"],
                 "scores": dict(job.scores), "message": job.message})
    while len(kept) > WORKSHOP_RESULTS_PER_SESSION:
        shutil.rmtree(kept.pop(0)["folder"], ignore_errors=True)


def yours() -> dict[str, str]:
    """{"yours: <label>": folder} of this session's trained formulas whose files are still there."""
    return {f"yours: {r['label']}": r["folder"] for r in results() if (Path(r["folder"]) / "config.json").is_file()}
