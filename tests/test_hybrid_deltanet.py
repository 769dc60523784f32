"""The hybrid's recurrent layer against transformers' ``Qwen3NextGatedDeltaNet`` (forward and gradients), its three
forms of one rule held equal in float64 (byte by byte, by chunks, and the implied matrix a lab draws), cached decoding
equal to the whole pass, and a deliberately broken copy that fails."""
from __future__ import annotations

import pytest
import torch

from posviz.config import ModelConfig
from posviz.models import gated_deltanet as gd
from posviz.models.byte_gpt import GPT
from posviz.models.kv_cache import KVCache

H, HS, C, T = 3, 8, 24, 70


def _reference():
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    config = Qwen3NextConfig(hidden_size=C, linear_num_value_heads=H, linear_num_key_heads=H, linear_key_head_dim=HS,
                             linear_value_head_dim=HS, linear_conv_kernel_dim=4, hidden_act="silu", rms_norm_eps=1e-6,
                             num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"])
    return Qwen3NextGatedDeltaNet(config, layer_idx=0).double()


def _pair():
    torch.manual_seed(0)
    reference = _reference()
    with torch.no_grad():  # away from the initial values, so that every parameter's place is tested
        reference.norm.weight.uniform_(0.5, 1.5)
        reference.dt_bias.uniform_(-1, 1)
    mine = gd.GatedDeltaNet(C, H).double()
    mine.load_state_dict(reference.state_dict())  # the same names and layouts: [q | k | v | z] and [b | a] per head
    return reference, mine


def test_the_gated_deltanet_layer_equals_qwen3_next_gated_deltanet():
    reference, mine = _pair()
    x = torch.randn(2, T, C, dtype=torch.float64, requires_grad=True)
    want = reference(x)  # T = 70: the reference's chunked form, two chunks of 64
    x2 = x.detach().clone().requires_grad_(True)
    got, _ = mine(x2)
    # the reference runs the rule and its norm in float32 whatever its input (``.to(torch.float32)``): 5e-6 of
    # outputs up to about 0.05 (a broken rule is off by more than 1e-3); posviz's own forms agree in float64 below
    assert want.abs().max() > 1e-2
    torch.testing.assert_close(got, want, rtol=0, atol=5e-6)
    want.square().sum().backward()
    got.square().sum().backward()
    # gradients: each within 1e-5 of its largest entry (float32's rounding summed over 140 bytes)
    theirs = {"x": x.grad} | {name: p.grad for name, p in reference.named_parameters()}
    ours = {"x": x2.grad} | {name: p.grad for name, p in mine.named_parameters()}
    for name, grad in ours.items():
        assert float((grad - theirs[name]).abs().max()) < 1e-5 * float(theirs[name].abs().max()), name
    # a broken copy (the plain linear-attention update, without the delta rule's correction) fails the same check
    with torch.no_grad():
        rule = gd.chunked
        gd.chunked = lambda q, k, v, g, beta, state=None: gd.recurrent(q, k, v, g, beta * 0 + 1e-9, state)
        try:
            wrong, _ = mine(x2)
        finally:
            gd.chunked = rule
    assert (wrong - want).abs().max() > 1e-3


def test_a_loop_by_loop_reading_of_the_reference_rule_equals_each_form_in_float64():
    """The rule as ``torch_recurrent_gated_delta_rule`` runs it, one statement at a time in float64 here: decay the
    state, read it with the key, write beta times the difference, read with the query."""
    torch.manual_seed(1)
    B, n = 2, 150
    q, k, v = (torch.randn(B, H, n, HS, dtype=torch.float64) for _ in range(3))
    q, k = gd.l2_normed(q) / HS ** 0.5, gd.l2_normed(k)
    g, beta = -torch.rand(B, H, n, dtype=torch.float64) * 2, torch.rand(B, H, n, dtype=torch.float64)
    state = torch.zeros(B, H, HS, HS, dtype=torch.float64)
    want = torch.zeros(B, H, n, HS, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = state[b, h].clone()
            for t in range(n):
                S = S * torch.exp(g[b, h, t])
                memory = S.T @ k[b, h, t]  # what the state says of this key
                S = S + torch.outer(k[b, h, t], beta[b, h, t] * (v[b, h, t] - memory))
                want[b, h, t] = S.T @ q[b, h, t]
    by_byte, last = gd.recurrent(q, k, v, g, beta)
    by_chunk, last_chunked = gd.chunked(q, k, v, g, beta, chunk=32)  # 150 = 4 chunks and a leftover of 22
    torch.testing.assert_close(by_byte, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(by_chunk, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(last_chunked, last, rtol=0, atol=1e-12)
    # the implied matrix is what it claims: times the values it gives the output, weight by weight
    weights = gd.implied_matrix(q, k, g, beta)
    torch.testing.assert_close(weights @ v, want, rtol=0, atol=1e-12)
    assert bool((weights.triu(1) == 0).all())  # no byte reads a later one
    # one weight by its definition: q_t^T [prod_(r = t..s+1) alpha_r (I - beta_r k_r k_r^T)] beta_s k_s
    s_, t_ = 3, 9
    carried = beta[0, 0, s_] * k[0, 0, s_]
    for r in range(s_ + 1, t_ + 1):
        carried = torch.exp(g[0, 0, r]) * (carried - beta[0, 0, r] * k[0, 0, r] * (k[0, 0, r] @ carried))
    assert float(weights[0, 0, t_, s_]) == pytest.approx(float(q[0, 0, t_] @ carried), abs=1e-14)


def test_the_implied_matrix_reproduces_the_layer_output_before_its_norm_and_gate():
    _, mine = _pair()
    x = torch.randn(1, 40, C, dtype=torch.float64)
    with torch.no_grad():
        q, k, v, g, beta, z = mine.inputs(x)  # v after the short convolution, as the rule reads it
        rule, _ = gd.chunked(q, k, v, g, beta)
        weights = gd.implied_matrix(q, k, g, beta)
        _, drawn = mine(x, want_probs=True)
    torch.testing.assert_close(weights @ v, rule, rtol=0, atol=1e-12)
    torch.testing.assert_close(drawn, weights, rtol=0, atol=0)


def test_the_hybrid_puts_recurrent_layers_in_attentions_place_and_decodes_as_it_runs_whole():
    net = GPT(ModelConfig(n_layer=4, n_head=4, n_embd=128, train_length=256, position="hybrid_deltanet")).eval()
    assert net.position.layer_types == ["linear_attention"] * 3 + ["full_attention"]  # Qwen3-Next's interval of 4
    assert [b.attn is None for b in net.blocks] == [True, True, True, False]  # no attention weights nothing reads
    assert [net.position.layer_kind(i) for i in range(4)][2:] == ["Gated DeltaNet (recurrent)", "attention"]
    ids = torch.randint(0, 256, (1, 90))
    with torch.no_grad():
        whole = net(ids).logits
        cache = KVCache(n_layer=4)
        steps = [net(ids[:, :30], cache=cache).logits] + [net(ids[:, t:t + 1], cache=cache).logits for t in range(30, 90)]
        assert cache.next_position() == 90
        maps = net(ids[:, :20], attention_layer=1).attention  # a recurrent layer's implied matrix, as a map
    torch.testing.assert_close(torch.cat(steps, 1), whole, rtol=0, atol=1e-5)
    assert maps.shape == (1, 4, 20, 20) and bool((maps.triu(1) == 0).all())


def test_a_lab_draws_a_recurrent_layer_as_its_implied_matrix_and_says_so():
    from posviz.labs.attention_maps import attention_probs, attention_view
    from posviz.models.shipped import as_lab_model

    torch.manual_seed(4)
    model = as_lab_model(GPT(ModelConfig(n_layer=4, n_head=4, n_embd=64, train_length=64,
                                         position="hybrid_deltanet")).eval())
    ids = torch.randint(0, 256, (80,))
    assert [model.layer_kind(i) for i in range(4)] == ["Gated DeltaNet (recurrent)"] * 3 + ["attention"]
    view = attention_view(model, ids, 60, 1, log_scale=False)
    assert view.kind == "Gated DeltaNet (recurrent)"
    shares = attention_probs(model, ids, 60, 1)
    with torch.no_grad():
        implied = model.net(ids[None, :60], attention_layer=1).attention[0]
    torch.testing.assert_close(shares.sum(-1), torch.ones(4, 60), rtol=0, atol=1e-5)  # each row's |w| shares
    torch.testing.assert_close(shares * implied.abs().sum(-1, keepdim=True), implied.abs(), rtol=1e-4, atol=1e-7)
    assert attention_view(model, ids, 60, 3).kind == "attention"


def test_the_rows_of_cached_queries_are_the_whole_matrix_rows():
    """``implied_rows`` (the sweep from each query back) equals ``implied_matrix`` (from each key forward) in float64;
    a cached pass on a cache made for maps returns the rows the whole pass draws, every layer; any other cache says
    in words why it cannot."""
    from posviz.errors import PosvizError

    torch.manual_seed(1)
    q, k = torch.randn(2, H, 37, HS, dtype=torch.float64), gd.l2_normed(torch.randn(2, H, 37, HS, dtype=torch.float64))
    g, beta = -torch.rand(2, H, 37, dtype=torch.float64), torch.rand(2, H, 37, dtype=torch.float64)
    whole = gd.implied_matrix(q, k, g, beta)
    torch.testing.assert_close(gd.implied_rows(q[:, :, -5:], k, g, beta), whole[:, :, -5:], rtol=0, atol=1e-14)
    torch.testing.assert_close(gd.implied_rows(q, k, g, beta), whole, rtol=0, atol=1e-14)

    net = GPT(ModelConfig(n_layer=4, n_head=4, n_embd=64, train_length=64, position="hybrid_deltanet")).double().eval()
    ids = torch.randint(0, 256, (2, 50))
    with torch.no_grad():
        for layer in (0, 2, 3):
            full = net(ids, attention_layer=layer).attention  # (B, H, 50, 50)
            cache = KVCache(n_layer=4, for_maps=True)
            net(ids[:, :30], cache=cache)
            net(ids[:, 30:41], cache=cache)  # two cached passes before the rows asked for
            rows = net(ids[:, 41:], cache=cache, attention_layer=layer).attention
            torch.testing.assert_close(rows, full[:, :, 41:], rtol=0, atol=1e-10)
        plain = KVCache(n_layer=4)
        net(ids[:, :30], cache=plain)
        with pytest.raises(PosvizError, match="needs a cache made for maps"):
            net(ids[:, 30:], cache=plain, attention_layer=0)
    with pytest.raises(PosvizError, match="whole text"):
        KVCache(n_layer=4, max_size=16, for_maps=True)


def test_the_induction_probe_reads_a_recurrent_layer_as_its_share_of_the_implied_row():
    """The Retrieval lab's induction scores of a hybrid: every layer measured, a recurrent layer's score the share of
    its |w| on the byte after the earlier copy, as the whole pass's implied matrix gives it."""
    from posviz.labs.attention_maps import implied_shares
    from posviz.labs.probes import held_out, induction_scores, repeat_batch
    from posviz.models.shipped import as_lab_model

    torch.manual_seed(2)
    model = as_lab_model(GPT(ModelConfig(n_layer=4, n_head=4, n_embd=64, train_length=64,
                                         position="hybrid_deltanet")).eval())
    text = bytes(range(32, 127)) * 40
    scores = induction_scores(model, text, [16], chunk=16, chunks=2, seed=0)[16]
    assert scores.shape == (4, 4) and bool(((scores >= 0) & (scores <= 1)).all())
    batch = repeat_batch(held_out(text, model), 16, 16, 2, 16, unit=model.unit)  # as the probe draws it (seed + gap)
    with torch.no_grad():
        shares = implied_shares(model.net(batch, attention_layer=1).attention.float())  # (B, H, T, T)
    t = torch.arange(15)
    expected = shares[:, :, 32 + t, t + 1].mean(dim=(0, 2)).numpy()
    assert scores[1] == pytest.approx(expected, abs=1e-5)


def test_the_sink_measures_read_the_attention_layers_alone(corpus, monkeypatch):
    """``eval.sinks`` of a hybrid: a recurrent layer's entries are None (its implied matrix is no softmax share), the
    attention layer's are the lab's first-byte shares and leave no weight unspent."""
    from posviz.labs import kv_cache
    from posviz.models.shipped import as_lab_model
    from posviz.training import evaluate as ev

    monkeypatch.setattr(ev, "SINK_IDS", 120)
    monkeypatch.setattr(ev, "SINK_WINDOW", 40)
    torch.manual_seed(5)
    net = GPT(ModelConfig(n_layer=4, n_head=4, n_embd=64, train_length=64, position="hybrid_deltanet")).eval()
    documents = [bytes(corpus.eval_documents[i][:200]) for i in range(2)]
    block = ev.sinks_block(net, documents, corpus.eval_stream(1 << 12))
    assert [heads is None for heads in block["first_byte_share"]] == [True, True, True, False]
    assert block["weight_left_by_layer"][:3] == [None] * 3 and abs(block["weight_left_by_layer"][3]) < 1e-4
    lab = as_lab_model(net)
    rows = [kv_cache.first_id_share(lab, torch.tensor(list(d))) for d in documents]
    assert {r["layer"] for r in rows[0]} == {3}
    expected = [sum(r[h]["share"] for r in rows) / len(rows) for h in range(4)]
    assert block["first_byte_share"][3] == pytest.approx(expected, abs=1e-4)
