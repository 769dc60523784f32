"""Positions from content (issue #35): FoX, CoPE and stick-breaking against their papers' equations, written
here loop by loop from the papers' text, on random inputs; and the properties each paper states.

The references share nothing with posviz's code but the layer's own projections (c_attn, c_proj): each
(query, key) pair is computed on its own with Python loops over the sums and products of the equations.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from posviz.models.kv_cache import KVCache
from posviz.positions.base import Seen

TOL = 1e-5


def layer_inputs(method: str, T: int = 9, seed: int = 0, **options):
    """A one-layer model of ``method`` with random position parameters, a random input and its q, k, v."""
    torch.manual_seed(seed)
    model = tiny_model(method, n_layer=1, position_options=options).double()
    with torch.no_grad():
        for p in model.position.parameters():
            p.normal_(0.0, 0.5)
        model.blocks[0].attn.c_attn.weight.mul_(4.0)  # peaked attention: the position terms matter
    x = torch.randn(2, T, model.config.n_embd, dtype=torch.float64)
    attn = model.blocks[0].attn
    B, H, hs = 2, model.config.n_head, model.config.n_embd // model.config.n_head
    q, k, v = F.linear(x, attn.c_attn.weight, attn.c_attn.bias).view(B, T, 3, H, hs).permute(2, 0, 3, 1, 4)
    return model, x, q, k, v


def posviz_layer(model, x) -> torch.Tensor:
    """What posviz's attention gives for ``x``, before the output projection is undone: (B, T, C)."""
    with torch.no_grad():
        return model.blocks[0].attn(x, torch.arange(x.shape[1]), model.position, 0, None, False, {})[0]


def project(model, y) -> torch.Tensor:  # y (B, H, T, hs) -> (B, T, C), through the layer's c_proj
    B, H, T, hs = y.shape
    attn = model.blocks[0].attn
    return F.linear(y.transpose(1, 2).reshape(B, T, H * hs), attn.c_proj.weight, attn.c_proj.bias)


def softmax_row(logits: list[float]) -> list[float]:
    top = max(logits)
    e = [math.exp(z - top) for z in logits]
    return [w / sum(e) for w in e]


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


# ------------------------------------------------------------------------------------- the papers
@torch.no_grad()
def fox_reference(model, x, q, k, v):
    """Lin et al. 2025, eqs. (3)-(5): f_t = sigma(w_f . x_t + b_f) per head; o_i = sum_j softmax_j(q_i . k_j
    / sqrt(d) + sum_{l=j+1..i} log f_l) v_j."""
    B, H, T, hs = q.shape
    gate = model.position.gates[0]
    y = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            f = [sigmoid(float(gate.weight[h] @ x[b, t] + gate.bias[h])) for t in range(T)]
            for i in range(T):
                logits = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(hs) + sum(math.log(f[l]) for l in range(j + 1, i + 1))
                          for j in range(i + 1)]
                w = softmax_row(logits)
                y[b, h, i] = sum(w[j] * v[b, h, j] for j in range(i + 1))
    return project(model, y)


@torch.no_grad()
def cope_reference(model, x, q, k, v):
    """Golovneva et al. 2024, eqs. (3)-(6): g_ij = sigma(q_i . k_j), p_ij = sum_{t=j..i} g_it, e[p] interpolated
    between e[floor p] and e[ceil p]; a_ij = softmax_j(q_i . k_j + q_i . e[p_ij]). As the reference code,
    q_i . k_j is scaled by 1/sqrt(d) in both, p is capped at npos_max - 1 and e[p] is not scaled."""
    B, H, T, hs = q.shape
    table, cap = model.position.tables[0], model.position.options.npos_max - 1
    y = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                z = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(hs) for j in range(i + 1)]
                logits = []
                for j in range(i + 1):
                    p = min(sum(sigmoid(z[t]) for t in range(j, i + 1)), cap)
                    lo, hi = math.floor(p), math.ceil(p)
                    e = (p - lo) * table[:, hi] + (1 - (p - lo)) * table[:, lo]
                    logits.append(z[j] + float(q[b, h, i] @ e))
                w = softmax_row(logits)
                y[b, h, i] = sum(w[j] * v[b, h, j] for j in range(i + 1))
    return project(model, y)


@torch.no_grad()
def stick_breaking_reference(model, x, q, k, v, attend_current=False):
    """Tan et al. 2025, eq. (2), as the reference forward computes it (shawntan/stickbreaking-attention,
    ``ref_fwd`` in tests/test_attn.py): beta_ij = sigma(q_i . k_j / sqrt(d)), A_ij = beta_ij prod_{j<k<i} (1 - beta_ik)
    for j < i (j <= i with ``attend_current``); o_i = sum_j A_ij v_j + (1 - sum_j A_ij) v_i: the remainder goes to
    the query's own value."""
    B, H, T, hs = q.shape
    y = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                keys = range(i + 1) if attend_current else range(i)
                beta = {j: sigmoid(float(q[b, h, i] @ k[b, h, j]) / math.sqrt(hs)) for j in keys}
                taken = 0.0
                for j in keys:
                    a = beta[j] * math.prod(1 - beta[m] for m in keys if m > j)
                    y[b, h, i] += a * v[b, h, j]
                    taken += a
                y[b, h, i] += (1.0 - taken) * v[b, h, i]
    return project(model, y)


REFERENCES = {"fox": fox_reference, "cope": cope_reference, "stick_breaking": stick_breaking_reference}


@pytest.mark.parametrize("method", sorted(REFERENCES))
def test_each_method_equals_its_papers_equations_pair_by_pair(method):
    model, x, q, k, v = layer_inputs(method)
    torch.testing.assert_close(posviz_layer(model, x), REFERENCES[method](model, x, q, k, v), rtol=0, atol=TOL)


def test_cope_counts_past_its_last_embedding_with_the_last_one():
    """npos_max = 3 on 9 bytes: counts reach 9, the cap (2) binds and the reference caps the same way."""
    model, x, q, k, v = layer_inputs("cope", npos_max=3)
    torch.testing.assert_close(posviz_layer(model, x), cope_reference(model, x, q, k, v), rtol=0, atol=TOL)


# ------------------------------------------------------------------------------------- properties
def _copy_all_but_position(src, dst):
    dst.load_state_dict({k: v for k, v in src.state_dict().items() if not k.startswith("position.")}, strict=False)
    return dst


def test_fox_with_every_gate_open_is_nope():
    """Gates of 1 (log f = 0) forget nothing: FoX is then NoPE, logit for logit."""
    fox = tiny_model("fox").double()
    with torch.no_grad():
        for gate in fox.position.gates:
            gate.weight.zero_()
            gate.bias.fill_(80.0)  # log sigmoid(80) = -2e-35: zero in double
    nope = _copy_all_but_position(fox, tiny_model("nope").double())
    idx = torch.randint(0, 256, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(fox(idx).logits, nope(idx).logits, rtol=0, atol=1e-10)


def test_fox_folded_into_the_fused_kernel_equals_its_blocks_where_the_gates_sum_to_thousands():
    """Without a cache or a map FoX's bias c_i - c_j rides in four extra query and key features through the fused
    causal kernel (``folded_scores``). Gates near e^-3 make c reach -6,000 over 2,048 bytes; the folded pass must still
    equal the blocks that add the bias computed in float64, logit for logit, and so must its gradient."""
    from posviz.models.attention import reference_attention

    fox = tiny_model("fox", n_layer=2, train_length=64)
    with torch.no_grad():
        for gate in fox.position.gates:
            gate.bias.fill_(-3.0)
    idx = torch.randint(0, 256, (1, 2048), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        folded = fox(idx).logits
        with reference_attention():
            blocks = fox(idx).logits
    assert fox.position.folded_scores(0, torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2)) is not None
    torch.testing.assert_close(folded, blocks, rtol=0, atol=2e-4)
    fox.train()
    fox.config.dropout = 0.0
    loss = fox(idx[:, :256]).logits.logsumexp(-1).mean()
    grad = torch.autograd.grad(loss, fox.position.gates[0].weight)[0]
    with reference_attention():
        loss = fox(idx[:, :256]).logits.logsumexp(-1).mean()
        expected = torch.autograd.grad(loss, fox.position.gates[0].weight)[0]
    torch.testing.assert_close(grad, expected, rtol=1e-3, atol=1e-6)


def test_fox_forgets_everything_behind_a_closed_gate():
    """A gate of 0 at byte t hides every key before t from every later query."""
    fox = tiny_model("fox", n_layer=1)
    T = 12
    state = torch.zeros(1, fox.config.n_head, T)
    state[..., 5] = -1e4  # log f_5: the gate at byte 5 closes
    scores = torch.zeros(1, fox.config.n_head, T, T)
    seen = Seen(torch.ones(T, T).tril().bool(), torch.arange(T), state)
    weights = fox.position.attention_weights(0, scores + fox.position.content_bias(0, scores, None, None, seen), seen)
    assert weights[..., 5:, :5].max() < 1e-30  # queries from byte 5 on see nothing before it
    assert weights[..., 4, :5].min() > 0.1  # a query before the gate sees its past


def test_cope_with_every_gate_open_counts_plain_distance():
    cope = tiny_model("cope")
    T = 10
    seen = Seen(torch.ones(T, T).tril().bool(), torch.arange(T))
    p = cope.position.counted_positions(torch.full((1, 1, T, T), 60.0), seen)  # sigmoid(60) = 1 in float32
    distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()
    torch.testing.assert_close(p[0, 0], torch.where(distance >= 0, distance + 1, 0.0))


def test_stick_breaking_with_its_own_key_equals_the_reference_too():
    model, x, q, k, v = layer_inputs("stick_breaking", attend_current=True)
    torch.testing.assert_close(posviz_layer(model, x), stick_breaking_reference(model, x, q, k, v, True),
                               rtol=0, atol=TOL)


def test_stick_breaking_first_byte_attends_to_its_own_value():
    """No key before the first byte: the whole remainder, 1, goes to its own value, so its attention output is
    v_0 in every layer (the model that dropped the remainder gave 0 there)."""
    model, x, q, k, v = layer_inputs("stick_breaking")
    torch.testing.assert_close(posviz_layer(model, x)[:, 0], project(model, v)[:, 0], rtol=0, atol=1e-12)
    assert project(model, v)[:, 0].abs().max() > 0.05  # not the 0 a dropped remainder gave


def test_stick_breaking_rows_sum_to_one_with_the_remainder_on_the_diagonal():
    sb = tiny_model("stick_breaking")
    T = 16
    seen = Seen(torch.ones(T, T).tril().bool(), torch.arange(T))
    scores = torch.randn(2, 4, T, T, dtype=torch.float64) * 3
    weights = sb.position.attention_weights(0, scores, seen)
    assert torch.all(weights >= 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, T, dtype=torch.float64), rtol=0, atol=1e-12)
    # the diagonal is the remainder: the product of (1 - beta) over every earlier key
    beta = scores.sigmoid().masked_fill(~torch.ones(T, T).tril(-1).bool(), 0.0)
    torch.testing.assert_close(weights.diagonal(dim1=-2, dim2=-1), (1 - beta).prod(-1), rtol=1e-9, atol=1e-12)
    scores[..., 12, 7] = 1e4  # beta = 1: key 7 takes what query 12 has left, nothing behind it gets any, nor itself
    weights = sb.position.attention_weights(0, scores, seen)
    assert weights[..., 12, :7].abs().max() == 0 and weights[..., 12, 12].abs().max() < 1e-12
    assert weights[..., 12, 7:12].sum(-1).sub(1).abs().max() < 1e-9


@pytest.mark.parametrize("method", sorted(REFERENCES))
def test_a_sliding_window_cache_never_needs_re_encoding(method):
    """Content, not index, decides: the keys kept in a window of W give the same logits whatever positions the
    window's bytes are said to sit at (the KV cache lab's check, here at every step of a long decode). One
    layer, so that re-encoding the window is the exact reference (deeper, a kept key saw older bytes)."""
    model = tiny_model(method, n_layer=1)
    idx = torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(3))
    W = 8
    with torch.no_grad():
        cache = KVCache(model.config.n_layer, max_size=W)
        stepped = torch.cat([model(idx[:, t:t + 1], cache=cache).logits for t in range(48)], dim=1)
        for t in range(W, 48):  # the window ending at byte t, encoded afresh at positions 0..W-1
            fresh = model(idx[:, t - W + 1:t + 1]).logits[:, -1]
            torch.testing.assert_close(stepped[:, t], fresh, rtol=0, atol=1e-4)
