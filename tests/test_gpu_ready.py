"""What the CUDA path needs, checked on the CPU (CI has no GPU): see issue #22.

* every attention mask handed to SDPA can be read in place by the CUDA memory-efficient kernel, or
  is one PyTorch copies first; a mask read in place must start on a 16-byte boundary, else the
  kernel fails with "misaligned address", which breaks every later GPU call of the process;
* (more below) no host reads in a forward pass or a decoding step; training precision.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import posviz.models.attention as attention_module
import posviz.models.byte_gpt as model_module
from posviz.models.kv_cache import KVCache
from maths_support import text_ids  # noqa: F401 (a fixture)
from test_properties import VARIANT_IDS, VARIANTS, model_for, random_bytes

BIAS_VARIANTS = [pytest.param(m, o, id=i) for (m, o), i in zip(VARIANTS, VARIANT_IDS)
                 if model_for(m, o).position.has_logit_bias]


def _read_in_place(mask: torch.Tensor) -> bool:
    """Whether PyTorch hands ``mask`` to the memory-efficient kernel as it is (its own check looks at
    the strides only: every stride but the last a multiple of 8 elements in some releases, of 16 and
    a last dimension of a multiple of 16 in others; we take the looser of the two)."""
    return mask.stride(-1) == 1 and all(s % 8 == 0 for s in mask.stride()[:-1])


@pytest.fixture()
def masks(monkeypatch):
    """Every floating attn_mask the model hands to SDPA, with the function that handed it in."""
    seen, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        if attn_mask is not None and attn_mask.is_floating_point():  # a bool mask is converted (copied) first
            seen.append((sys._getframe(1).f_code.co_name, attn_mask))
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    return seen


@pytest.mark.parametrize("method,options", BIAS_VARIANTS)
@pytest.mark.parametrize("block_elements", [None, 1 << 10], ids=["one-block", "many-blocks"])
def test_every_attention_mask_is_aligned_where_it_is_read_in_place(method, options, block_elements, masks, monkeypatch):
    if block_elements is not None:  # many blocks of a few rows: their views start at many offsets
        monkeypatch.setattr(attention_module, "BLOCK_ELEMENTS", block_elements)
    model = model_for(method, options, train_length=64)
    with torch.no_grad():
        for T in (48, 37, 61):  # 48: widths that pass PyTorch's stride check, with blocks off a boundary
            model(random_bytes(1, T))
            model(random_bytes(2, T), attention_layer=0)
        for window in (None, 6):
            if window is not None and model.position.max_positions is not None:
                continue
            cache = KVCache(model.config.n_layer, max_size=window)
            model(random_bytes(1, 21), cache=cache)
            for t in range(5):  # decoding steps at keys 22..26: masks of every width modulo 4
                model(random_bytes(1, 1, seed=t), cache=cache)
    assert masks, "no bias path ran: the spy saw no mask"
    for caller, mask in masks:
        assert mask.stride(-1) == 1, f"{caller}: mask not contiguous in its last dimension, strides {mask.stride()}"
        if _read_in_place(mask):
            assert mask.data_ptr() % 16 == 0, (f"{caller}: mask {tuple(mask.shape)} strides {mask.stride()} is read "
                                               f"in place but starts {mask.data_ptr() % 16} bytes off a 16-byte boundary")
    if method in ("shaw", "nezha"):  # the banded path's masks are views that are read in place, never copied
        banded = [m for caller, m in masks if caller == "_attend_banded"]
        assert banded and all(all(s % 16 == 0 for s in m.stride()[:-1]) for m in banded)


# ------------------------------------------------------------------------------------ host reads

# Each of these waits for the GPU to finish everything queued before it (or, like nonzero, has a
# shape that depends on values, which needs the same wait).
HOST_READS = {"item", "__int__", "__bool__", "__float__", "__index__", "tolist", "numpy", "cpu", "nonzero",
              "equal", "allclose", "unique", "masked_select"}


class HostReads(TorchFunctionMode):
    """Records every tensor operation that reads a value back to the host, with the function that asked.

    The tensors are on the CPU here, as if on a device: what ``.cpu()`` returns, and whatever is
    computed from it, counts as on the host, where reading is free (the one read was the ``.cpu()``)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        inputs = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        on_host = any(getattr(a, "_on_host", False) for a in inputs)
        if name in HOST_READS and not on_host:
            self.reads.append((name, sys._getframe(1).f_code.co_name))
        out = func(*args, **(kwargs or {}))
        if on_host or name == "cpu":
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor):
                    t._on_host = True
        return out


# The one read left in a forward pass (none in a decoding step): FIRE past its threshold L finds the
# few columns of a block whose rows straddle a switch point of its MLP with ``nonzero``, a shape that
# depends on values. Doing without it means looking every (query, key) pair up, the cost
# ``bias_of_runs`` exists to avoid (4x the whole pass at 16x the training length).
ALLOWED_IN_A_FULL_PASS = {("nonzero", "bias_of_runs")}


@pytest.mark.parametrize("method,options", [pytest.param(m, o, id=i) for (m, o), i in zip(VARIANTS, VARIANT_IDS)])
def test_a_forward_pass_and_a_decoding_step_read_nothing_back_to_the_host(method, options, monkeypatch):
    monkeypatch.setattr(model_module, "_reads_are_free", lambda t: False)  # as on a GPU: the CPU's checks stay off
    model = model_for(method, options)
    idx = random_bytes(2, 29)
    with torch.no_grad():
        model(idx)  # a first pass may read what is kept across passes while the weights stay (FIRE's L)
        with HostReads() as full:
            model(idx)
            model(idx, attention_layer=1)
        windows = [None] if model.position.max_positions is not None else [None, 6]
        steps = HostReads()
        for window in windows:
            cache = KVCache(model.config.n_layer, max_size=window)
            with full:
                model(idx[:, :20], cache=cache)  # the prompt: a full pass
            for t in range(20, 29):
                with steps:
                    model(idx[:, t:t + 1], cache=cache)
                    model(idx[:, t:t + 1], positions=t, cache=KVCache(model.config.n_layer))
    assert set(full.reads) <= ALLOWED_IN_A_FULL_PASS, f"host reads in a forward pass: {full.reads}"
    assert not steps.reads, f"host reads while decoding: {steps.reads}"


@pytest.mark.parametrize("method,options", [pytest.param(m, o, id=i) for (m, o), i in zip(VARIANTS, VARIANT_IDS)])
def test_a_training_step_reads_nothing_back_but_fire_threshold(method, options, monkeypatch):
    """Forward and backward of a training step. FIRE reads its L once per layer (per FIRE): whether
    every query is below L picks its bias path, and in training L changes at every step. Kept, not
    replaced, so that training numerics stay exactly as they were (a FIRE checkpoint is trained so)."""
    monkeypatch.setattr(model_module, "_reads_are_free", lambda t: False)
    model = model_for(method, options).train()
    idx = random_bytes(2, 29)
    with HostReads() as spy:
        model.loss(idx, idx).backward()
    expected = 0 if method != "fire" else len(model.position.functions)
    assert len(spy.reads) == expected and all(name == "__float__" for name, _ in spy.reads), spy.reads


@pytest.mark.parametrize("scaling", ["none", "dynamic"])
def test_rope_copies_its_frequencies_to_a_device_only_when_they_change(scaling):
    """A copy from the CPU to a GPU waits for the GPU's queue (``make gpu-check`` caught one per decoding
    step): the rotary speeds, computed on the CPU, go to a device once and are reused while they stay the
    same. The meta device stands in for a GPU (a copy there makes a new tensor, as on a GPU)."""
    from posviz.positions import ModelShape, build_position_method

    shape = ModelShape(n_layer=1, n_head=2, head_dim=16, n_embd=32, train_length=32)
    rope = build_position_method("rope", shape, {"scaling": scaling, "factor": 4.0})
    meta = torch.device("meta")
    first = rope._on_device(rope.frequencies(10)[0], meta)
    assert first.device == meta
    assert rope._on_device(rope.frequencies(11)[0], meta) is first  # a decoding step: the same speeds, no copy
    far = rope._on_device(rope.frequencies(4 * 32)[0], meta)  # past the trained context dynamic NTK slows them
    assert (far is first) == (scaling == "none")
    cpu = rope.frequencies(10)[0]
    assert rope._on_device(cpu, torch.device("cpu")) is cpu


def test_the_host_read_spy_sees_the_reads_it_is_meant_to_catch():
    t = torch.arange(3)
    with HostReads() as spy:
        int(t[0]), bool(t[1]), t.max().item(), t.tolist(), torch.nonzero(t)
        host = t.cpu()  # (on the CPU the very same tensor: from here on it counts as on the host)
        int(host[0]), host.sum().item()
    assert [name for name, _ in spy.reads] == ["__int__", "__bool__", "item", "tolist", "nonzero", "cpu"]


# ------------------------------------------------------------------------------ training precision

def test_the_training_precision_is_a_rule_not_a_timing(monkeypatch):
    from posviz.training import train as train_module

    monkeypatch.setattr(train_module.time, "perf_counter", lambda: pytest.fail("the precision was timed"))
    cpu = torch.device("cpu")
    assert train_module.pick_precision(train_module.TrainConfig(precision="auto"), cpu) == {"precision": "fp32", "asked": "auto"}
    assert train_module.precision_rule("bf16", cpu) == "bf16" and train_module.precision_rule("fp32", cpu) == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert train_module.precision_rule("auto", torch.device("cuda", 0)) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert train_module.precision_rule("auto", torch.device("cuda", 0)) == "fp32"


def test_a_resume_in_another_precision_is_refused(tmp_path, monkeypatch):
    """"auto" resolves by device, so one recipe may resolve differently on the machine that resumes."""
    from posviz.training import train as train_module
    from posviz.errors import PosvizError
    from test_train_cli import small_recipe

    cfg = small_recipe(precision="auto", tokens=4 * 32 * 4)
    monkeypatch.setattr(train_module, "precision_rule", lambda asked, device: "bf16")  # as on a GPU
    train_module.train(cfg, tmp_path / "out", progress=False, state_dir=tmp_path / "state", stop_after=1)
    assert json.loads((tmp_path / "state" / "state.json").read_text())["precision"] == "bf16"
    monkeypatch.setattr(train_module, "precision_rule", lambda asked, device: "fp32")  # as on a CPU
    with pytest.raises(PosvizError, match=r"trained in bf16 but this run would train in fp32"):
        train_module.train(cfg, tmp_path / "out", progress=False, state_dir=tmp_path / "state", resume=True)


def test_fire_runs_its_mlp_in_fp32_under_bf16_autocast():
    """Training under bf16 autocast must see the u that inference (fp32) sees, not u rounded to 2^-8."""
    model = model_for("fire", {})
    fn = model.position.function(0)
    u = torch.rand(5, 7, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = fn.bias_of(u)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under_autocast = fn.bias_of(u)
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, reference, rtol=0, atol=0)


def test_the_decoding_labs_read_once_per_byte_at_most(text_ids, monkeypatch):
    """The labs' loops around the model: the sliding-window lab reads nothing until it is done, the
    generator one vector of logits per byte (the byte has to come back to be shown)."""
    from posviz.labs import generation, kv_cache

    from posviz.models.shipped import as_lab_model

    monkeypatch.setattr(model_module, "_reads_are_free", lambda t: False)
    model = as_lab_model(model_for("alibi", {}))
    for strategy in kv_cache.STRATEGIES:
        with HostReads() as spy:
            result = kv_cache.sliding_score(model, text_ids, 8, strategy, n_ids=30)
        assert result.error is None and np.isfinite(result.bpb)
        assert [name for name, _ in spy.reads] == ["cpu"], (strategy, spy.reads)  # the bits, once at the end
    decoder = generation.Decoder(model, text_ids[:16].tolist(), generation.DecodeSettings(new_ids=40, strategy="stop"))
    decoder.step()  # the prompt
    with HostReads() as spy:
        for _ in range(20):
            decoder.step()
    assert spy.reads == [("cpu", "step")] * 20


# ------------------------------------------------------------------------------ devices and backends

def test_nccl_only_when_training_on_cuda(monkeypatch):
    from posviz.training.train import backend_for

    assert backend_for("cpu") == "gloo" and backend_for("cuda") == "nccl" and backend_for("cuda:1") == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine told to train on the CPU
    assert backend_for("cpu") == "gloo" and backend_for("auto") == "nccl"


def test_the_command_line_tools_load_checkpoints_on_the_device_asked_for(monkeypatch):
    from posviz.training import evaluate, evaluate_all
    from posviz.models.checkpoint_files import shipped_checkpoints
    from posviz.limits import resolve_device

    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    asked = []

    class Stop(Exception):
        pass

    def fake_load(folder, *args, device="cpu", **kwargs):
        asked.append(torch.device(device))
        raise Stop

    import posviz.models.checkpoint_files as checkpoint_module
    import posviz.models.shipped as checkpoint_model
    from posviz.models.interface import forget_models
    forget_models()  # a model opened earlier on another device would not load again
    monkeypatch.setattr(checkpoint_module, "load_checkpoint", fake_load)
    monkeypatch.setattr(checkpoint_model, "load_checkpoint", fake_load)  # the evaluate CLI opens models as the labs do
    monkeypatch.setattr(evaluate_all, "load_checkpoint", fake_load)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine: auto is CUDA
    with pytest.raises(Stop):
        evaluate.main(["--checkpoint", "models/alibi"])
    with pytest.raises(Stop):
        evaluate.main(["--checkpoint", "models/alibi", "--device", "cpu"])
    if shipped_checkpoints():
        with pytest.raises(Stop):
            evaluate_all.main(["--probes-only"])
    assert asked[:2] == [torch.device("cuda"), torch.device("cpu")] and all(d.type == "cuda" for d in asked[2:])
    assert len(asked) == (3 if shipped_checkpoints() else 2)


def test_make_gpu_check_runs_the_cuda_tests_and_make_test_does_not():
    import configparser
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    ini = configparser.ConfigParser()
    ini.read(root / "pytest.ini")
    assert '-m "not cuda"' in ini["pytest"]["addopts"] and "cuda:" in ini["pytest"]["markers"]
    recipe = subprocess.run(["make", "-n", "gpu-check", "TEST_STAMP="], cwd=root, capture_output=True, text=True,
                            check=True).stdout
    assert "torch.cuda.is_available()" in recipe and "-m pytest -m cuda tests/test_gpu.py" in recipe
    if not torch.cuda.is_available():  # the check that runs first fails, saying why
        check = next(line for line in recipe.splitlines() if "torch.cuda.is_available()" in line)
        done = subprocess.run(check.replace(".venv/bin/python", sys.executable, 1), shell=True, cwd=root,
                              capture_output=True, text=True)
        assert done.returncode != 0 and "make gpu-check: no CUDA device" in done.stderr
