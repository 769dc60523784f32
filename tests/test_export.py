"""posviz.export: checkpoints as Hugging Face transformers models, with the byte-level tokenizer.

Each export is loaded the way a user would load it (``AutoModelForCausalLM`` / ``AutoTokenizer`` on
the folder alone) and run by transformers directly on real text, then compared with posviz's own
forward pass: logits, bits/byte, lengths past the training length, and transformers' cached decoding.
Small random models keep most of this fast; one test runs the exports shipped in models/hf.
Tolerances and why they differ per architecture: see the docstrings of posviz/models/export.py.
"""
from __future__ import annotations

import inspect
import json
import math
import shlex

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import ROOT, tiny_model
from posviz.models.checkpoint_files import load_checkpoint, save_checkpoint, shipped_checkpoints
from posviz.errors import PosvizError
from posviz.models.export import EXPORT_INFO, byte_tokenizer, export_alibi, export_checkpoint, export_gpt2, export_neox, main
from posviz.positions import method_names

EXPORTS = {"learned": export_gpt2, "rope": export_neox, "alibi": export_alibi}
ARCHITECTURES = {"learned": "GPT2LMHeadModel", "rope": "GPTNeoXForCausalLM", "alibi": "BloomForCausalLM"}
# Real text with non-ASCII characters (shlex's wordchars hold Latin-1 letters): 13 kB of the stdlib.
TEXT = inspect.getsource(shlex)
TEXT_IDS = torch.tensor(list(TEXT.encode("utf-8")))
SHIPPED_EXPORTS = {"learned": "learned-gpt2", "rope": "rope-neox", "alibi": "alibi-bloom"}


def bits_per_byte(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Mean bits per predicted byte: logits (1, T, V) predict ids[1:T+1]."""
    T = logits.shape[1]
    return float(F.cross_entropy(logits[0].double(), ids[1:T + 1])) / math.log(2)


def load_hf(folder, attn: str | None):
    kw = {} if attn is None else {"attn_implementation": attn}
    return AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, **kw).eval()


def cached_decode(hf, ids: torch.Tensor, prefix: int) -> torch.Tensor:
    """transformers' logits for ids (1, T): the first ``prefix`` bytes at once, then one byte per step
    through its KV cache (``cache`` in transformers >= 5.24, ``past_key_values`` before)."""
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    out = hf(ids[:, :prefix], use_cache=True)
    logits = [out.logits]
    for t in range(prefix, ids.shape[1]):
        out = hf(ids[:, t:t + 1], use_cache=True, **{name: out[name]})
        logits.append(out.logits)
    return torch.cat(logits, dim=1)


def perturbed(method: str, seed: int = 3):
    """A tiny model moved away from its near-zero init, so that every weight and bias matters."""
    model = tiny_model(method, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module")
def tiny_exports(tmp_path_factory):
    """{method: (posviz model, export folder)} for the three exportable methods."""
    root = tmp_path_factory.mktemp("hf")
    return {m: (model := perturbed(m), EXPORTS[m](model, root / m, source=f"tiny-{m}")) for m in EXPORTS}


# ------------------------------------------------------------------------------------------ tokenizer

def test_byte_tokenizer_ids_are_the_utf8_bytes(tmp_path):
    tok = AutoTokenizer.from_pretrained(str(byte_tokenizer(tmp_path)), local_files_only=True)
    assert len(tok) == 256 and tok.all_special_ids == []
    # spaces at both ends, NUL, tabs, CRLF, 2-, 3- and 4-byte characters
    samples = [TEXT, "  leading and trailing  ", "\x00nul\ttab\r\n", "é€😀 ü", " ", "\n\n"]
    for text in samples:
        ids = tok(text)["input_ids"]
        assert ids == list(text.encode("utf-8")), text[:40]  # no special tokens added, no split, no merge
        assert tok.decode(ids) == text
    assert tok(TEXT, return_tensors="pt")["input_ids"][0].tolist() == TEXT_IDS.tolist()
    # every id is its byte: the 256 single-byte tokens are distinct and decode as bytes.decode does
    assert len(set(tok.convert_ids_to_tokens(list(range(256))))) == 256
    assert [tok(chr(b))["input_ids"] for b in range(128)] == [[b] for b in range(128)]


def test_byte_tokenizer_on_bytes_that_are_not_utf8(tmp_path):
    """Arbitrary bytes are ``list(raw)`` as ids (a str cannot hold them); decoding them is lossy as
    ``bytes.decode("utf-8", "replace")`` is, and ``bytes(ids)`` gives them back exactly."""
    tok = AutoTokenizer.from_pretrained(str(byte_tokenizer(tmp_path)), local_files_only=True)
    generator = torch.Generator().manual_seed(0)
    raws = [bytes(range(256)), b"\xff\xfe\x00A\xc3(\xe2\x82\x80\xed\xa0\x80\n"]
    raws += [bytes(torch.randint(0, 256, (40,), generator=generator).tolist()) for _ in range(50)]
    for raw in raws:
        ids = list(raw)
        assert tok.decode(ids) == raw.decode("utf-8", "replace")
        assert bytes(ids) == raw
    # latin-1 is NOT a way in: bytes >= 0x80 come back as two UTF-8 bytes each
    assert tok(bytes([0xE9]).decode("latin-1"))["input_ids"] == [0xC3, 0xA9]


# ------------------------------------------------------------------------------------ small models

@pytest.mark.parametrize("attn", ["eager", None], ids=["eager", "default"])
@pytest.mark.parametrize("method", list(EXPORTS))
def test_transformers_forward_equals_posviz(tiny_exports, method, attn):
    """Logits and bits/byte of the transformers model on real text, past the train length where the
    method can go (8x: 256 bytes), at exactly the table size for GPT-2's learned positions."""
    model, folder = tiny_exports[method]
    hf = load_hf(folder, attn)
    assert type(hf).__name__ == ARCHITECTURES[method]
    T = model.config.train_length if method == "learned" else 8 * model.config.train_length
    ids = TEXT_IDS[None, :T]
    with torch.no_grad():
        ours, theirs = model(ids).logits, hf(ids).logits
    assert ours.abs().max() > 1.0  # logits are not trivially small
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)
    assert abs(bits_per_byte(theirs, TEXT_IDS) - bits_per_byte(ours, TEXT_IDS)) < 1e-4


@pytest.mark.parametrize("method", list(EXPORTS))
def test_transformers_cached_decode_equals_the_full_forward(tiny_exports, method):
    """transformers' KV cache, fed a prefix and then byte by byte, gives the full pass's logits (and
    posviz's); it runs up to the last row of GPT-2's table, and past the train length for the others."""
    model, folder = tiny_exports[method]
    hf = load_hf(folder, None)
    T = model.config.train_length if method == "learned" else 4 * model.config.train_length
    ids = TEXT_IDS[None, 1000:1000 + T]
    with torch.no_grad():
        full, cached, ours = hf(ids).logits, cached_decode(hf, ids, T - 12), model(ids).logits
    torch.testing.assert_close(cached, full, rtol=0, atol=1e-4)
    torch.testing.assert_close(cached, ours, rtol=0, atol=1e-4)


def test_export_folder_contents(tiny_exports):
    for method, (model, folder) in tiny_exports.items():
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", EXPORT_INFO])
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"] == [ARCHITECTURES[method]] and config["torch_dtype"] == "float32"
        assert config["model_type"] and config["vocab_size"] == 256
        stored = load_file(str(folder / "model.safetensors"))
        # float16 where a tensor's values all are float16 values (zero biases, unit norms), float32 elsewhere:
        # random float32 weights are not, and nothing is rounded
        assert torch.float32 in {t.dtype for t in stored.values()} <= {torch.float16, torch.float32}
        assert all(t.dtype == torch.float32 or torch.equal(t.float().half().float(), t.float()) for t in stored.values())
        info = json.loads((folder / EXPORT_INFO).read_text())
        assert info == {"source_checkpoint": f"tiny-{method}", "method": method, "position_options": {},
                        "train_length": model.config.train_length, "architecture": ARCHITECTURES[method]}


@pytest.mark.parametrize("options,shape", [
    ({"rotary_fraction": 0.5, "base": 500.0}, {}),
    ({"rotary_fraction": 0.7}, {"n_embd": 88, "n_head": 2}),  # 30 of 44 features: 44 * (30 / 44) < 30 in floats
], ids=["half-base500", "30-of-44"])
def test_rope_export_options_reach_transformers(tmp_path, options, shape):
    """A rotary fraction below 1 and another base are written in the names transformers 5 reads, and
    transformers rotates exactly the features posviz rotates."""
    model = tiny_model("rope", seed=1, position_options=options, **shape)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    hf = load_hf(export_neox(model, tmp_path / "neox"), "eager")
    assert hf.gpt_neox.layers[0].attention.rotary_ndims == model.position.rot_dim < model.config.head_dim
    ids = TEXT_IDS[None, :128]
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, rtol=0, atol=1e-4)


def test_exports_refuse_what_their_architecture_cannot_compute(tmp_path):
    for method, export in EXPORTS.items():
        other = "alibi" if method != "alibi" else "rope"
        with pytest.raises(PosvizError, match=f"only the '{method}' method"):
            export(tiny_model(other), tmp_path / f"{method}-from-{other}")
        assert not (tmp_path / f"{method}-from-{other}").exists()
    with pytest.raises(PosvizError, match="only unscaled RoPE"):
        export_neox(tiny_model("rope", position_options={"scaling": "linear", "factor": 2.0}), tmp_path / "scaled")
    save_checkpoint(tiny_model("t5"), tmp_path / "t5")
    with pytest.raises(PosvizError, match="no transformers architecture computes the 't5' method"):
        export_checkpoint(tmp_path / "t5", tmp_path / "t5-out")


def test_command_line_exports_a_checkpoint_folder(tmp_path, capsys):
    model = perturbed("alibi")
    save_checkpoint(model, tmp_path / "alibi")
    main(["--checkpoint", str(tmp_path / "alibi"), "--to", str(tmp_path / "out")])
    assert "wrote" in capsys.readouterr().out
    info = json.loads((tmp_path / "out" / EXPORT_INFO).read_text())
    assert info["source_checkpoint"] == "alibi" and info["method"] == "alibi"
    hf, stored = load_hf(tmp_path / "out", None), load_checkpoint(tmp_path / "alibi")  # weights as stored (fp16)
    ids = TEXT_IDS[None, :64]
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, stored(ids).logits, rtol=0, atol=1e-4)


# ----------------------------------------------------------------------------- the shipped exports

def test_shipped_checkpoints_do_not_list_models_hf():
    names = list(shipped_checkpoints(ROOT / "models"))
    # one checkpoint per registered method, the three fine-tuned RoPE ones and RoPE recalibrated without it (DroPE)
    assert len(names) == len(method_names()) + 4 and "hf" not in names
    assert sorted(p.name for p in (ROOT / "models" / "hf").iterdir()) == sorted(SHIPPED_EXPORTS.values())


@pytest.mark.parametrize("method", list(SHIPPED_EXPORTS))
def test_shipped_exports_match_their_checkpoints(method, tmp_path, monkeypatch):
    """models/hf/<export>: what ``python -m posviz.export`` writes today from models/<method>, and what
    transformers runs from it matches posviz on 1,024 bytes of real text (GPT-2: its 256 positions)."""
    folder = ROOT / "models" / "hf" / SHIPPED_EXPORTS[method]
    model = load_checkpoint(ROOT / "models" / method)
    fresh = export_checkpoint(ROOT / "models" / method, tmp_path / "fresh")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", EXPORT_INFO):
        assert (fresh / name).read_text() == (folder / name).read_text(), name
    stored, again = load_file(str(folder / "model.safetensors")), load_file(str(fresh / "model.safetensors"))
    assert stored.keys() == again.keys() and all(torch.equal(stored[k], again[k]) for k in stored)

    hf, tok = load_hf(folder, None), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    T = 256 if method == "learned" else 1024
    ids = ids[:, :T]
    with torch.no_grad():
        ours, theirs = model(ids).logits, hf(ids).logits
    # learned: exact but for float32 rounding. rope, alibi at 4x the train length: 1.8e-4 and 1.7e-4
    # measured, from the float32 angles and BLOOM's row-constant bias (posviz/models/export.py).
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4 if method == "learned" else 4e-4)
    assert abs(bits_per_byte(theirs, TEXT_IDS) - bits_per_byte(ours, TEXT_IDS)) < 1e-4
    if method == "rope":
        # The whole RoPE gap is the angles' precision: with posviz's angles rounded to float32 as
        # transformers rounds them, the logits agree to float32 noise.
        import posviz.positions.rope as rope

        def float32_angles(pos, inv_freq, attention_factor=1.0, dtype=torch.float32):
            angles = pos.float()[:, None] * inv_freq.float()[None, :]
            angles = torch.cat((angles, angles), dim=-1)
            return (angles.cos() * attention_factor).to(dtype), (angles.sin() * attention_factor).to(dtype)

        monkeypatch.setattr(rope, "rope_cos_sin", float32_angles)
        with torch.no_grad():
            torch.testing.assert_close(theirs, load_checkpoint(ROOT / "models" / method)(ids).logits, rtol=0, atol=1e-4)
