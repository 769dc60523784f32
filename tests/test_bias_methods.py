"""The four methods added after the first seven — Transformer-XL, NEZHA, KERPLE, FIRE — against their
papers' formulas on tiny cases with hand-computed numbers, and a short training run of each.

What every method must satisfy (causality, cached decoding = full forward, bad options) is in the
contract tests, which cover these methods through the registry without naming them.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from posviz.explore import attention_biases
from posviz.models.checkpoint_files import load_checkpoint
from posviz.models.byte_gpt import GPT
from posviz.positions import ModelShape, build_position_method
from posviz.training.train import TrainConfig, train

SHAPE = ModelShape(n_layer=2, n_head=2, head_dim=4, n_embd=8, train_length=16)
POS3 = torch.arange(3)


def lower_triangle(matrix: torch.Tensor) -> torch.Tensor:
    """Keys after the query are masked by attention, so only j <= i is the method's business."""
    return torch.where(torch.tril(torch.ones(matrix.shape[-2:], dtype=torch.bool)), matrix, torch.zeros(()))


def test_kerple_log_bias_by_hand():
    method = build_position_method("kerple", SHAPE)
    with torch.no_grad():
        method.r1[1] = torch.tensor([1.0, 2.0])
        method.r2[1] = torch.tensor([0.5, 1.0])
    bias = method.logit_bias(1, torch.zeros(1, 2, 3, 4), POS3, POS3)[0]  # (H, 3, 3)
    # -r1 log(1 + r2 d): head 0 (1, 0.5): d=1 -> -log 1.5, d=2 -> -log 2; head 1 (2, 1): -2 log 2, -2 log 3
    expected = torch.tensor([
        [[0.0, 0, 0], [-0.405465, 0.0, 0], [-0.693147, -0.405465, 0.0]],
        [[0.0, 0, 0], [-1.386294, 0.0, 0], [-2.197225, -1.386294, 0.0]],
    ])
    torch.testing.assert_close(lower_triangle(bias), expected, atol=1e-5, rtol=0)


def test_kerple_uses_positive_r1_and_r2_and_lets_low_ones_recover():
    method = build_position_method("kerple", SHAPE).train()
    with torch.no_grad():
        method.r1.fill_(-3.0)
    r1, _ = method.parameters_of(0)
    assert torch.allclose(r1, torch.full_like(r1, 0.01))  # the value used is clamped ...
    r1.sum().backward()
    assert torch.all(method.r1.grad[0] == 1.0)  # ... but the gradient still reaches the stored value


def linear_fire(threshold: float, c: float, weights: list[float]):
    """A FIRE whose MLP is f(u) = w_h * u (first layer passes u >= 0 through one ReLU unit)."""
    method = build_position_method("fire", SHAPE, {"threshold_init": threshold, "c_init": c, "mlp_width": 3})
    with torch.no_grad():
        for fn in method.functions:  # the same function in every layer
            first, _, second = fn.mlp
            first.weight.zero_(), first.bias.zero_(), second.weight.zero_(), second.bias.zero_()
            first.weight[0, 0] = 1.0
            second.weight[:, 0] = torch.tensor(weights)
    return method


def test_fire_bias_by_hand_below_and_past_the_threshold():
    # c = 1, L = 2: psi(x) = log(x + 1); queries 0..2 are normalised by psi(2) = log 3, query 3 by log 4.
    method = linear_fire(threshold=2.0, c=1.0, weights=[1.0, -2.0])
    pos = torch.arange(4)
    bias = method.logit_bias(0, torch.zeros(1, 2, 4, 4), pos, pos)[0]  # (H, 4, 4)
    log2, log3, log4 = math.log(2), math.log(3), math.log(4)
    head0 = torch.tensor([
        [0.0, 0, 0, 0],
        [log2 / log3, 0, 0, 0],
        [log3 / log3, log2 / log3, 0, 0],
        [log4 / log4, log3 / log4, log2 / log4, 0],
    ])
    torch.testing.assert_close(lower_triangle(bias), torch.stack([head0, -2 * head0]), atol=1e-5, rtol=0)
    # Only queries below the threshold: the per-distance table path gives the same rows.
    short = method.logit_bias(0, torch.zeros(1, 2, 3, 3), POS3, POS3)[0]
    method.forget()
    torch.testing.assert_close(lower_triangle(short), torch.stack([head0, -2 * head0])[:, :3, :3], atol=1e-5, rtol=0)


def test_fire_squeezes_every_context_into_the_trained_range():
    columns = attention_biases.fire_normalised_distance([256, 4096], c=0.1, threshold=512)
    for n in (256, 4096):
        u = columns["normalised"][columns["context"] == n]
        assert u.min() == 0 and u.max() <= 1.0 and np.all(np.diff(u) > 0)
    far = columns["normalised"][(columns["context"] == 4096)][-1]
    assert far == pytest.approx(1.0, abs=1e-5)  # the farthest key of a long context maps to 1, as in training


def test_nezha_table_is_the_sinusoid_of_the_clipped_distance():
    method = build_position_method("nezha", SHAPE, {"max_distance": 2})
    table = method.relative_keys(0, POS3, POS3)  # (k+1, hs)
    for d in range(3):
        for i in range(2):
            assert float(table[d, 2 * i]) == pytest.approx(math.sin(d / 10000 ** (2 * i / 4)), abs=1e-6)
            assert float(table[d, 2 * i + 1]) == pytest.approx(math.cos(d / 10000 ** (2 * i / 4)), abs=1e-6)
    assert not any(True for _ in method.parameters())  # fixed: nothing to learn
    q = torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(4)
    bias = method.logit_bias(1, q, pos, pos)[0]
    for i in range(4):
        for j in range(i + 1):
            expected = float(q[0, 1, i] @ table[min(i - j, 2)]) / 2.0  # / sqrt(hs)
            assert float(bias[1, i, j]) == pytest.approx(expected, abs=1e-5)


def test_nezha_is_shaw_with_a_fixed_table():
    shaw = build_position_method("shaw", SHAPE, {"max_distance": 3})
    nezha = build_position_method("nezha", SHAPE, {"max_distance": 3})
    with torch.no_grad():
        shaw.rel_keys.copy_(nezha.rel_keys.expand_as(shaw.rel_keys))
    q = torch.randn(2, 2, 6, 4, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(6)
    torch.testing.assert_close(nezha.logit_bias(0, q, pos, pos), shaw.logit_bias(0, q, pos, pos))


def random_txl(seed: int = 0):
    model = tiny_model("transformer_xl", seed=seed)
    with torch.no_grad():
        for p in model.position.parameters():
            p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed + 1))
    return model


def test_transformer_xl_four_terms_by_hand():
    method = build_position_method("transformer_xl", SHAPE)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in method.parameters():
            p.normal_(generator=gen)
    q, k = torch.randn(1, 2, 3, 4, generator=gen), torch.randn(1, 2, 3, 4, generator=gen)
    terms = method.four_terms(1, q, k, POS3, POS3)
    W = method.proj[1].weight  # (C, C): W_R of layer 1

    def R(d: int) -> torch.Tensor:  # sinusoid of the distance, width C = 8, interleaved sin/cos
        return torch.tensor([f(d / 10000 ** (2 * (c // 2) / 8)) for c in range(8) for f in [(math.sin, math.cos)[c % 2]]])

    h, i, j = 1, 2, 0
    WR = (W @ R(i - j)).view(2, 4)[h]  # this head's slice of W_R R_(i-j)
    by_hand = {
        "content-content": q[0, h, i] @ k[0, h, j],
        "content-position": q[0, h, i] @ WR,
        "global content bias": method.u[h] @ k[0, h, j],
        "global position bias": method.v[h] @ WR,
    }
    for name, value in by_hand.items():
        assert float(terms[name][0, h, i, j].detach()) == pytest.approx(float(value.detach()) / 2.0, abs=1e-5), name


def test_transformer_xl_terms_sum_to_the_models_own_attention():
    model = random_txl()
    ids = list(b"def f(x):\n    return x")
    for layer in range(model.config.n_layer):
        terms = attention_biases.transformer_xl_terms(model, ids, layer)
        with torch.no_grad():
            probs = model(torch.tensor([ids]), attention_layer=layer).attention[0].double().numpy()  # (H, T, T)
        np.testing.assert_allclose(np.nan_to_num(terms["weight"]), probs, atol=1e-5)
    # and each term matters: dropping the position terms changes where the queries look
    moved = np.nanmax(np.abs(terms["content-position"] + terms["global position bias"]))
    assert moved > 0.1


def test_deciding_term_names_the_term_that_moves_the_top_key():
    model = random_txl(3)
    ids = list(b"abcabcabcabc")
    terms = attention_biases.transformer_xl_terms(model, ids, 0)
    shares = attention_biases.deciding_term(terms, head=0, query=11)
    assert set(shares) == set(attention_biases.TXL_TERMS)
    rows = attention_biases.transformer_xl_query_rows(terms, 0, 11, [chr(b) for b in ids])
    assert len(rows["key"]) == 4 * 12 and set(rows["term"]) == set(attention_biases.TXL_TERMS)
    totals = rows["total"][rows["term"] == "content-content"]
    summed = sum(rows["value"][rows["term"] == t] for t in attention_biases.TXL_TERMS)
    np.testing.assert_allclose(summed, totals, atol=1e-9)


@pytest.mark.parametrize("method", ["kerple", "fire"])
def test_bias_by_distance_is_what_the_model_adds(method):
    model = tiny_model(method, seed=4)
    with torch.no_grad():
        for p in model.position.parameters():
            p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(5))
    n = 40
    curve = attention_biases.bias_by_distance(model.position, 1, n)  # (H, n)
    pos = torch.arange(n)
    full = model.position.logit_bias(1, torch.zeros(1, 4, n, 8), pos, pos)[0, :, -1].flip(-1)  # last row, by distance
    model.position.forget()
    np.testing.assert_allclose(curve, full.detach().double().numpy(), atol=1e-5)


@pytest.mark.parametrize("method", ["transformer_xl", "nezha", "kerple", "fire"])
def test_a_short_training_run_lowers_the_loss_and_moves_the_position_parameters(method, tmp_path):
    cfg = TrainConfig(method=method, n_layer=2, n_head=2, n_embd=32, train_length=32, batch_size=8,
                      tokens=8 * 32 * 200, warmup_steps=10, eval_bytes=1024, log_every=20, precision="fp32")
    metrics = train(cfg, out=tmp_path / method, progress=False, state_dir=tmp_path / f"{method}.state")  # not ./runs
    curve = [row["train_bpb"] for row in metrics["train_curve"]]
    assert curve[-1] < curve[0] - 2.0, curve  # from ~8 bits/byte (uniform) to well under 6
    assert metrics["val_bpb_at_train_length"] < 6.0
    torch.manual_seed(cfg.seed)  # the initial weights train() started from
    initial = dict(GPT(cfg.model_config()).position.named_parameters())
    trained = dict(load_checkpoint(tmp_path / method).position.named_parameters())
    assert set(initial) == set(trained)
    for name, p in trained.items():  # gradients reach every position parameter (nezha has none) ...
        if name.endswith("mlp.2.bias"):  # ... but FIRE's output bias: one constant per head on every logit of a row
            assert torch.allclose(p.float(), initial[name].float(), atol=1e-2)  # cancels in the softmax
            continue
        assert not torch.allclose(p.float(), initial[name].float(), atol=1e-3), name


def test_fire_by_linear_pieces_is_its_mlp():
    """Past the threshold attention reads FIRE's MLP as the piecewise-linear function it is; it must
    be the same function: on random weights, at the switch points themselves, with a unit that never
    switches (weight 0) and two units that switch at the same point."""
    method = build_position_method("fire", SHAPE, {"mlp_width": 16})
    fn = method.function(1)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in fn.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 2)
        first = fn.mlp[0]
        first.weight[3, 0] = 0.0
        first.weight[5, 0], first.bias[5] = 2.0, -1.0  # switches at 0.5 ...
        first.weight[6, 0], first.bias[6] = -4.0, 2.0  # ... and so does this one, the other way
        points, pieces = fn.linear_pieces()
        u = torch.cat((torch.linspace(-0.5, 1.5, 5001), points, torch.tensor([0.0, 1.0, 0.5])))
        expected, got = fn.bias_of(u), method.bias_by_pieces(1, u)
    assert points.numel() == 15 and pieces.shape == (16, 4)  # 15 switch points -> 16 pieces of 2 heads x (slope, intercept)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert expected.abs().max() > 5  # weights large enough for a wrong piece to show


def test_fire_by_distance_columns_is_its_mlp():
    """Past the threshold a block of consecutive queries takes one line per distance column, and looks
    up pair by pair only the columns whose rows straddle a switch point. With switch points spread
    over [0, 1] (so some columns do straddle), every (query, key) pair must still get its MLP's
    value: blocks past L, across L, of one query, with keys that start late or lie in the future."""
    method = build_position_method("fire", SHAPE, {"mlp_width": 16, "threshold_init": 8.0})
    fn = method.function(0)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        fn.mlp[0].weight.copy_(torch.randn(16, 1, generator=gen) * 3)
        fn.mlp[0].bias.copy_(torch.rand(16, generator=gen) * 2 - 1)
        fn.mlp[2].weight.copy_(torch.randn(2, 16, generator=gen))
        points, _ = fn.linear_pieces()
        for q0, rows, k0, keys in [(200, 48, 0, 248), (4, 20, 0, 24), (300, 1, 37, 264), (60, 16, 50, 40)]:
            q_pos, k_pos = torch.arange(q0, q0 + rows), torch.arange(k0, k0 + keys)
            u = fn.normalised_distance(q_pos, k_pos)
            expected, got = fn.bias_of(u), method.bias_of_runs(0, q0, rows, k0, keys)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert int(((points > 0) & (points < 1)).sum()) >= 5
    # the first block has columns (one distance each) whose rows fall in different pieces
    q_pos, k_pos = torch.arange(200, 248), torch.arange(248)
    piece = torch.searchsorted(points, fn.normalised_distance(q_pos, k_pos).detach())
    distance = q_pos[:, None] - k_pos[None, :]
    assert any(piece[distance == d].unique().numel() > 1 for d in range(1, 200))


def test_fire_past_its_threshold_gives_the_logits_of_its_mlp():
    """Inference (no gradients) takes the pieces; training takes the MLP. Same logits, long past L."""
    model = tiny_model("fire", seed=4).eval()
    with torch.no_grad():
        for fn in model.position.functions:
            fn.threshold_scale.fill_(16 / fn.threshold_init)  # L = 16: most of 80 queries are past it
            for p in fn.mlp.parameters():
                p.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(6))
    idx = torch.randint(0, 256, (2, 80), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        by_pieces = model(idx).logits
    by_mlp = model(idx).logits.detach()  # gradients enabled: the MLP path
    torch.testing.assert_close(by_pieces, by_mlp, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------------
# The workshop's formulas (posviz/positions/formula_language.py, issue #47): the same biases as the methods
# ------------------------------------------------------------------------------------------------
def test_alibi_and_kerple_log_written_as_formulas_are_their_methods_biases():
    """ALiBi as -m[h] * d and KERPLE-log as -a[layer, h] * log(1 + b[layer, h] * d), at the methods' own parameter
    values, equal ``logit_bias`` on every causal pair (the formula's own -inf above the diagonal)."""
    from posviz.positions.formula_language import evaluate, parse_formula

    T, H = 24, 4
    shape = ModelShape(n_layer=2, n_head=H, head_dim=8, n_embd=32, train_length=16)
    pos = torch.arange(T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    alibi = build_position_method("alibi", shape)
    want = alibi.logit_bias(0, torch.zeros(1, H, T, 8), pos, pos)[0].double().expand(H, T, T)
    slopes = want[:, 1, 0].neg()  # the bias at distance 1 is minus each head's slope
    got = evaluate(parse_formula("-m[h] * d"), T, H, 16, parameters={"m": slopes})
    assert got.dtype == torch.float32  # walked in the precision attention adds it in
    torch.testing.assert_close(got[:, causal].double(), want[:, causal])
    assert torch.isneginf(got[:, ~causal]).all()

    torch.manual_seed(3)
    kerple = build_position_method("kerple", shape)
    formula = parse_formula("-a[layer, h] * log(1 + b[layer, h] * d)")
    assert formula.parameters == {"a": ("layer", "h"), "b": ("layer", "h")} and formula.shift_invariant()
    for layer in (0, 1):
        r1, r2 = kerple.parameters_of(layer)
        want = kerple.logit_bias(layer, torch.zeros(1, H, T, 8), pos, pos)[0].double()
        table = {"a": torch.stack([kerple.parameters_of(n)[0] for n in (0, 1)]).detach(),
                 "b": torch.stack([kerple.parameters_of(n)[1] for n in (0, 1)]).detach()}
        got = evaluate(formula, T, H, 16, layer=layer, parameters=table).double()
        torch.testing.assert_close(got[:, causal], want.expand(H, T, T)[:, causal], rtol=1e-6, atol=1e-6)
    assert not parse_formula("-0.1 * (i - j) + 0 * i").shift_invariant()  # reads i: not a function of d alone
