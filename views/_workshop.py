"""The Workshop's server-wide trainer and a session's trained formulas, which every lab lists as "yours: …".

A session's runs live in the server's store of runs (``posviz.workshop.training.RunStore``, shared by every visitor
who trains the same formula); the list of this session's is ``yours()`` ({label: folder}), read by
``views._models.usable_models`` so the labs pick them like shipped ones.
"""
from __future__ import annotations

import json
from pathlib import Path

import streamlit as st

from posviz.limits import WORKSHOP_RESULTS_PER_SESSION

RESULTS_KEY = "_workshop_results"  # [{"label", "folder", "formula", "scores", "message"}], oldest first
JOB_KEY = "_workshop_job"  # the session's queued or running job, if any
RUNS_FOLDER = "workshop-runs"  # the store of runs, inside the result files' edition (the code, torch, the device)


@st.cache_resource(show_spinner=False)
def trainer():
    """The server's one training queue (``WORKSHOP_TRAININGS_AT_ONCE`` at a time) and its store of finished runs."""
    from posviz.workshop.training import Trainer

    return Trainer(run_store())


def run_store():
    """The finished runs, beside the labs' result files: in their edition, so a change of the code, of torch or of
    the device starts afresh; in a temporary folder when results are kept in memory only (``POSVIZ_STORE=0``)."""
    from posviz.workshop.training import RunStore
    from views._serving import result_files

    files = result_files()
    return RunStore(None if files is None else files.folder / RUNS_FOLDER)


@st.cache_data(show_spinner=False)
def quick_baselines(stamp: int) -> dict[str, dict]:
    """{"ALiBi (quick)": {multiple: bits per byte}} of the quick baselines (posviz/workshop/quick_runs.json), read
    once per version of the file (``stamp``: its mtime), not on every rerun of the page."""
    from posviz.display import display_name
    from posviz.workshop import drawing

    path = Path(drawing.__file__).with_name("quick_runs.json")
    if not path.is_file():
        return {}
    return {f"{display_name(name)} (quick)": run["bits_per_byte"] for name, run in json.loads(path.read_text()).items()
            if run.get("baseline")}


@st.cache_data(show_spinner=False)
def quick_baseline_seeds(stamp: int) -> dict[str, list[dict]]:
    """{"ALiBi (quick)": [{seed, bits_per_byte}, ...]}: each quick baseline over its training seeds, its own first."""
    from posviz.display import display_name
    from posviz.workshop import drawing

    path = Path(drawing.__file__).with_name("quick_runs.json")
    if not path.is_file():
        return {}
    return {f"{display_name(name)} (quick)": run.get("seeds") or [{"seed": None, "bits_per_byte": run["bits_per_byte"]}]
            for name, run in json.loads(path.read_text()).items() if run.get("baseline")}


def quick_baselines_stamp() -> int:
    from posviz.workshop import drawing

    path = Path(drawing.__file__).with_name("quick_runs.json")
    return path.stat().st_mtime_ns if path.is_file() else 0


def results() -> list[dict]:
    return st.session_state.setdefault(RESULTS_KEY, [])


def keep(job) -> None:
    """A finished job's checkpoint among the session's results (once: a run trained again is the same run); past the
    cap the oldest leaves the list. Its files stay in the server's store, which other visitors may be reading."""
    kept = [r for r in results() if r["folder"] != str(job.folder)]
    kept.append({"label": job.label, "folder": str(job.folder), "formula": job.options["formula"],
                 "scores": dict(job.scores), "message": job.message})
    st.session_state[RESULTS_KEY] = kept[-WORKSHOP_RESULTS_PER_SESSION:]


def yours() -> dict[str, str]:
    """{"yours: <label>": folder} of this session's trained formulas whose files are still there."""
    return {f"yours: {r['label']}": r["folder"] for r in results() if (Path(r["folder"]) / "config.json").is_file()}


def train_examples_ahead() -> int:
    """The six examples' quick runs trained into this server's store of runs (``make store``, the Docker build), so a
    visitor who presses Train on one gets its result at once; 0 when every one is stored."""
    from posviz.workshop.drawing import EXAMPLES
    from posviz.workshop.training import train_examples

    jobs = train_examples(run_store(), EXAMPLES)
    return 0 if all(job.status == "done" for job in jobs) else 1
