"""The methods of 2025 on their pages (tiny checkpoints: 2 layers, 4 heads of 8 features, training length 32):
FoPE's series, PoPE's phases and Canon's kernels on the RoPE page, PaTH's turned keys on the Positions from content
page. Each number shown is checked against the checkpoint's own weights."""
from __future__ import annotations

import math

import numpy as np
import pytest
from posviz.models.checkpoint_files import shipped_checkpoints
from posviz.models.interface import open_model
from test_pages_explore import ROPE, chart_frames, frame_with, open_page

CONTENT = "views/content_positions.py"


def _position(name):
    return open_model(shipped_checkpoints()[name]).position


def _loaded(name):
    model = open_model(shipped_checkpoints()[name])
    model.load()
    return model


def _held_out(n: int):
    """(1, n) the held-out text's first n bytes: what the RoPE page's trained sections read their model on."""
    import torch

    from posviz.training.data import load_corpus

    return torch.as_tensor(np.frombuffer(load_corpus().eval_stream(n), dtype=np.uint8).copy()).long()[None]


def test_fope_section_draws_its_checkpoints_series_and_zeroed_frequencies(tiny_models):
    fope = _position("fope")
    at = open_page(ROPE)
    assert "FoPE: a Fourier series per pair, and the frequencies that never turn zeroed" in [h.value for h in at.header]
    # head size 8: RoPE's 4 frequencies 1, 0.1, 0.01, 0.001; only 1 turns within 32 positions (2 pi / 32 = 0.196)
    assert any("Of RoPE's 4 frequencies per head, 1 turn" in c.value and "the other 3" in c.value for c in at.caption)
    kept = frame_with(at, "pair", "wavelength", "status")
    assert list(kept["status"]) == ["kept", "zeroed (frequency 0)", "zeroed (frequency 0)", "zeroed (frequency 0)"]
    assert kept["wavelength"].iloc[0] == pytest.approx(2 * math.pi)

    def series_of(head):
        data = frame_with(at, "part", "weight", "frequency index")
        coef = {"cos": fope.cos_coef[head].double(), "sin": fope.sin_coef[head].double()}
        for _, r in data.iterrows():
            c = coef[r["part"]]
            d, p = int(r["frequency index"]), int(r["pair"])
            assert r["weight"] == pytest.approx(float(c[d, p] / c[:, p].sum()), abs=1e-9)
        return data

    first = series_of(0)
    at.slider(key="w_fope_head").set_value(2).run()
    assert not at.exception
    series_of(2)
    assert len(first) == 2  # one pair with a series, one kept frequency, cos and sin: the weight is 1 each
    assert first["weight"].tolist() == pytest.approx([1.0, 1.0])


def test_pope_section_draws_the_learned_key_phase_and_the_logit_by_distance(tiny_models):
    at = open_page(ROPE)
    assert "PoPE: the phase from the position, the magnitude from the content" in [h.value for h in at.header]
    phases = frame_with(at, "key phase (degrees)", "feature")
    assert len(phases) == 4 * 8 and phases["key phase (degrees)"].between(-360, 0).all()
    logits = frame_with(at, "distance", "logit")
    opened = _position("pope")  # as the page opened it
    delta = opened.key_phase().detach().double().numpy()
    theta = opened.inv_freq.double().numpy()
    for r in logits[logits["distance"].isin([0, 32])].itertuples():
        want = np.cos(r.distance * theta - delta[r.head]).sum() / math.sqrt(8)
        assert r.logit == pytest.approx(want, abs=1e-9)


def test_canon_section_draws_each_sites_kernel(tiny_models):
    canon = _position("canon")
    at = open_page(ROPE)
    assert "NoPE + Canon: what the short convolutions weigh" in [h.value for h in at.header]
    reach = frame_with(at, "bytes back", "mean |weight|", "site")
    assert len(reach) == 2 * 4 * 4  # layers x sites x taps
    row = reach[(reach["layer"] == 1) & (reach["site"] == "B") & (reach["bytes back"] == 3)].iloc[0]
    assert row["mean |weight|"] == pytest.approx(float(canon.kernel(1, "B")[:, 0].detach().double().abs().mean()), abs=1e-9)
    at.selectbox(key="w_canon_layer").set_value(1).run()
    at.selectbox(key="w_canon_site").set_value("D").run()
    assert not at.exception
    kernel = frame_with(at, "channel", "weight", "bytes back")
    assert kernel["channel"].nunique() == 4 * 32  # the MLP's hidden layer: 4C channels
    want = canon.kernel(1, "D").detach().double()
    for _, r in kernel.sample(20, random_state=0).iterrows():
        assert r["weight"] == pytest.approx(float(want[int(r["channel"]), 3 - int(r["bytes back"])]), abs=1e-9)


def test_paths_section_shows_how_far_each_key_turns_before_the_last_byte_reads_it(tiny_models):
    at = open_page(CONTENT, model="path", n=32)
    assert at.selectbox(key="w_model").value == "path"
    assert "How far each key has turned by the time the last byte reads it" in [h.value for h in at.header]
    turns = frame_with(at, "degrees turned", "length left")
    assert len(turns) == 32
    last = turns[turns["distance"] == 0].iloc[0]
    assert last["degrees turned"] == pytest.approx(0.0, abs=1e-4) and last["length left"] == pytest.approx(1.0, abs=1e-6)
    assert turns["degrees turned"].max() > 0 and (turns["length left"] <= 1 + 1e-9).all()  # a Householder step never lengthens
    # the attention drawn is PaTH's own: rows sum to 1 over the visible keys
    at.slider(key="w_head").set_value(3).run()
    assert not at.exception
    assert "How far each key has turned by the time the last byte reads it" in [h.value for h in at.header]


def test_the_temperature_section_draws_the_query_scale_against_llama4s(tiny_models):
    """NoPE + temperature on the RoPE page: the scale drawn is Llama4TextAttention's formula at the checkpoint's
    floor_scale (tests/test_positions_2026.py holds that formula to transformers' module), with Llama 4's own at the
    same share of its 256K context."""
    method = _position("nope_temperature")
    at = open_page(ROPE)
    assert "NoPE + temperature: each query scaled by its position" in [h.value for h in at.header]
    curve = frame_with(at, "position", "query scale", "curve")
    ours = curve[curve["curve"].str.startswith("this method")]
    floor, scale = method.options.temperature_floor_scale, method.options.temperature_attn_scale
    for _, r in ours.sample(15, random_state=0).iterrows():
        assert r["query scale"] == pytest.approx(math.log1p(math.floor((r["position"] + 1) / floor)) * scale + 1, rel=1e-6)
    assert ours["position"].max() == 16 * 32 - 1 and ours["query scale"].is_monotonic_increasing
    llama = curve[curve["curve"].str.startswith("Llama 4")]
    last = llama["position"].max() * (262_144 // 32)
    assert llama["query scale"].iloc[-1] == pytest.approx(math.log1p(math.floor((last + 1) / 8192)) * 0.1 + 1, rel=1e-6)
    # the caption's gap between the two curves is the drawn data's
    gap = (ours["query scale"].to_numpy() - llama["query scale"].to_numpy())
    assert f"differ by at most {abs(gap).max():.3f} here" in " ".join(c.value for c in at.caption)


def test_the_gate_section_draws_each_heads_gate_and_first_byte_weight(tiny_models):
    """Gated attention on the RoPE page: each head's mean gate and the weight its queries put on the first byte, from
    the checkpoint's own forward on the held-out text."""
    from posviz.explore.rope_2025 import gates_and_sinks

    at = open_page(ROPE)
    assert "Gated attention: does a head that can close still use a sink?" in [h.value for h in at.header]
    drawn = frame_with(at, "layer", "head", "mean gate")
    model, ids = _loaded("gated_attention"), _held_out(32)
    want = gates_and_sinks(model.net, ids)
    assert len(drawn) == 2 * 4 and np.allclose(drawn["mean gate"], want["mean gate"], atol=1e-9)
    assert ((0 < drawn["mean gate"]) & (drawn["mean gate"] < 1)).all()
    # the first-byte weight, read again from the model's own attention at layer 1, head 2
    probs = model.net(ids, attention_layer=1).attention[0, 2]
    row = drawn[(drawn["layer"] == 1) & (drawn["head"] == 2)].iloc[0]
    assert row["weight on the first byte"] == pytest.approx(float(probs[1:, 0].double().mean()), abs=1e-9)


def test_the_mla_section_draws_a_logits_content_and_position_parts(tiny_models):
    """MLA on the RoPE page: each part of a logit (the unrotated content part, the shared rotated position part) by
    distance, from the checkpoint's own projections on the held-out text; the two parts add up to the logit
    (tests/test_positions_2026.py holds that sum to the softmax attention takes)."""
    from posviz.explore.rope_2025 import mla_logit_tables

    at = open_page(ROPE)
    assert "MLA: a logit's content part and its position part" in [h.value for h in at.header]
    drawn = frame_with(at, "distance", "mean logit", "part")
    model, ids = _loaded("mla_rope"), _held_out(32)
    assert sorted(set(drawn["part"])) == ["content (unrotated part)", "position (rotated part)"]
    assert len(drawn) == 2 * 2 * 32  # layers x parts x distances 0..31
    tables = mla_logit_tables(model.net, ids)
    for _, r in drawn.sample(12, random_state=0).iterrows():
        table = tables[int(r["layer"])][r["part"]].double().mean(0)  # over the heads: (T, T)
        assert r["mean logit"] == pytest.approx(float(table.diagonal(-int(r["distance"])).mean()), abs=1e-9)
