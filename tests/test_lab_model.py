"""``posviz.models.interface``: the one interface the labs run, how a name becomes a model (once), and the
shipped checkpoints as its first kind (``posviz.models.shipped``)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import contextmanager

import pytest
import torch

from posviz.models import shipped as checkpoint_model, interface as lab_model
from posviz.labs import context_extension, extrapolation, inputs as lab_inputs, kv_cache, probes
from posviz.models.checkpoint_files import shipped_checkpoints
from posviz.errors import CheckpointError, PosvizError
from posviz.models.interface import LabModel, forget_models, open_model, opened_models
from posviz.limits import max_eval_length


@contextmanager
def counted():
    """Count the weights stamps read and the checkpoints loaded meanwhile."""
    counts = {"stamps": 0, "loads": 0}
    stamp, load = checkpoint_model.checkpoint_stamp, checkpoint_model.load_checkpoint

    def counting_stamp(*a, **k):
        counts["stamps"] += 1
        return stamp(*a, **k)

    def counting_load(*a, **k):
        counts["loads"] += 1
        return load(*a, **k)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint_model, "checkpoint_stamp", counting_stamp)
        patch.setattr(checkpoint_model, "load_checkpoint", counting_load)
        yield counts


def test_open_model_is_keyed_and_bounded(tiny_models, monkeypatch):
    forget_models()
    folder = tiny_models / "rope"
    a = open_model(folder)
    assert open_model(folder) is a and open_model("rope") is a  # a shipped name and its folder are one model
    scaled = open_model(folder, {"scaling": "linear", "factor": 2.0})
    assert scaled is not a and scaled.position.options.scaling == "linear"
    assert open_model(folder, {"factor": 2.0, "scaling": "linear"}) is scaled  # the key ignores dict order
    assert a.with_position_options({"scaling": "linear", "factor": 2.0}) is scaled
    monkeypatch.setattr(lab_model, "CACHE_ENTRIES", 2)
    open_model(tiny_models / "alibi")
    assert len(opened_models()) == 2
    assert open_model(folder) is not a  # the oldest entry was dropped
    # a rewritten weights file gives a new stamp, so the model is read again
    before = open_model(tiny_models / "alibi")
    weights = tiny_models / "alibi" / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert open_model(tiny_models / "alibi") is not before
    forget_models()


def test_an_unknown_name_says_what_a_model_can_be(tiny_models):
    with pytest.raises(PosvizError, match="shipped checkpoint's name, a checkpoint folder, a folder holding a transformers model, or a Hugging Face hub id"):
        open_model("no-such-model")


def test_a_model_describes_itself_without_loading_its_weights(tiny_models_dir, tmp_path):
    forget_models()
    for name, folder in shipped_checkpoints(tiny_models_dir).items():
        with counted() as counts:
            model = open_model(folder)
            facts = (model.name, model.method, model.train_length, model.n_layer, model.n_head, model.max_positions,
                     model.is_absolute, model.acts_on, model.is_shift_invariant(), model.length_cap)
            assert counts == {"stamps": 1, "loads": 0}, name
            model.load()
            assert counts["loads"] == 1
        net = model.net
        assert facts == (name, net.config.position, net.config.train_length, net.config.n_layer, net.config.n_head,
                         net.position.max_positions, net.position.is_absolute, net.position.acts_on,
                         net.position.is_shift_invariant(), max_eval_length(net.config.train_length)), name
    # a config typo and a missing weights file are named when the model is opened; damaged weights at its load
    for name in ("alibi", "t5", "rope"):
        shutil.copytree(tiny_models_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "alibi" / "config.json").read_text())
    config["model"]["max_distnace"] = 128
    (tmp_path / "alibi" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="max_distnace"):
        open_model(tmp_path / "alibi")
    (tmp_path / "t5" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        open_model(tmp_path / "t5")
    (tmp_path / "rope" / "model.safetensors").write_bytes(b"truncated")
    damaged = open_model(tmp_path / "rope")
    assert damaged.train_length > 0
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        damaged.load()
    forget_models()


def test_the_byte_kind_encodes_bytes_one_id_each(tiny_models):
    model = open_model(tiny_models / "rope")
    text = "café = 1\n".encode()
    ids = model.encode(text)
    assert ids.tolist() == list(text) and model.decode(ids) == text
    assert model.bytes_per_id(ids).tolist() == [1] * len(text)


def test_what_a_model_cannot_run_is_said_in_words(tiny_models):
    learned, rope = open_model(tiny_models / "learned"), open_model(tiny_models / "rope")
    assert rope.cannot_run(10_000) is None and learned.cannot_run(learned.max_positions) is None
    message = learned.cannot_run(learned.max_positions + 1)
    assert "learned" in message and f"{learned.max_positions:,} rows" in message


def test_a_lab_job_resolves_its_model_once(tiny_models, corpus):
    """The page resolves each model once; a job reads no stamp of its own and loads the weights once."""
    forget_models()
    text = lab_inputs.prepare_text(corpus.eval_documents[0]).as_bytes()
    with counted() as counts:
        model = open_model("rope")
        for length in (32, 64, 512):
            job = extrapolation.scoring_job(model, text, length, inspected=True, layer=1, log_scale=True)
            job.compute()
        assert counts == {"stamps": 1, "loads": 1}
    forget_models()


def test_the_extrapolation_page_reads_each_stamp_once_and_loads_what_it_runs(tiny_models):
    from streamlit.testing.v1 import AppTest

    from conftest import ROOT

    from posviz.display import INFERENCE_SWITCHES
    from posviz.positions.rope_remaps import ROPE_REMAPS

    forget_models()
    listed = len(shipped_checkpoints())
    with counted() as counts:
        at = AppTest.from_file(str(ROOT / "views" / "extrapolation.py"), default_timeout=60)
        at.query_params["models"] = "rope,alibi"
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    # each checkpoint, rope once more under each training-free remap (a model of its own, listed as rope+...) and nope
    # once more under each inference switch (nope+temperature)
    assert counts == {"stamps": listed + len(ROPE_REMAPS) + len(INFERENCE_SWITCHES), "loads": 2}
    forget_models()


# The layers a lab's numbers flow down, top to bottom. A call that goes back up to a layer it left
# (a lab calling the interface which calls the lab again) is what the interface is there to prevent.
LAYERS = {
    **{f"posviz.labs.{m}": 0 for m in ("extrapolation", "attention_maps", "kv_cache", "context_extension", "retrieval",
                                       "probes", "key_value", "generation", "compare")},
    "posviz.labs.scoring": 1, "posviz.training.evaluate": 1, "posviz.labs.inputs": 1,  # the shared scorer; the inputs
    "posviz.models.interface": 2, "posviz.models.shipped": 2,  # the interface and its kinds
    "posviz.models.checkpoint_files": 3,
}


def layer_of(module: str) -> int | None:
    if module in LAYERS:
        return LAYERS[module]
    network = ("posviz.models.byte_gpt", "posviz.models.attention", "posviz.models.kv_cache", "posviz.positions",
               "posviz.config")
    return 4 if module.startswith(network) else None


@contextmanager
def layer_paths():
    """Every path of posviz layers a call stack went through meanwhile (consecutive repeats collapsed)."""
    seen, stack = set(), []

    def profile(frame, event, arg):
        if event == "call":
            stack.append(layer_of(frame.f_globals.get("__name__", "")))
            path = []
            for layer in stack:
                if layer is not None and (not path or path[-1] != layer):
                    path.append(layer)
            seen.add(tuple(path))
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def test_numbers_flow_down_the_layers_without_coming_back(tiny_models, corpus):
    forget_models()
    text = lab_inputs.prepare_text(corpus.eval_documents[0]).as_bytes()
    rope, alibi = open_model("rope"), open_model("alibi")
    with layer_paths() as paths:
        extrapolation.scoring_job(rope, text, 64, True, 1, True).compute()
        kv_cache.sliding_score(alibi, alibi.encode(text), 16, "shifted_cache", 40)
        context_extension.rope_scaling_curves(rope, 2.0, rope.encode(text), [32, 64], ["linear", "dynamic"])
        probes.repeat_probe(alibi, alibi.encode(text), [0, 32], chunks=2)
    assert any(path[:3] == (0, 1, 2) for path in paths)  # the tracing saw the layers
    returning = [path for path in paths if list(path) != sorted(path)]
    assert not returning, returning[:5]
    forget_models()


def test_a_gpt_in_memory_is_a_lab_model_too():
    from conftest import tiny_model

    net = tiny_model("alibi")
    model = checkpoint_model.as_lab_model(net)
    assert isinstance(model, LabModel) and model.method == "alibi" and model.stored_metrics() == {}
    ids = torch.arange(20) % 256
    assert torch.equal(model(ids[None]).logits, net(ids[None]).logits)
