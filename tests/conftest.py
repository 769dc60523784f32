"""Shared fixtures: small *real* checkpoints for every registered method, built once per session.

They are randomly initialised (no training), saved and evaluated with the same code that builds the
shipped set, so pages and labs can be tested quickly without depending on the shipped weights.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "2")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on the 2 cores: one thread each, and
    os.environ["OMP_NUM_THREADS"] = "1"  # the same for the servers a worker starts
    torch.set_num_threads(1)
# The servers and pages under test keep their result files (posviz.result_files) in a folder of this run's
# own: never the checkout's .posviz-store, whose stale editions a test's server would otherwise remove,
# and never results an earlier run computed.
# One folder per pytest-xdist worker: each test empties it when it ends (fresh_shared_results), and the other
# worker's test would lose what it wrote meanwhile (a Workshop run's folder, between two of its page switches).
def _run_folder(prefix: str) -> str:
    """A temporary folder of this process, removed when it exits (a run left 0.5 GB of dequantised GGUF behind)."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


if "posviz-test-store-" in os.environ.get("POSVIZ_STORE", "posviz-test-store-"):  # unset, or the controller's
    os.environ["POSVIZ_STORE"] = _run_folder("posviz-test-store-")
# The servers the tests start do not warm themselves up (views/_serving.warm_the_store): each warm-up is up
# to 90 s of background work on the 2 cores the whole suite shares, which made the browser tests beside it
# slower and the suite longer than its 10 minutes. tests/test_warm.py starts its server with the warm-up on.
os.environ.setdefault("POSVIZ_WARM", "0")
# GGUF files are dequantised into this run's own folder: the conversion is tested, never an earlier run's copy.
# Made by the first process (pytest-xdist's controller), whose workers inherit it: one conversion per run.
if not os.environ.get("POSVIZ_GGUF_CACHE"):
    os.environ["POSVIZ_GGUF_CACHE"] = _run_folder("posviz-test-gguf-")
# The slide PNG's font is cut from Streamlit's file into this run's own folder too (posviz/slide_font.py: about 8 s)
if not os.environ.get("POSVIZ_FONT_DIR"):
    os.environ["POSVIZ_FONT_DIR"] = _run_folder("posviz-test-font-")

from posviz.models.checkpoint_files import read_metrics, save_checkpoint, write_metrics  # noqa: E402


def _scan_installed_components_once() -> None:
    """Each new AppTest scans the metadata of every installed distribution for Streamlit components before its first
    run (streamlit.components.v2.manifest_scanner: 0.27 s of a 0.37 s page run here, for each of the suite's AppTests).
    The installed packages do not change during a run, so each process scans once; what a run finds is the same."""
    import functools

    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:  # another Streamlit: nothing to spare
        return
    if not hasattr(manifest_scanner.scan_component_manifests, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.lru_cache(maxsize=1)(
            manifest_scanner.scan_component_manifests)


_scan_installed_components_once()
from posviz.config import ModelConfig  # noqa: E402
from posviz.training.data import load_corpus  # noqa: E402
from posviz.training.evaluate import evaluate_checkpoint  # noqa: E402
from posviz.models.byte_gpt import GPT  # noqa: E402
from posviz.positions import method_names  # noqa: E402
from posviz.labs.probes import copy_check  # noqa: E402
from hf_tiny import hf_family_dir  # noqa: E402,F401  (tiny published-model families, saved as on the hub)

TINY = dict(n_layer=2, n_head=4, n_embd=32, train_length=32)


def tiny_model(method: str, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(position=method, **{**TINY, **overrides})
    return GPT(cfg).eval()


def described(method: str):
    """The method as a tiny model configures it: its facts (``is_shift_invariant``) without building a model."""
    from posviz.positions import ModelShape, build_position_method

    cfg = ModelConfig(position=method, **TINY)
    return build_position_method(method, ModelShape(cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd, cfg.train_length))


def decode_in_chunks(model: GPT, idx: torch.Tensor, chunks, window: int | None = None) -> torch.Tensor:
    """Logits of ``idx`` fed through one KV cache in pieces of the given sizes, concatenated."""
    from posviz.models.kv_cache import KVCache

    cache, outputs, start = KVCache(model.config.n_layer, max_size=window), [], 0
    for size in chunks:
        outputs.append(model(idx[:, start:start + size], cache=cache).logits)
        start += size
    return torch.cat(outputs, dim=1)


@pytest.fixture(scope="session")
def corpus():
    return load_corpus()


def build_tiny_checkpoint(folder: Path, seed: int, method: str, corpus, data) -> None:
    """One tiny checkpoint of ``method``, saved and evaluated as the shipped set is, complete with metrics.json."""
    model = tiny_model(method, seed=seed)
    save_checkpoint(model, folder, {"train": {"method": method, "note": "untrained test checkpoint"}},
                    {"val_bpb_at_train_length": None, "parameters": model.num_parameters(), "train_curve": []})
    metrics = read_metrics(folder)
    metrics["eval"] = evaluate_checkpoint(folder, data, multiples=(1, 2, 4, 8, 16), copy_gaps=(0, 16, 64),
                                          progress=False, probe_chunks=4)
    metrics["val_bpb_at_train_length"] = metrics["eval"]["nonoverlapping_bpb"][str(TINY["train_length"])]
    check = copy_check(model, corpus.validation)  # what training logs at each saved state (None: too short)
    metrics["copy_curve"] = [] if check is None else [{"step": 1, "tokens": 128, **check}]
    # A two-point training log, as a training run writes it (the About page draws it): the untrained
    # model's own validation bits/byte, at the start and after one stand-in step.
    bpb = metrics["val_bpb_at_train_length"]
    metrics["train_curve"] = [{"step": 0, "tokens": 0, "train_bpb": bpb},
                              {"step": 1, "tokens": 4 * TINY["train_length"], "train_bpb": bpb}]
    write_metrics(folder, metrics)


TINY_BUILD_TIMEOUT_S = 1800


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory, corpus) -> Path:
    """A models/ folder with one tiny checkpoint per method, complete with metrics.json.

    Under pytest-xdist the workers build one folder together (the run's shared temporary root): each claims a
    method no one has claimed yet (a file created exclusively), builds it aside and moves it in whole, then waits
    for the others'. Two workers halve the minute it takes; a worker that never asks for it leaves the other to
    build them all. Every checkpoint is the same whoever builds it (its seed is its place in the registry)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        base = tmp_path_factory.mktemp("tiny")
    else:
        base = tmp_path_factory.getbasetemp().parent / "tiny-shared"
    root, building, claims = base / "models", base / "building", base / "claims"
    for folder in (root, building, claims):
        folder.mkdir(parents=True, exist_ok=True)
    data = corpus.eval_stream(1 << 12)
    methods = method_names()
    for i, method in enumerate(methods):
        try:
            os.close(os.open(claims / method, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue  # another worker builds this one
        build_tiny_checkpoint(building / method, i, method, corpus, data)
        os.replace(building / method, root / method)  # whole, or not there
    import time

    deadline = time.monotonic() + TINY_BUILD_TIMEOUT_S
    while not all((root / m / "metrics.json").is_file() for m in methods):
        if time.monotonic() > deadline:
            missing = [m for m in methods if not (root / m / "metrics.json").is_file()]
            raise TimeoutError(f"the other test worker did not finish the tiny checkpoints of {missing}")
        time.sleep(0.2)
    return root


@pytest.fixture()
def tiny_models(tiny_models_dir, monkeypatch) -> Path:
    """Point the app and posviz.models.checkpoint_files.models_dir() at the tiny checkpoints."""
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(tiny_models_dir))
    return tiny_models_dir


@pytest.fixture(autouse=True)
def fresh_shared_results():
    """Each test starts with an empty server-wide store of live results (views/_serving.py keeps one per
    process, as a server does) and no result files on disk (a warm-up run in this process writes them): a
    result left by another test would hide the computation a test checks."""
    yield
    import shutil
    import sys

    shared = sys.modules.get("views._serving")
    if shared is not None:
        shared.shared_results.clear()
        shared.work_queue.clear()
    store = Path(os.environ["POSVIZ_STORE"])
    if store.is_dir():  # a test's server may still be writing here: whatever it writes meanwhile is let be
        for entry in store.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def tiny_lab(method: str, seed: int = 0, **overrides):
    """``tiny_model`` as the labs take it: a LabModel (posviz.models.interface) around the GPT."""
    from posviz.models.shipped import as_lab_model

    return as_lab_model(tiny_model(method, seed, **overrides))


def pytest_configure(config):
    """Per-file test times of a whole run, for docs/testing.md (tests/file_times.py)."""
    from file_times import Recorder

    config.pluginmanager.register(Recorder(), "posviz-file-times")
