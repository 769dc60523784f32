"""Properties every position method and the model around it must have, checked on tiny random models.

Parametrised over ``POSITION_METHODS``, so a new method file is covered without touching this test.
Learned position parameters are randomised first: T5 starts at zero (= NoPE) and the learned table at
std 0.02, which would make "the method changes nothing" pass by accident.
"""
from __future__ import annotations

import re

import pytest
import torch

from conftest import decode_in_chunks, tiny_model
from maths_support import sharp
from posviz.errors import PositionLimitError
from posviz.training.evaluate import sliding_window_bpb
from posviz.models.kv_cache import KVCache
from posviz.positions import POSITION_METHODS, ModelShape, build_position_method
from posviz.positions.rope import RopeOptions, apply_rotary, rope_cos_sin
from posviz.positions.rope_scaling import ROPE_SCALINGS
from posviz.positions.shaw import shaw_clip_matrix
from posviz.positions.sinusoidal import sinusoidal_shift_matrix, sinusoidal_table

METHODS = sorted(POSITION_METHODS)
# Registered methods with their defaults, plus options that change how the method computes
# (partial rotation, a static scaling, clipping and bucketing inside the test lengths).
VARIANTS = [(name, {}) for name in METHODS] + [
    ("rope", {"rotary_fraction": 0.5, "scaling": "yarn", "factor": 4.0}),
    ("shaw", {"max_distance": 3}),
    ("t5", {"num_buckets": 8, "max_distance": 12}),
    ("nezha", {"max_distance": 3}),
    ("fire", {"threshold_init": 4.0}),  # queries past L: the per-query normaliser, not the distance table
    ("fire", {"threshold_init": 1024.0}),  # every query below L: the per-distance table
    ("fire", {"shared_across_layers": True}),  # one FIRE for every layer, its bias memoised across them
]
VARIANT_IDS = [name + ("-" + "-".join(f"{k}={v}" for k, v in opts.items()) if opts else "") for name, opts in VARIANTS]
ALL_CLASSES_COVERED = {name for name, _ in VARIANTS} == set(POSITION_METHODS)


def model_for(method: str, options: dict | None = None, seed: int = 0, **overrides):
    model = tiny_model(method, seed=seed, position_options=dict(options or {}), **overrides)
    with torch.no_grad():
        for p in model.position.parameters():
            p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed + 1))
    return model


def random_bytes(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))


def test_variants_cover_every_registered_method():
    assert ALL_CLASSES_COVERED


# ----------------------------------------------------------------------------------------- formulas

@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "yarn", "llama3"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_scores_depend_only_on_the_distance(scaling, fraction):
    shape = ModelShape(n_layer=1, n_head=2, head_dim=32, n_embd=64, train_length=64)
    method = build_position_method("rope", shape, {"scaling": scaling, "factor": 4.0, "rotary_fraction": fraction})
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, 2, 32, generator=gen), torch.randn(1, 2, 2, 32, generator=gen)

    def score(m: int, n: int) -> torch.Tensor:  # q at position m, k at position n: (H,)
        q_rot, k_rot = method.rotate_qk(q, k, torch.tensor([m, n]))
        return (q_rot[0, :, 0] * k_rot[0, :, 1]).sum(-1)

    for m, n in [(5, 2), (0, 0), (40, 7), (3, 30)]:
        for s in (1, 17, 1000, 123_456):
            torch.testing.assert_close(score(m + s, n + s), score(m, n), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(score(5, 2), score(5, 3), atol=1e-3)  # yet the distance matters
    q_m, _ = method.rotate_qk(q, k, torch.tensor([5, 2]))
    q_shift, _ = method.rotate_qk(q, k, torch.tensor([6, 3]))
    assert not torch.allclose(q_m, q_shift, atol=1e-3)  # and the vectors themselves are rotated


def test_dynamic_ntk_scores_depend_on_the_length_seen():
    """Dynamic NTK picks its frequencies from the longest position in the call: the same (m, n) pair
    scores as plain RoPE inside a sequence no longer than the trained length, and differently inside
    a longer one (so its scores are not a function of m - n alone)."""
    shape = ModelShape(n_layer=1, n_head=2, head_dim=32, n_embd=64, train_length=64)
    dynamic = build_position_method("rope", shape, {"scaling": "dynamic", "factor": 2.0})
    plain = build_position_method("rope", shape, {})
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, 300, 32, generator=gen), torch.randn(1, 2, 300, 32, generator=gen)

    def score(method, m: int, n: int, length: int) -> torch.Tensor:  # (H,): q at m, k at n, in a call of `length` positions
        q_rot, k_rot = method.rotate_qk(q[:, :, :length], k[:, :, :length], torch.arange(length))
        return (q_rot[0, :, m] * k_rot[0, :, n]).sum(-1)

    torch.testing.assert_close(score(dynamic, 40, 10, 64), score(plain, 40, 10, 64))  # up to L: plain RoPE
    assert not torch.allclose(score(dynamic, 40, 10, 64), score(dynamic, 40, 10, 300), atol=1e-3)


def test_dynamic_ntk_cached_decoding_differs_from_a_full_forward():
    """Keys are cached after rotation, so a cached key keeps the frequencies of the step that wrote it
    while a full forward pass rotates every key with the frequencies of the whole length: the two
    agree up to the trained length and part past it (as in Hugging Face's dynamic RoPE). The labs'
    numbers are full forward passes."""
    model = sharp(model_for("rope", {"scaling": "dynamic", "factor": 2.0}, n_layer=1))  # peaked attention shows it
    L = model.config.train_length
    idx = random_bytes(1, 3 * L, seed=4)
    with torch.no_grad():
        full = model(idx).logits[0]
        cached = decode_in_chunks(model, idx, [L] + [1] * (2 * L))[0]
        short = model(idx[:, :L]).logits[0]
    torch.testing.assert_close(cached[:L], short, rtol=1e-5, atol=1e-5)  # up to L: the same frequencies
    assert (cached[L:] - full[L:]).abs().max() > 1e-2  # past L: each step's keys kept their own (float noise ~1e-6)


def test_rope_rotation_keeps_norms():
    x = torch.randn(3, 50, 16, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(torch.arange(50), ROPE_SCALINGS["none"](16, RopeOptions(), 50)[0])
    torch.testing.assert_close(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("dim,base", [(16, 10000.0), (64, 10000.0), (32, 500.0)])
def test_sinusoidal_table_is_the_paper_formula_and_shifts_are_linear_maps(dim, base):
    T = 300
    table = sinusoidal_table(T, dim, base).double()
    p, i = torch.arange(T, dtype=torch.float64)[:, None], torch.arange(dim // 2, dtype=torch.float64)[None, :]
    torch.testing.assert_close(table[:, 0::2], torch.sin(p / base ** (2 * i / dim)), rtol=0, atol=1e-6)
    torch.testing.assert_close(table[:, 1::2], torch.cos(p / base ** (2 * i / dim)), rtol=0, atol=1e-6)
    for k in (1, 7, 100, -3):
        M = sinusoidal_shift_matrix(dim, k, base)  # PE(p + k) = M_k PE(p), one matrix for every p
        lo, hi = max(0, -k), min(T, T - k)
        shifted = (M @ table[lo:hi].T).T
        torch.testing.assert_close(shifted, table[lo + k : hi + k], rtol=0, atol=1e-5)
    # the method adds exactly this table to the input, at any offset
    shape = ModelShape(n_layer=1, n_head=1, head_dim=dim, n_embd=dim, train_length=T)
    method = build_position_method("sinusoidal", shape, {"base": base})
    pos = torch.arange(1000, 1000 + T)
    added = method.add_to_input(torch.zeros(1, T, dim), pos)[0]
    torch.testing.assert_close(added.double(), sinusoidal_table(T, dim, base, offset=1000).double(), rtol=0, atol=1e-4)


def test_shaw_bias_is_the_papers_query_dependent_term_clipped_at_k():
    """Shaw et al. eq. (3)-(5), key side: e_ij gains q_i . a_clip(i-j, k) / sqrt(hs); written as loops here."""
    k, T, hs = 3, 9, 8
    shape = ModelShape(n_layer=2, n_head=2, head_dim=hs, n_embd=2 * hs, train_length=T)
    method = build_position_method("shaw", shape, {"max_distance": k})
    with torch.no_grad():
        method.rel_keys.normal_(generator=torch.Generator().manual_seed(0))
    q = torch.randn(1, 2, T, hs, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(T)
    bias = method.logit_bias(1, q, pos, pos)
    for h in range(2):
        for i in range(T):
            for j in range(i + 1):
                a = method.rel_keys[1, min(i - j, k)]
                assert bias[0, h, i, j].item() == pytest.approx((q[0, h, i] @ a).item() / hs**0.5, rel=1e-5, abs=1e-6)
    causal = shaw_clip_matrix(T, k, causal=True)
    assert causal[8].tolist() == [3, 3, 3, 3, 3, 3, 2, 1, 0] and causal[0, 1] == -1
    both = shaw_clip_matrix(T, k, causal=False)  # the paper's clip(j - i, -k, k) + k, in 0..2k
    assert both[4].tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 6]


# ---------------------------------------------------------------- model properties for every method

@pytest.mark.parametrize("method,options", VARIANTS, ids=VARIANT_IDS)
def test_changing_a_later_byte_never_changes_an_earlier_logit(method, options):
    model = model_for(method, options)
    idx = random_bytes(2, 24)
    with torch.no_grad():
        base = model(idx).logits
        for t in (0, 11, 23):
            changed = idx.clone()
            changed[:, t] = (changed[:, t] + 97) % 256
            logits = model(changed).logits
            assert torch.equal(logits[:, :t], base[:, :t]), f"byte {t} leaked into earlier positions"
            assert not torch.allclose(logits[:, t], base[:, t])  # ... but does change its own


@pytest.mark.parametrize("method,options", VARIANTS, ids=VARIANT_IDS)
def test_cached_incremental_decoding_equals_the_full_forward_pass(method, options):
    model = model_for(method, options)
    idx = random_bytes(2, 30)
    with torch.no_grad():
        full = model(idx).logits
        for chunks in ([1] * 30, [7, 1, 2, 20], [13, 17]):
            cache, outputs, start = KVCache(model.config.n_layer), [], 0
            for size in chunks:
                outputs.append(model(idx[:, start : start + size], cache=cache).logits)
                start += size
            assert len(cache) == 30 and cache.positions.tolist() == list(range(30))
            torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method,options", VARIANTS, ids=VARIANT_IDS)
def test_attention_probabilities_are_causal_distributions_and_do_not_change_logits(method, options):
    model = model_for(method, options)
    idx = random_bytes(2, 20)
    T = idx.shape[1]
    with torch.no_grad():
        plain = model(idx).logits
        for layer in range(model.config.n_layer):
            out = model(idx, attention_layer=layer)
            probs = out.attention
            assert probs.shape == (2, model.config.n_head, T, T)
            assert torch.equal(probs.triu(1), torch.zeros_like(probs))  # no weight on future keys
            if model.position.layer_kind(layer) != "attention":  # a recurrent layer's implied matrix: signed, no softmax
                assert probs.abs().sum() > 0
                torch.testing.assert_close(out.logits, plain, rtol=1e-5, atol=1e-5)
                continue
            assert torch.all(probs >= 0)
            if model.position.weights_sum_to_one:
                torch.testing.assert_close(probs.sum(-1), torch.ones(2, model.config.n_head, T), rtol=0, atol=1e-5)
            else:  # a sink (rope_sinks): what it takes is no key's
                assert torch.all(probs.sum(-1) <= 1 + 1e-6)
            torch.testing.assert_close(out.logits, plain, rtol=1e-5, atol=1e-5)
        one_head = model(idx, attention_layer=0, attention_head=1).attention
        torch.testing.assert_close(one_head, model(idx, attention_layer=0).attention[:, 1])
        # with a cache the returned rows cover the cached keys too, and stay causal (an attention layer's: a recurrent
        # layer has folded its past into its state, and draws its implied matrix from a whole pass)
        layer = next(i for i in range(model.config.n_layer) if model.position.layer_kind(i) == "attention")
        cache = KVCache(model.config.n_layer)
        model(idx[:, :12], cache=cache)
        probs = model(idx[:, 12:], cache=cache, attention_layer=layer).attention  # (B, H, 8, 20)
        torch.testing.assert_close(probs, model(idx, attention_layer=layer).attention[:, :, 12:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", [m for m in METHODS if not POSITION_METHODS[m].reads_before])
def test_sliding_window_cache_equals_a_forward_pass_over_each_window(method):
    """One layer, so a key depends only on its byte and position: then what a sliding KVCache(max_size=W)
    gives for the byte at position p must equal a full forward over bytes p-W+1..p at the *same
    absolute positions* (passed with ``positions=``), whatever chunk sizes the bytes arrive in."""
    W, T = 6, 30
    model = model_for(method, n_layer=1)
    idx = random_bytes(1, T, seed=5)
    with torch.no_grad():
        expected = torch.stack([model(idx[:, max(0, p - W + 1) : p + 1],
                                      positions=torch.arange(max(0, p - W + 1), p + 1)).logits[0, -1]
                                for p in range(T)])
        for chunks in ([1] * T, [4, 4, 4, 9, 9], [2, 11, 17]):  # chunks longer than the window too
            cache, outputs, start = KVCache(1, max_size=W), [], 0
            for size in chunks:
                outputs.append(model(idx[:, start : start + size], cache=cache).logits[0])
                start += size
                assert len(cache) == min(W, start) and cache.positions.tolist() == list(range(max(0, start - W), start))
            torch.testing.assert_close(torch.cat(outputs), expected, rtol=1e-4, atol=1e-4)
        last_window = idx[:, -W:]
        at_start = model(last_window).logits[0, -1]  # the same bytes, moved to positions 0..W-1
    if model.position.is_shift_invariant():
        # only distances matter: the window may as well start at 0, so the cache equals a fresh forward
        torch.testing.assert_close(at_start, expected[-1], rtol=1e-4, atol=1e-4)
    else:
        # absolute methods see the shift (a temperature that reads the query's position only a little: 1e-6)
        assert (at_start - expected[-1]).abs().max() > 1e-6


@pytest.mark.parametrize("method", METHODS)
def test_sliding_window_chunks_equal_byte_by_byte_decoding_in_deep_models(method):
    """With several layers the window's keys carry older context, so compare chunked decoding with
    byte-by-byte decoding of the same sliding cache (every query sees the W keys ending at itself)."""
    W, T = 5, 24
    model = model_for(method, seed=2)
    idx = random_bytes(2, T, seed=7)

    def decode(chunks):
        return decode_in_chunks(model, idx, chunks, W)

    with torch.no_grad():
        one_by_one = decode([1] * T)
        torch.testing.assert_close(decode([3, 8, 13]), one_by_one, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(decode([T]), one_by_one, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(one_by_one[:, W:], model(idx).logits[:, W:], atol=1e-4)  # the window matters


def test_learned_positions_past_the_table_raise_a_limit_error_naming_position_and_limit():
    model = model_for("learned")  # 32 rows
    assert model.position.max_positions == 32
    with torch.no_grad():
        model(random_bytes(1, 32))  # the whole table is fine
        with pytest.raises(PositionLimitError) as err:
            model(random_bytes(1, 40))
        message = str(err.value)
        assert re.search(r"\b39\b", message) and re.search(r"\b32\b", message), message
        with pytest.raises(PositionLimitError, match=r"position 32\b"):
            model(random_bytes(1, 1), positions=torch.tensor([32]))
        cache = KVCache(model.config.n_layer)
        model(random_bytes(1, 30), cache=cache)
        with pytest.raises(PositionLimitError, match=r"position 33\b.*32 rows|32 rows.*position 33\b"):
            model(random_bytes(1, 4), cache=cache)  # positions 30..33


def test_sliding_window_bpb_scores_every_byte_exactly_once():
    """A nope model with every block's residual output zeroed predicts from the current byte only,
    so its loss is independent of context: the sliding-window score must then equal the full-text
    score for every window and stride, including strides that do not divide the text."""
    model = model_for("nope")
    with torch.no_grad():
        for block in model.blocks:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.zero_()
                proj.bias.zero_()
    data = random_bytes(1, 101, seed=3)[0]
    with torch.no_grad():
        logits = model(data[None, :-1]).logits[0]
        reference = torch.nn.functional.cross_entropy(logits, data[1:]).item() / torch.log(torch.tensor(2.0)).item()
    for window, stride in [(100, 1), (10, 10), (10, 3), (16, 7), (32, 32), (7, 1)]:
        assert sliding_window_bpb(model, data, window, stride) == pytest.approx(reference, rel=1e-5), (window, stride)


@pytest.mark.parametrize("q0,k0,Tq,Tk,k", [(0, 0, 40, 40, 8), (24, 0, 16, 40, 8), (3, 0, 5, 8, 8),
                                           (100, 90, 12, 22, 4), (0, 0, 5, 5, 64), (30, 0, 1, 31, 8)])
def test_shaw_band_fill_equals_the_gather_on_every_visible_entry(q0, k0, Tq, Tk, k):
    """Runs of positions (no cache, a block of queries, a sliding window) take the band fill; the
    per-entry gather stays the reference. Future entries differ on purpose (masked by attention)."""
    hs = 8
    shape = ModelShape(n_layer=1, n_head=2, head_dim=hs, n_embd=2 * hs, train_length=64)
    method = build_position_method("shaw", shape, {"max_distance": k})
    with torch.no_grad():
        method.rel_keys.normal_(generator=torch.Generator().manual_seed(0))
        q = torch.randn(2, 2, Tq, hs, generator=torch.Generator().manual_seed(1))
        q_pos, k_pos = torch.arange(q0, q0 + Tq), torch.arange(k0, k0 + Tk)
        fast = method.logit_bias(0, q, q_pos, k_pos)
        shuffled = torch.cat((k_pos[1:], k_pos[:1]))  # not a run: the gather path, column order shuffled
        slow = method.logit_bias(0, q, q_pos, shuffled)
        slow = torch.cat((slow[..., -1:], slow[..., :-1]), dim=-1)  # back to k_pos order
    visible = q_pos[:, None] >= k_pos[None, :]
    assert fast.shape == slow.shape == (2, 2, Tq, Tk)
    torch.testing.assert_close(fast.masked_fill(~visible, 0), slow.masked_fill(~visible, 0), rtol=0, atol=0)
