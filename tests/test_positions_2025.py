"""The methods of 2025 (FoPE, PoPE; PaTH and Canon in their own files) against loop-by-loop readings of their
reference code, written here from that code and not from posviz, in float64: the scores q'_i . k'_j of every pair,
and the gradients of the parameters through them.

FoPE: the paper's ``FourierEmbedding`` listing and vLLM's ``rotary_embedding/fope.py``.
PoPE: lucidrains/x-transformers, ``PolarEmbedding`` and ``apply_polar_pos_emb``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posviz.config import ModelConfig
from posviz.errors import ConfigError
from posviz.models.byte_gpt import GPT
from posviz.models.kv_cache import KVCache
from posviz.positions import ModelShape, build_position_method
from maths_support import text_ids  # noqa: F401  (a fixture)

SHAPE = ModelShape(n_layer=2, n_head=3, head_dim=16, n_embd=48, train_length=64)


def _fope_naive(method, q, k, positions, normalise=True):
    """vLLM's FourierRotaryEmbedding, one pair at a time: the kept frequencies are RoPE's inv_freq with a period no longer
    than the training length (2 pi / w <= L); pair p < columns of head h turns by cos_p(t) = sum_D cos(t w_D) Cn[h, D, p]
    with Cn the coefficients over their column sums (the paper's listing), the pairs past the columns are padded with
    cos = 1, sin = 0; then q * cos + rotate_neox(q) * sin, both halves of a pair alike."""
    B, H, T, hs = q.shape
    half = hs // 2
    inv_freq = [1.0 / method.options.base ** (2 * p / hs) for p in range(half)]
    kept = [w for w in inv_freq if w > 2.0 * math.pi / method.options.floor_length or
            math.isclose(w, 2.0 * math.pi / method.options.floor_length)]
    C, S = method.cos_coef.double(), method.sin_coef.double()
    columns = C.shape[-1]
    out = []
    for x in (q, k):
        y = torch.zeros_like(x)
        for h in range(H):
            for t_index, t in enumerate(positions.tolist()):
                for p in range(half):
                    if p < columns:
                        c_sum, s_sum = (C[h, :, p].sum(), S[h, :, p].sum()) if normalise else (1.0, 1.0)
                        c = sum(math.cos(t * kept[d]) * C[h, d, p] / c_sum for d in range(len(kept)))
                        s = sum(math.sin(t * kept[d]) * S[h, d, p] / s_sum for d in range(len(kept)))
                    else:
                        c, s = 1.0, 0.0
                    x1, x2 = x[:, h, t_index, p], x[:, h, t_index, p + half]
                    y[:, h, t_index, p] = x1 * c - x2 * s  # rotate_neox(x) = (-x2, x1)
                    y[:, h, t_index, p + half] = x2 * c + x1 * s
        out.append(y)
    return out


def test_fope_keeps_the_frequencies_that_turn_within_the_training_length():
    method = build_position_method("fope", ModelShape(4, 4, 32, 128, 256))
    # the checkpoints' shape: RoPE's 16 frequencies 10000^(-p/16); 2 pi / 256 = 0.0245 keeps p = 0..6
    assert method.kept_freq.numel() == 7 and method.series_pairs == 7
    assert float(method.kept_freq.min()) >= 2 * math.pi / 256 > 10000 ** (-7 / 16)
    assert method.pinned_options() == {"base": 10000.0, "floor_length": 256, "init_gain": 0.3, "normalise": True,
                                       "per_layer": False}
    # fixed, not trained: buffers in the weights, no parameter
    assert not list(method.parameters()) and {"cos_coef", "sin_coef"} <= set(method.state_dict())


def test_fope_equals_its_reference_loop_in_float64():
    torch.manual_seed(1)
    method = build_position_method("fope", SHAPE).double()
    q, k = torch.randn(2, 3, 9, 16, dtype=torch.float64), torch.randn(2, 3, 9, 16, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 17, 63, 64, 200, 1000])
    got_q, got_k = method.rotate_qk(q, k, positions)
    want_q, want_k = _fope_naive(method, q, k, positions)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-12)
    # the scores read m and n, not m - n alone: FoPE says it is not shift-invariant, and it is not
    shifted_q, shifted_k = method.rotate_qk(q, k, positions + 7)
    assert (got_q @ got_k.transpose(-1, -2) - shifted_q @ shifted_k.transpose(-1, -2)).abs().max() > 1e-3
    assert not method.is_shift_invariant()


def _pope_naive(method, q, k, q_pos, k_pos):
    """x-transformers: freqs[t, c] = t * base^(-c / dim) for c < dim; q' = cat(softplus(q) cos f, softplus(q) sin f),
    k' with f + bias (bias clamped to [-2 pi, 0], one per head and feature); dots = q' . k' * dim_head^-0.5, dim_head
    the head before widening. Here one pair (i, j) at a time, as the Hermitian product's real part."""
    B, H, Tq, hs = q.shape
    theta = [method.options.base ** (-c / hs) for c in range(hs)]
    bias = method.phase_bias.detach().double().clamp(-2 * math.pi, 0.0)
    scores = torch.zeros(B, H, Tq, k.shape[2], dtype=torch.float64)
    softplus = torch.nn.functional.softplus
    for h in range(H):
        for i, pi in enumerate(q_pos.tolist()):
            for j, pj in enumerate(k_pos.tolist()):
                total = 0.0
                for c in range(hs):
                    mq, mk = softplus(q[:, h, i, c]), softplus(k[:, h, j, c])
                    total = total + mq * mk * math.cos((pi - pj) * theta[c] - float(bias[h, c]))
                scores[:, h, i, j] = total / math.sqrt(hs)
    return scores


def test_pope_equals_its_reference_loop_in_float64_with_gradients():
    torch.manual_seed(2)
    method = build_position_method("pope", SHAPE, {"bias_init": "uniform"}).double()
    assert float(method.phase_bias.detach().min()) >= -2 * math.pi and float(method.phase_bias.detach().max()) <= 0
    q = torch.randn(1, 3, 6, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 6, 16, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0, 3, 4, 40, 90, 300])
    q2, k2 = method.rotate_qk(q, k, positions)
    assert q2.shape[-1] == 32 and k2.shape[-1] == 32
    got = q2 @ k2.transpose(-1, -2) / math.sqrt(q2.shape[-1])  # what attention does with the width it is handed
    want = _pope_naive(method, q, k, positions, positions)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    # gradients: the queries', the keys' and the phase's, against the same sums written with autograd-able ops
    weights = torch.randn_like(got)
    (g_q, g_k, g_b) = torch.autograd.grad((got * weights).sum(), (q, k, method.phase_bias))
    theta = method.options.base ** (-torch.arange(16, dtype=torch.float64) / 16)
    d = (positions[:, None] - positions[None, :]).double()  # (i, j)
    phase = d[None, :, :, None] * theta - method.phase_bias.clamp(-2 * math.pi, 0)[:, None, None, :]  # (H, i, j, c)
    mu_q, mu_k = torch.nn.functional.softplus(q), torch.nn.functional.softplus(k)
    ref = torch.einsum("bhic,bhjc,hijc->bhij", mu_q, mu_k, torch.cos(phase)) / 4.0
    torch.testing.assert_close(ref, want, rtol=0, atol=1e-10)
    r_q, r_k, r_b = torch.autograd.grad((ref * weights).sum(), (q, k, method.phase_bias))
    for a, b in ((g_q, r_q), (g_k, r_k), (g_b, r_b)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_pope_scores_depend_on_distance_alone_and_cached_decoding_matches():
    torch.manual_seed(3)
    method = build_position_method("pope", SHAPE, {"bias_init": "uniform"}).double()
    q, k = torch.randn(1, 3, 5, 16, dtype=torch.float64), torch.randn(1, 3, 5, 16, dtype=torch.float64)
    a = [t @ u.transpose(-1, -2) for t, u in [method.rotate_qk(q, k, torch.arange(5))]][0]
    b = [t @ u.transpose(-1, -2) for t, u in [method.rotate_qk(q, k, torch.arange(5) + 1000)]][0]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-9)
    assert method.is_shift_invariant()


def test_fope_as_the_training_code_has_it_one_set_per_layer_raw_coefficients():
    """The paper's training code (olmo/model.py): a FourierEmbedding in every block, each its own draw, and
    fourier_norm off by default (the coefficients used as drawn); the padding stays vLLM's (sin 0)."""
    torch.manual_seed(2)
    method = build_position_method("fope", SHAPE, {"per_layer": True, "normalise": False}).double()
    layers = [method.at_layer(layer) for layer in range(SHAPE.n_layer)]
    assert layers[0] is method and layers[1] is not method
    assert not torch.equal(layers[0].cos_coef, layers[1].cos_coef)  # each layer its own draw
    assert {"cos_coef", "later_layers.0.cos_coef"} <= set(method.state_dict())
    q, k = torch.randn(1, 3, 6, 16, dtype=torch.float64), torch.randn(1, 3, 6, 16, dtype=torch.float64)
    positions = torch.tensor([0, 3, 64, 65, 300, 4000])
    for layer in layers:
        got_q, got_k = layer.rotate_qk(q, k, positions)
        want_q, want_k = _fope_naive(layer, q, k, positions, normalise=False)
        torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-12)
        torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-12)
    # a model built with it runs, and its pinned options build it again
    net = GPT(ModelConfig(n_layer=2, n_head=3, n_embd=48, train_length=64, position="fope",
                          position_options={"per_layer": True})).eval()
    assert net.position.pinned_options()["per_layer"] is True and net(torch.randint(0, 256, (1, 20))).logits.isfinite().all()


def test_fope_refuses_a_shape_whose_normalised_coefficients_blow_up():
    """More kept frequencies than columns (hs 64, L 4,096: 23 for 16): the reference's step identity leaves columns
    12-15 without an entry, and such a column of noise over its sum blows up."""
    big = ModelShape(n_layer=1, n_head=2, head_dim=64, n_embd=128, train_length=4096)
    with pytest.raises(ConfigError, match="columns 12–15 without their identity entry"):
        build_position_method("fope", big)
    worst = []
    for seed in range(8):  # what the refusal spares: the same coefficients, normalised by hand
        torch.manual_seed(seed)
        raw = build_position_method("fope", big, {"normalise": False})
        cos, _ = raw.cos_sin(torch.arange(4096))
        assert cos.abs().max() < 10  # raw, as the training code's default: bounded
        C = raw.cos_coef.double()
        normalised = torch.einsum("tD,hDp->htp", torch.cos(torch.arange(4096, dtype=torch.float64)[:, None] * raw.kept_freq),
                                  C / C.sum(dim=1, keepdim=True))
        worst.append(float(normalised.abs().max()))
    assert max(worst) > 10, worst
    # the shipped shape is square (7 kept, 7 columns): normalised and bounded
    shipped = build_position_method("fope", ModelShape(4, 4, 32, 128, 256))
    assert shipped.series_pairs == shipped.kept_freq.numel() == 7 and shipped.cos_sin(torch.arange(4096))[0].abs().max() < 3


@pytest.mark.parametrize("name", ["pope", "fope", "canon", "path"])
def test_a_model_with_the_method_decodes_from_its_cache_as_it_runs_whole(name):
    torch.manual_seed(4)
    net = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=64, train_length=64, position=name)).eval()
    ids = torch.randint(0, 256, (1, 90))
    with torch.no_grad():
        whole = net(ids).logits
        probs = net(ids, attention_layer=1)
        cache = KVCache(n_layer=2)
        steps = [net(ids[:, :40], cache=cache).logits] + [net(ids[:, t:t + 1], cache=cache).logits for t in range(40, 90)]
    torch.testing.assert_close(probs.logits, whole, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat(steps, 1), whole, rtol=0, atol=1e-5)
    assert probs.attention.shape == (1, 4, 90, 90)
    torch.testing.assert_close(probs.attention.sum(-1), torch.ones(1, 4, 90), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name, options, words", [
    ("pope", {"bias_init": "normal"}, "bias_init"), ("pope", {"theta": 1}, "theta"),
    ("fope", {"floor_length": 1}, "floor_length"), ("fope", {"init_gain": -1.0}, "init_gain"),
    ("fope", {"base": 2.0, "floor_length": 2}, "keeps no frequency"), ("fope", {"normalise": "yes"}, "normalise"),
    ("fope", {"per_layer": 1}, "per_layer")])
def test_bad_options_are_refused_in_words(name, options, words):
    with pytest.raises(ConfigError, match=words):
        build_position_method(name, SHAPE, options)


def _canon_naive(h, weight, residual=True):
    """PhysicsLM4's ShortConvolution without the fast kernel, step by step: a cache of the last K inputs per channel
    (rolled, the new input written last), y = sum(cache * weight); then apply_canon's residual h + y."""
    B, T, D = h.shape
    K = weight.shape[-1]
    out = torch.zeros_like(h)
    for b in range(B):
        state = torch.zeros(D, K, dtype=h.dtype)
        for t in range(T):
            state = torch.roll(state, shifts=-1, dims=-1)
            state[:, -1] = h[b, t]
            y = (state * weight).sum(-1)
            out[b, t] = h[b, t] + y if residual else y
    return out


@pytest.mark.parametrize("site", ["A", "B", "C", "D"])
def test_canon_equals_its_reference_step_loop_with_gradients(site):
    torch.manual_seed(5)
    method = build_position_method("canon", SHAPE).double()
    width = {"A": 48, "B": 144, "C": 48, "D": 192}[site]
    weight = method.kernel(1, site)
    assert weight.shape == (width, 4)
    assert float(weight.abs().max()) <= 0.5  # nn.Conv1d's default draw for fan_in = 4: U(-1/2, 1/2)
    h = torch.randn(2, 11, width, dtype=torch.float64, requires_grad=True)
    got = method.mix_hidden(1, site, h)
    param = method.convs[f"1{site}"].weight  # (D, 1, K): the stored parameter
    want = _canon_naive(h, param[:, 0])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    g = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad((got * g).sum(), (h, param)),
                               torch.autograd.grad((want * g).sum(), (h, param)), rtol=0, atol=1e-12)
    # without the residual, and with a site left out
    bare = build_position_method("canon", SHAPE, {"residual": False, "sites": "AC"}).double()
    if site in "AC":
        torch.testing.assert_close(bare.mix_hidden(0, site, h), _canon_naive(h, bare.kernel(0, site), residual=False),
                                   rtol=0, atol=1e-12)
    else:
        assert bare.kernel(0, site) is None and bare.mix_hidden(0, site, h) is h


def test_canon_in_chunks_through_a_cache_equals_the_whole_pass():
    torch.manual_seed(6)
    method = build_position_method("canon", SHAPE).double()
    h = torch.randn(1, 20, 48, dtype=torch.float64)
    cache = KVCache(n_layer=2)
    parts = [method.mix_hidden(0, "A", h[:, a:b], cache) for a, b in ((0, 7), (7, 8), (8, 9), (9, 20))]
    torch.testing.assert_close(torch.cat(parts, 1), method.mix_hidden(0, "A", h), rtol=0, atol=1e-12)


@pytest.mark.parametrize("options, words", [({"sites": "ABE"}, "sites"), ({"sites": "AA"}, "sites"),
                                            ({"kernel": 1}, "kernel"), ({"conv": 4}, "conv")])
def test_canon_refuses_bad_options_in_words(options, words):
    with pytest.raises(ConfigError, match=words):
        build_position_method("canon", SHAPE, options)


def _path_naive_scores(q, k, w, beta):
    """PaTH written from the paper's equation as fla's decoding computes it: every cached key is turned by each new
    token's H_t = I - beta_t w_t w_t^T (``rank_one_update``) before the token's query reads it; the token's own key
    joins unturned. One query and one key at a time, in float64."""
    B, H, T, d = q.shape
    out = torch.zeros(B, H, T, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            keys = []
            for t in range(T):
                keys = [kk - beta[b, h, t] * (kk @ w[b, h, t]) * w[b, h, t] for kk in keys]
                keys.append(k[b, h, t])
                for j, kk in enumerate(keys):
                    out[b, h, t, j] = q[b, h, t] @ kk / math.sqrt(d)
    return out


def _path_naive_directions(layer, x):
    """fla's PaTHAttention: w = l2_norm(ShortConvolution(w_proj(x))) with the convolution's SiLU, split by head;
    beta = bt_proj(x).sigmoid() * 2. Loops over time for the kernel-3 causal convolution."""
    w_proj = x @ layer.w_down.weight.T @ layer.w_up.weight.T  # (B, T, C)
    kernel = layer.w_conv.weight[:, 0]  # (C, K)
    K = kernel.shape[-1]
    conv = torch.zeros_like(w_proj)
    for t in range(x.shape[1]):
        for s in range(K):  # weight column s reads x[t - K + 1 + s]
            if t - K + 1 + s >= 0:
                conv[:, t] = conv[:, t] + kernel[:, s] * w_proj[:, t - K + 1 + s]
    u = torch.nn.functional.silu(conv)
    B, T, C = x.shape
    w = u.view(B, T, SHAPE.n_head, -1).transpose(1, 2)
    w = w / torch.sqrt((w * w).sum(-1, keepdim=True) + 1e-6)
    beta = torch.sigmoid(x @ layer.beta.weight.T + layer.beta.bias).transpose(1, 2) * 2
    return w, beta


@pytest.mark.parametrize("T, block", [(5, 5), (64, 64), (70, 23), (150, 37)])
def test_path_scores_equal_the_decoding_loop_in_float64(T, block):
    from posviz.positions.path import ChunkedScores
    torch.manual_seed(7)
    q, k = torch.randn(1, 2, T, 8, dtype=torch.float64), torch.randn(1, 2, T, 8, dtype=torch.float64)
    w = torch.nn.functional.normalize(torch.randn(1, 2, T, 8, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(1, 2, T, dtype=torch.float64)  # reflections (beta > 1) too
    want = _path_naive_scores(q, k, w, beta)
    scores = ChunkedScores(q, k, w, beta)
    seen = torch.ones(T, T, dtype=torch.bool).tril()
    for r0 in range(0, T, block):  # blocks of queries in order, as attention asks, then one out of order
        r1 = min(T, r0 + block)
        got = scores(r0, r1, r1)
        torch.testing.assert_close(got.masked_fill(~seen[r0:r1, :r1], 0), want[..., r0:r1, :r1].masked_fill(~seen[r0:r1, :r1], 0),
                                   rtol=0, atol=1e-12)
    torch.testing.assert_close(scores(0, T, T).masked_fill(~seen, 0), want.masked_fill(~seen, 0), rtol=0, atol=1e-12)
    # the transform is the point: with beta = 0 (every H the identity) the scores are q . k, and with it they are not
    plain = ChunkedScores(q, k, w, torch.zeros_like(beta))(0, T, T)
    torch.testing.assert_close(plain.masked_fill(~seen, 0), (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~seen, 0),
                               rtol=0, atol=1e-12)
    if T > 1:
        assert (want - plain).masked_fill(~seen, 0).abs().max() > 1e-3


def test_path_layer_equals_fla_and_its_gradients_flow():
    torch.manual_seed(8)
    method = build_position_method("path", SHAPE).double()
    x = torch.randn(2, 13, 48, dtype=torch.float64, requires_grad=True)
    w, beta = method.directions(1, x)
    want_w, want_beta = _path_naive_directions(method.layers[1], x)
    torch.testing.assert_close(w, want_w, rtol=0, atol=1e-12)
    torch.testing.assert_close(beta, want_beta, rtol=0, atol=1e-12)
    assert float(beta.min()) > 0 and float(beta.max()) < 2
    # the initialisation fla's _init_weights gives: N(0, 0.02) weights, a zero bias (every beta starts at 1)
    assert float(method.layers[0].beta.bias.abs().max()) == 0 and 0.01 < float(method.layers[0].w_down.weight.std()) < 0.03
    # gradients of every parameter through the scores, against the loop readings
    q, k = torch.randn(2, 3, 13, 16, dtype=torch.float64), torch.randn(2, 3, 13, 16, dtype=torch.float64)
    state = method.token_state(1, x)
    got = method.content_scorer(1, q, k, state)(0, 13, 13)
    want = _path_naive_scores(q, k, want_w, want_beta)
    seen = torch.ones(13, 13, dtype=torch.bool).tril()
    g = torch.randn_like(got).masked_fill(~seen, 0)
    params = [x, *method.layers[1].parameters()]
    for a, b in zip(torch.autograd.grad((got * g).sum(), params), torch.autograd.grad((want * g).sum(), params)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_path_model_in_float32_stays_near_float64_at_2048_bytes():
    torch.manual_seed(9)
    wide = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=64, train_length=64, position="path")).double().eval()
    narrow = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=64, train_length=64, position="path")).eval()
    narrow.load_state_dict({k: v.float() for k, v in wide.state_dict().items()})
    ids = torch.randint(0, 256, (1, 2048))
    with torch.no_grad():
        assert (narrow(ids).logits.double() - wide(ids).logits).abs().max() < 1e-4


@pytest.mark.parametrize("method, reads_before", [("path", 2), ("canon", 6)])
def test_keys_that_read_the_bytes_before_them_are_kept_exactly_only_by_a_cache(method, reads_before, text_ids):
    """PaTH and NoPE + Canon read no position, so relabelling a cached window changes nothing; but PaTH's w convolution
    reads the 2 bytes before each key, and Canon's convolutions the 6 before it in the first layer (sites A and B), so
    a window re-encoded from its first byte differs a little from the same keys kept in a cache (``reads_before``; the
    generic window tests leave these methods out for that)."""
    from conftest import tiny_model
    from maths_support import sharp
    from posviz.labs import kv_cache
    from posviz.models.shipped import as_lab_model

    model = as_lab_model(sharp(tiny_model(method, n_layer=1)))
    assert model.position.reads_before == reads_before
    cached = kv_cache.sliding_score(model, text_ids, 8, "cached_window", 40)
    shifted = kv_cache.sliding_score(model, text_ids, 8, "shifted_cache", 40)
    reencode = kv_cache.sliding_score(model, text_ids, 8, "reencode", 40)
    assert np.allclose(shifted.id_bits, cached.id_bits, atol=1e-5)
    assert "Correct" in kv_cache.strategy_verdict(model, "shifted_cache")
    gap = np.abs(cached.id_bits - reencode.id_bits)[8:]
    assert 1e-6 < gap.max() < 0.05 and np.allclose(cached.id_bits[:8], reencode.id_bits[:8], atol=1e-5)
