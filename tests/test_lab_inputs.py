"""Unit tests of posviz.lab_inputs (what every live lab reads: the text and the cached models)."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from posviz import lab_inputs
from posviz.errors import PosvizError
from posviz.limits import MAX_TEXT_BYTES


# ------------------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------------------
def test_prepare_text_rejects_empty_and_caps_huge_text():
    for empty in ("", "   \n\t ", b""):
        with pytest.raises(PosvizError, match="empty"):
            lab_inputs.prepare_text(empty)
    huge = lab_inputs.prepare_text("x" * (MAX_TEXT_BYTES + 10))
    assert len(huge) == MAX_TEXT_BYTES
    assert any(f"{MAX_TEXT_BYTES:,}" in n for n in huge.notices)
    plain = lab_inputs.prepare_text("def f():\n\treturn 1\n")
    assert plain.notices == () and plain.as_bytes() == b"def f():\n\treturn 1\n"
    odd = lab_inputs.prepare_text(b"ab\x00\x01c\xff")
    assert any("2 non-text" in n for n in odd.notices) and any("UTF-8" in n for n in odd.notices)


def test_characters_with_bits_groups_utf8_and_sums_bytes():
    data = "aé€".encode()  # 1 + 2 + 3 bytes
    bits = np.array([np.nan, 1.0, 2.0, 3.0, 4.0, 5.0])
    chars = lab_inputs.characters_with_bits(list(data), bits)
    assert [c for c, _ in chars] == ["a", "é", "€"]
    assert math.isnan(chars[0][1]) and chars[1][1] == 3.0 and chars[2][1] == 12.0
    broken = lab_inputs.characters_with_bits([0xFF, 0x41], np.array([1.0, 2.0]))
    assert broken == [("\ufffd", 1.0), ("A", 2.0)]


def test_moving_average_skips_nan():
    out = lab_inputs.moving_average(np.array([np.nan, 1.0, 3.0, np.nan, 5.0]), 3)
    assert out[0] == 1.0 and out[1] == 2.0 and out[2] == 2.0 and out[3] == 4.0 and out[4] == 5.0
    assert np.array_equal(lab_inputs.moving_average(np.array([1.0, 2.0]), 1), [1.0, 2.0])


# ------------------------------------------------------------------------------------------------
# Model cache
# ------------------------------------------------------------------------------------------------
def test_model_cache_is_keyed_and_bounded(tiny_models, monkeypatch):
    lab_inputs.clear_model_cache()
    folder = tiny_models / "rope"
    a = lab_inputs.get_model(folder)
    assert lab_inputs.get_model(folder) is a
    scaled = lab_inputs.get_model(folder, {"scaling": "linear", "factor": 2.0})
    assert scaled is not a and scaled.position.options.scaling == "linear"
    assert lab_inputs.get_model(folder, {"factor": 2.0, "scaling": "linear"}) is scaled  # key ignores dict order
    monkeypatch.setattr(lab_inputs, "CACHE_ENTRIES", 2)
    lab_inputs.get_model(tiny_models / "alibi")
    assert len(lab_inputs.cached_model_keys()) == 2
    assert lab_inputs.get_model(folder) is not a  # the oldest entry was evicted
    # a rewritten weights file gives a new stamp, so the model is reloaded
    before = lab_inputs.get_model(tiny_models / "alibi")
    weights = tiny_models / "alibi" / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert lab_inputs.get_model(tiny_models / "alibi") is not before
    lab_inputs.clear_model_cache()


def test_checkpoint_facts_match_the_loaded_model_without_loading_it(tiny_models_dir, tmp_path, monkeypatch):
    import json
    import shutil

    from posviz.checkpoint import shipped_checkpoints
    from posviz.errors import CheckpointError

    lab_inputs.clear_model_cache()
    for name, folder in shipped_checkpoints(tiny_models_dir).items():
        facts = lab_inputs.checkpoint_facts(folder)
        assert not lab_inputs.cached_model_keys(), "checkpoint_facts must not load the weights"
        model = lab_inputs.get_model(folder)
        assert facts == {"train_length": model.config.train_length, "n_layer": model.config.n_layer,
                         "n_head": model.config.n_head, "absolute": model.position.is_absolute,
                         "limit": model.position.max_positions, "cap": lab_inputs.length_cap(model)}, name
        lab_inputs.clear_model_cache()
    # a config typo and a missing weights file are named as for a load; damaged weights wait for the load
    for name in ("alibi", "t5", "rope"):
        shutil.copytree(tiny_models_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "alibi" / "config.json").read_text())
    config["model"]["max_distnace"] = 128
    (tmp_path / "alibi" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="max_distnace"):
        lab_inputs.checkpoint_facts(tmp_path / "alibi")
    (tmp_path / "t5" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        lab_inputs.checkpoint_facts(tmp_path / "t5")
    (tmp_path / "rope" / "model.safetensors").write_bytes(b"truncated")
    assert lab_inputs.checkpoint_facts(tmp_path / "rope")["train_length"] > 0
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        lab_inputs.get_model(tmp_path / "rope")


@pytest.mark.parametrize("threads, label", [(1, "CPU (1 thread)"), (2, "CPU (2 threads)")])
def test_the_cpu_label_counts_threads_in_words(threads, label, monkeypatch):
    import torch

    from posviz import limits

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert limits.device_label() == label
