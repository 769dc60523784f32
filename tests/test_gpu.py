"""The checks that need a CUDA GPU (issue #22): ``make gpu-check`` runs them, CI (no GPU) does not collect
them (pytest.ini deselects the ``cuda`` marker). Without CUDA every test here fails, saying so, so that a
``make gpu-check`` on the wrong machine cannot pass by skipping.

* every lab function on CUDA equals the CPU to 1e-4 (fp32 on both);
* cached decoding equals the full forward pass, for every method; no host sync in a decoding step;
* Shaw and NEZHA at lengths whose mask views start off a 16-byte boundary (the "misaligned address" crash);
* a short training run in each precision.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
import torch

import posviz.models.attention as attention_module
from conftest import decode_in_chunks
from posviz.models.kv_cache import KVCache
from test_properties import VARIANT_IDS, VARIANTS, model_for, random_bytes

pytestmark = pytest.mark.cuda
TOL = 1e-4
CUDA = torch.device("cuda")
ALL = [pytest.param(m, o, id=i) for (m, o), i in zip(VARIANTS, VARIANT_IDS)]


@pytest.fixture(autouse=True)
def needs_cuda():
    if not torch.cuda.is_available():
        pytest.fail("this test needs a CUDA GPU: torch.cuda.is_available() is False (run `make gpu-check` on a GPU machine)")
    # fp32 on the GPU must be fp32: TF32 matmuls would differ from the CPU by ~1e-3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def pair(method, options=None, **overrides):
    """The same weights on the CPU and on the GPU."""
    cpu = model_for(method, options, **overrides)
    gpu = model_for(method, options, **overrides).to(CUDA)
    return cpu, gpu


def timed(name) -> bool:
    """A field or key that holds a wall-clock time (seconds, ms, ms_per_byte, cached_ms_per_byte, ...)."""
    return re.search(r"(^|_)(ms|seconds)(_|$)", str(name)) is not None


def assert_same(a, b, what=""):
    """Recursively equal to TOL: dataclasses, dicts, sequences, arrays, tensors, numbers (timings skipped)."""
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            if not timed(f.name):
                assert_same(getattr(a, f.name), getattr(b, f.name), f"{what}.{f.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            if not timed(k):
                assert_same(a[k], b[k], f"{what}[{k!r}]")
    elif isinstance(a, (list, tuple)) and not (a and isinstance(a[0], (int, float)) and not isinstance(a[0], bool)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what}[{i}]")
    elif a is None or isinstance(a, (str, bool)):
        assert a == b, what
    else:
        x = a.detach().cpu().double().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, dtype=float)
        y = b.detach().cpu().double().numpy() if isinstance(b, torch.Tensor) else np.asarray(b, dtype=float)
        np.testing.assert_allclose(y, x, rtol=0, atol=TOL, equal_nan=True, err_msg=what)


@pytest.fixture(scope="module")
def text(corpus):
    from posviz.labs import inputs as lab_inputs
    return lab_inputs.prepare_text(corpus.eval_documents[0][:4096]).ids


@pytest.mark.parametrize("method,options", ALL)
def test_every_lab_function_on_cuda_equals_the_cpu(method, options, text, monkeypatch):
    from posviz import limits
    from posviz.labs import attention_maps, extrapolation, generation, key_value, kv_cache, probes

    from posviz.models.shipped import as_lab_model

    # A GPU's length cap is larger (32 x the trained context, not 16), so it scores more windows of the same
    # text: held to the CPU's here, the two devices do the same work and must give the same numbers.
    monkeypatch.setattr(limits, "MAX_LENGTH_MULTIPLE_GPU", limits.MAX_LENGTH_MULTIPLE_CPU)

    cpu, gpu = (as_lab_model(net) for net in pair(method, options))  # the labs run LabModels
    L = cpu.train_length
    lengths = [L, 4 * L] if cpu.max_positions is None else [L]
    for length in lengths:
        assert_same(extrapolation.score_at_length(cpu, text, length), extrapolation.score_at_length(gpu, text, length),
                    f"score_at_length({length})")
        assert_same(extrapolation.inspect_at_length(cpu, text, length, 1), extrapolation.inspect_at_length(gpu, text, length, 1),
                    f"inspect_at_length({length})")
        assert_same(attention_maps.attention_view(cpu, text, length, 0), attention_maps.attention_view(gpu, text, length, 0),
                    f"attention_view({length})")
    assert_same(attention_maps.attention_growth(cpu, text, [16, L], 1), attention_maps.attention_growth(gpu, text, [16, L], 1))
    assert_same(kv_cache.cache_check(cpu, text, 2 * L if cpu.max_positions is None else L, time_reencode=False),
                kv_cache.cache_check(gpu, text, 2 * L if cpu.max_positions is None else L, time_reencode=False),
                "cache_check")
    for strategy in kv_cache.STRATEGIES:
        assert_same(kv_cache.sliding_score(cpu, text, L // 2, strategy, n_ids=2 * L),
                    kv_cache.sliding_score(gpu, text, L // 2, strategy, n_ids=2 * L), f"sliding_score({strategy})")
    gaps = [0, L, 2 * L]
    assert_same(probes.repeat_probe(cpu, text, gaps, chunk=16, chunks=4), probes.repeat_probe(gpu, text, gaps, chunk=16, chunks=4))
    assert_same(key_value.key_value_probe(cpu, text, gaps, trials=4), key_value.key_value_probe(gpu, text, gaps, trials=4))
    assert_same(probes.induction_scores(cpu, text, gaps, chunk=16, chunks=4),
                probes.induction_scores(gpu, text, gaps, chunk=16, chunks=4))
    assert_same(probes.copy_probe(cpu, text, [0, 16]), probes.copy_probe(gpu, text, [0, 16]))
    settings = generation.DecodeSettings(new_ids=2 * L)  # greedy: the same bytes where the logits agree
    a, b = generation.generate(cpu, text[:L], settings), generation.generate(gpu, text[:L], settings)
    assert a.ids == b.ids and a.error == b.error
    assert_same(a.surprisal, b.surprisal, "surprisal")


@pytest.mark.parametrize("method,options", ALL)
@pytest.mark.parametrize("block_elements", [None, 1 << 12], ids=["cuda-blocks", "many-blocks"])
def test_cached_decoding_on_cuda_equals_the_full_forward(method, options, block_elements, monkeypatch):
    if block_elements is not None:
        monkeypatch.setattr(attention_module, "BLOCK_ELEMENTS_CUDA", block_elements)
    _, gpu = pair(method, options)
    idx = random_bytes(2, 29).to(CUDA)
    with torch.no_grad():
        full = gpu(idx).logits
        for chunks in ([29], [20] + [1] * 9, [7, 7, 7, 8]):
            torch.testing.assert_close(decode_in_chunks(gpu, idx, chunks), full, rtol=0, atol=TOL)


@pytest.mark.parametrize("method,options", ALL)
def test_a_decoding_step_on_cuda_does_not_synchronise(method, options):
    _, gpu = pair(method, options)
    T = gpu.config.train_length  # within every method's reach (a learned table has train_length rows)
    idx = random_bytes(1, T).to(CUDA)
    with torch.no_grad():
        cache = KVCache(gpu.config.n_layer)
        gpu(idx[:, :T - 10], cache=cache)
        gpu(idx[:, T - 10:T - 9], cache=cache)  # a first step may read what is kept across steps (FIRE's L)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
        try:
            for t in range(T - 9, T):
                gpu(idx[:, t:t + 1], cache=cache)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("method", ["shaw", "nezha"])
@pytest.mark.parametrize("length", [768, 1536, 3072])
def test_banded_masks_at_lengths_that_start_blocks_off_a_boundary(method, length, monkeypatch):
    """The Extrapolation stops that would give "misaligned address"; also many blocks of odd sizes."""
    cpu, gpu = pair(method, {}, train_length=64)
    idx = random_bytes(1, length)
    for block in (None, 1 << 16):
        if block is not None:
            monkeypatch.setattr(attention_module, "BLOCK_ELEMENTS_CUDA", block)
        with torch.no_grad():
            torch.testing.assert_close(gpu(idx.to(CUDA)).logits.cpu(), cpu(idx).logits, rtol=0, atol=TOL)
        torch.cuda.synchronize()  # a misaligned read surfaces here at the latest


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_short_training_run_on_cuda_in_each_precision(precision, tmp_path):
    from posviz.training.train import train
    from test_train_cli import small_recipe

    metrics = train(small_recipe(precision=precision, device="cuda", tokens=4 * 32 * 6, warmup_steps=1),
                    tmp_path / precision, progress=False, state_dir=tmp_path / "state")
    trained_on = json.loads((tmp_path / precision / "config.json").read_text())["trained_on"]
    assert trained_on["precision"] == precision and trained_on["device"].startswith("cuda")
    curve = [row["train_bpb"] for row in metrics["train_curve"]]
    assert all(math.isfinite(b) for b in curve) and curve[-1] < curve[0]


def test_auto_precision_on_this_gpu_is_bf16_where_it_is_supported():
    from posviz.training.train import precision_rule

    assert precision_rule("auto", CUDA) == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
