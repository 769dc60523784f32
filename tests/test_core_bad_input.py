"""Bad input to the core gets a PosvizError with a message a person can act on, never a deep torch error.

Every case asserts the error class *and* what the message says, because the app shows the message
as it is.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from conftest import tiny_model
from posviz.models.shipped import as_lab_model
from posviz.config import ModelConfig, strict_from_dict
from posviz.training.data import decode_bytes, encode_text
from posviz.errors import ConfigError, PosvizError, PositionLimitError
from posviz.training.evaluate import bits_per_byte, check_length, eval_table, position_losses, sliding_window_bpb
from posviz.labs.probes import copy_probe
from posviz.models.byte_gpt import GPT
from posviz.models.kv_cache import KVCache
from posviz.positions import POSITION_METHODS, ModelShape, build_position_method
from posviz.training.command_line import main as train_main
from posviz.training.train import TrainConfig

TEXT = encode_text("def f(x):\n    return x * 2\n" * 20)
N = TEXT.numel()  # 540 bytes


@pytest.fixture(scope="module")
def nope():
    return tiny_model("nope")


# ------------------------------------------------------------------------------------------- text

@pytest.mark.parametrize("empty", ["", b"", bytearray()])
def test_empty_text_is_refused_with_a_hint(empty):
    with pytest.raises(PosvizError, match="empty.*paste at least one character"):
        encode_text(empty)


def test_any_bytes_are_tokens_even_when_they_are_not_utf8():
    raw = b"\xff\xfe\x00caf\xc3\xa9\x80"
    ids = encode_text(raw)
    assert ids.dtype == torch.long and ids.tolist() == list(raw)
    assert decode_bytes(ids) == "\ufffd\ufffd\x00caf\u00e9\ufffd"  # shown with U+FFFD, not an exception
    assert encode_text("caf\u00e9").tolist() == list("caf\u00e9".encode())
    # a str that came from undecodable bytes (surrogateescape) gets its original bytes back
    assert encode_text(raw.decode("utf-8", errors="surrogateescape")).tolist() == list(raw)


def test_model_rejects_empty_or_malformed_batches(nope):
    with pytest.raises(PosvizError, match=r"non-empty batch .* shape \(1, 0\)"):
        nope(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(PosvizError, match=r"shape \(5,\)"):
        nope(torch.arange(5))
    with pytest.raises(PosvizError, match=r"byte ids must be integers in 0\.\.255"):
        nope(torch.tensor([[1, 300]]))
    with pytest.raises(PosvizError, match=r"byte ids must be integers in 0\.\.255"):
        nope(torch.tensor([[-1, 3]]))
    with pytest.raises(PosvizError, match=r"byte ids must be integers"):
        nope(torch.tensor([[1.0, 2.0]]))


def test_model_rejects_bad_positions_and_hooks(nope):
    idx = torch.tensor([[1, 2, 3]])
    with pytest.raises(PosvizError, match=r"positions must be 3 non-negative integers"):
        nope(idx, positions=torch.arange(4))
    with pytest.raises(PosvizError, match=r"positions must be 3 non-negative integers"):
        nope(idx, positions=torch.tensor([-1, 0, 1]))
    with pytest.raises(PosvizError, match=r"attention_layer must be in 0\.\.1, got 2"):
        nope(idx, attention_layer=2)
    with pytest.raises(PosvizError, match=r"attention_head must be in 0\.\.3, got -1"):
        nope(idx, attention_layer=0, attention_head=-1)
    with pytest.raises(PosvizError, match=r"KV cache was made for 3 layers but the model has 2"):
        nope(idx, cache=KVCache(3))
    with pytest.raises(PosvizError, match=r"max_size must be a positive integer"):
        KVCache(2, max_size=0)


# ------------------------------------------------------------------------------------- evaluation

@pytest.mark.parametrize("length", [0, -5, 1, 2.5, "64", None])
def test_evaluation_lengths_that_make_no_sense(nope, length):
    for fn in (position_losses, bits_per_byte):
        with pytest.raises(PosvizError, match=r"evaluation length must be an integer of at least 2 bytes"):
            fn(nope, TEXT, length)
    with pytest.raises(PosvizError, match=r"at least 2 bytes"):
        sliding_window_bpb(nope, TEXT, length, 1)


def test_evaluation_lengths_longer_than_the_text(nope):
    with pytest.raises(PosvizError, match=rf"evaluation length {N} needs {N + 1} bytes of text .* has {N} bytes"):
        position_losses(nope, TEXT, N)
    assert position_losses(nope, TEXT, N - 1).shape == (1, N - 1)  # the whole text is one window
    # a window of W predictions needs W + 1 bytes: W = the whole text used to divide by zero
    with pytest.raises(PosvizError, match=rf"{N} needs {N + 1} bytes of text"):
        sliding_window_bpb(nope, TEXT, N, 10)
    assert sliding_window_bpb(nope, TEXT, N - 1, 10) > 0  # the largest window that fits works
    for stride in (0, -1, 33, 1.5):
        with pytest.raises(PosvizError, match=r"stride must be an integer between 1 and the window \(32\)"):
            sliding_window_bpb(nope, TEXT, 32, stride)


def test_evaluation_past_a_learned_table():
    learned = tiny_model("learned")  # 32 positions
    with pytest.raises(PositionLimitError, match=r"32 rows .* position 63 was asked for"):
        bits_per_byte(learned, TEXT, 64)  # 64 inputs at positions 0..63: the table stops at 31
    table = eval_table(learned, TEXT, [32, 64], progress=False)
    assert table["64"] is None and table["32"] > 0  # the table says "cannot run" instead of failing
    probe = copy_probe(as_lab_model(learned), TEXT, [0, 40], string_length=8, trials=2)  # 8 + 40 + 8 > 32 positions
    assert probe["40"] is None and probe["0"] > 0


def test_copy_probe_arguments(nope):
    with pytest.raises(PosvizError, match=rf"each gap must be an integer from 0 to {N - 2} .* {N} bytes.*got {N - 1}"):
        copy_probe(as_lab_model(nope), TEXT, [0, N - 1])
    with pytest.raises(PosvizError, match=r"each gap must be an integer.*got -1"):
        copy_probe(as_lab_model(nope), TEXT, [-1])
    with pytest.raises(PosvizError, match=r"copied string needs at least 2 bytes, got 1"):
        copy_probe(as_lab_model(nope), TEXT, [0], string_length=1)
    with pytest.raises(PosvizError, match=r"trials must be a positive integer, got 0"):
        copy_probe(as_lab_model(nope), TEXT, [0], trials=0)
    # the shortest string scores its one predictable byte (it used to score none and return NaN)
    result = copy_probe(as_lab_model(nope), TEXT, [0, N - 2], string_length=2, trials=2)
    assert set(result) == {"0", str(N - 2)} and all(0 < v < 20 for v in result.values()), result


def test_check_length_accepts_numpy_integers():
    check_length(np.int64(8), 10)  # lengths from pandas/numpy widgets are fine
    with pytest.raises(PosvizError, match="needs 12 bytes of text"):
        check_length(np.int32(11), 10)


# ------------------------------------------------------------------------------ methods and configs

def test_unknown_method_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        GPT(ModelConfig(position="rotary", n_layer=1, n_embd=32, n_head=2, train_length=16))
    message = str(err.value)
    assert "Unknown position method 'rotary'" in message
    assert all(name in message for name in POSITION_METHODS)


def test_unknown_rope_scaling_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        tiny_model("rope", position_options={"scaling": "ntk-by-parts"})
    message = str(err.value)
    assert "Unknown RoPE scaling 'ntk-by-parts'" in message
    assert all(name in message for name in ("none", "linear", "ntk", "dynamic", "yarn", "llama3"))


@pytest.mark.parametrize("method", sorted(POSITION_METHODS))
def test_every_method_rejects_unknown_option_keys(method):
    shape = ModelShape(n_layer=1, n_head=2, head_dim=16, n_embd=32, train_length=16)
    with pytest.raises(ConfigError, match=rf"{method} options: unknown key\(s\) 'max_distnace'"):
        build_position_method(method, shape, {"max_distnace": 5})


@pytest.mark.parametrize("method,options,message", [
    ("learned", {"max_len": 0}, r"learned max_len must be a positive integer or None, got 0"),
    ("learned", {"max_len": -4}, r"learned max_len must be a positive integer"),
    ("learned", {"max_len": "64"}, r"learned max_len must be a positive integer or None, got '64'"),
    ("sinusoidal", {"base": 1.0}, r"sinusoidal base must be > 1"),
    ("sinusoidal", {"base": -10}, r"sinusoidal base must be > 1"),
    ("shaw", {"max_distance": 0}, r"shaw max_distance must be an integer >= 1"),
    ("t5", {"num_buckets": 2}, r"t5 num_buckets must be an integer >= 4"),
    ("t5", {"num_buckets": 32, "max_distance": 10}, r"t5 max_distance must be an integer larger than num_buckets / 2"),
    ("rope", {"factor": 0.5}, r"rope factor must be >= 1, got 0.5"),
    ("rope", {"rotary_fraction": 0}, r"rotary_fraction must be in \(0, 1\]"),
    ("rope", {"base": 1}, r"rope base must be > 1"),
    ("rope", {"base": "big"}, r"rope options"),
    ("rope", {"scaling": "yarn", "original_length": 0}, r"rope original_length must be a positive integer or None, got 0"),
    ("rope", {"scaling": "yarn", "beta_slow": 0}, r"yarn needs beta_fast > beta_slow > 0"),
    ("rope", {"scaling": "yarn", "attention_factor": -1.0}, r"rope attention_factor must be positive"),
    ("rope", {"scaling": "llama3", "low_freq_factor": 0}, r"llama3 needs high_freq_factor > low_freq_factor > 0"),
    ("nezha", {"max_distance": 0}, r"nezha max_distance must be an integer >= 1"),
    ("nezha", {"base": 0.5}, r"nezha base must be > 1"),
    ("kerple", {"r1_init_max": 0}, r"kerple r1_init_max must be > 0.01"),
    ("kerple", {"r2_init_max": "one"}, r"kerple r2_init_max must be > 0.01"),
    ("fire", {"mlp_width": 0}, r"fire mlp_width must be an integer >= 1"),
    ("fire", {"c_init": -0.1}, r"fire c_init must be > 0"),
    ("fire", {"threshold_init": 0}, r"fire threshold_init must be >= 1"),
    ("transformer_xl", {"base": 1}, r"transformer_xl base must be > 1"),
])
def test_impossible_option_values(method, options, message):
    shape = ModelShape(n_layer=1, n_head=2, head_dim=16, n_embd=32, train_length=16)
    with pytest.raises(ConfigError, match=message):
        build_position_method(method, shape, options)


def test_model_config_rejects_unknown_keys_and_impossible_shapes():
    with pytest.raises(ConfigError, match=r"model config: unknown key\(s\) 'n_layers'; allowed keys are .*n_layer"):
        ModelConfig.from_dict({"n_layers": 2})
    with pytest.raises(ConfigError, match=r"n_embd \(30\) must be divisible by n_head \(4\)"):
        ModelConfig.from_dict({"n_embd": 30, "n_head": 4})
    with pytest.raises(ConfigError, match=r"ModelConfig.n_layer must be a positive integer, got 0"):
        ModelConfig.from_dict({"n_layer": 0})
    with pytest.raises(ConfigError, match=r"ModelConfig.train_length must be a positive integer, got '256'"):
        ModelConfig.from_dict({"train_length": "256"})
    with pytest.raises(ConfigError, match=r"dropout must be in \[0, 1\)"):
        ModelConfig.from_dict({"dropout": 1.5})
    with pytest.raises(ConfigError, match=r"position_options must be a mapping"):
        ModelConfig.from_dict({"position_options": ["scaling", "yarn"]})


def test_train_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match=r"training recipe: unknown key\(s\) 'learning_rate'; allowed keys are .*\blr\b"):
        strict_from_dict(TrainConfig, {"learning_rate": 1e-3}, "training recipe")
    for values, message in [
        ({"tokens": 0}, r"tokens must be a positive integer, got 0"),
        ({"tokens": "lots"}, r"tokens must be a positive integer, got 'lots'"),
        ({"log_every": 0}, r"log_every must be a positive integer, got 0"),  # used to divide by zero in training
        ({"lr": -1}, r"lr must be a number in \(0, 10\], got -1"),
        ({"warmup_steps": -1}, r"warmup_steps must be a non-negative integer"),
        ({"eval_bytes": 100, "train_length": 256}, r"eval_bytes \(100\) must hold at least one train_length \(256\)"),
        ({"train_length": 16, "eval_bytes": 1024}, r"repeat_min_bytes \(16\) is too long for train_length 16.*<= 8"),
    ]:
        with pytest.raises(ConfigError, match=message):
            strict_from_dict(TrainConfig, values, "training recipe")


@pytest.mark.parametrize("argv,message", [
    (["--method", "alibi", "--set", "tokenz=100"], r"error: training recipe: unknown key\(s\) 'tokenz'"),
    (["--method", "rotary"], r"error: Unknown position method 'rotary'"),
    (["--method", "t5", "--option", "max_distnace=3"], r"error: t5 options: unknown key\(s\) 'max_distnace'"),
    (["--method", "rope", "--option", "scaling=ntk-by-parts"], r"error: .*Unknown RoPE scaling 'ntk-by-parts'"),
    (["--method", "alibi", "--set", "n_embd=30"], r"error: n_embd \(30\) must be divisible by n_head \(4\)"),
])
def test_training_cli_reports_bad_recipes_as_one_line(argv, message, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        train_main([*argv, "--out", str(tmp_path / "out")])
    assert isinstance(exit_info.value.code, str)  # a message (exit status 1), not a traceback
    assert re.search(message, exit_info.value.code), exit_info.value.code
    assert not (tmp_path / "out").exists()  # nothing was trained or written


# -- a formula a visitor types (posviz/positions/formula_language.py) -------------------------------------------------------
HOSTILE_FORMULAS = [  # (text, words the refusal must hold)
    ("__import__('os').system('touch /tmp/posviz-pwned')", "Calling an attribute (x.y) is not allowed"),
    ("__import__('os')", "Calling __import__ is not allowed"),
    ("().__class__.__bases__", "an attribute (x.y) is not allowed"),
    ("9**9**9", "overflows to +inf"),
    ("(" * 200 + "d" + ")" * 200, "at most 300 are allowed"),
    ("d\x00 + 1", "NUL byte"),
    ("lambda: d", "a lambda is not allowed"),
    ("[d for d in d]", "a comprehension is not allowed"),
    ("'d'", "Only numbers are allowed"),
    ("open('/etc/passwd')", "Calling open is not allowed"),
    ("d[0]", "nothing else may be indexed"),
    ("x + d", "Unknown name 'x'"),
    ("d if d > 3 else 0", "if/else (use where(cond, a, b))"),
    ("log(-1 - d)", "NaN on some causal pair"),
    ("0 * inf", "NaN on some causal pair"),
    ("where(d >= 0, -inf, 0)", "no key with a finite bias"),
    ("", "Write a formula"),
    ("max(d)", "max takes 2 argument(s)"),
]


@pytest.mark.parametrize("text,words", HOSTILE_FORMULAS, ids=[repr(t)[:24] for t, _ in HOSTILE_FORMULAS])
def test_a_hostile_formula_gets_words_and_no_side_effect(text, words):
    from pathlib import Path

    from posviz.positions.formula_language import FormulaError, evaluate, parse_formula

    with pytest.raises(FormulaError) as caught:
        evaluate(parse_formula(text), 16, 2, 16)
    assert words in str(caught.value), str(caught.value)
    assert not Path("/tmp/posviz-pwned").exists()


def test_a_hard_cut_is_allowed_where_every_row_keeps_a_key():
    from posviz.positions.formula_language import evaluate, parse_formula

    bias = evaluate(parse_formula("where(d > 4, -inf, -0.25 * d)"), 12, 2, 16)
    assert torch.isneginf(bias[0, 11, :7]).all() and bias[0, 11, 7:].tolist() == [-1.0, -0.75, -0.5, -0.25, 0.0]
