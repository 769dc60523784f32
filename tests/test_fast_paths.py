"""The optional shortcuts of attention equal the reference path (every bias through ``logit_bias``).

Parametrised over every registered method and the option variants of test_properties, so a method
that gains a shortcut (``distance_bias``) is covered without touching this file; methods without one
must give the very same numbers on both paths. Learned position parameters are randomised first.
"""
from __future__ import annotations

import pytest
import torch

from conftest import decode_in_chunks

import posviz.models.attention as attention_module
from posviz.models.kv_cache import KVCache
from posviz.models.attention import reference_attention
from posviz.positions import POSITION_METHODS, ModelShape, build_position_method
from test_properties import VARIANT_IDS, VARIANTS, model_for, random_bytes

TOL = dict(rtol=0, atol=1e-4)  # fp32 logits


def _both(fn):
    with torch.no_grad():
        fast = fn()
        with reference_attention():
            ref = fn()
    return fast, ref


@pytest.fixture(params=[None, 96], ids=["one-block", "many-blocks"])
def block_elements(request, monkeypatch):
    """Also walk the queries in many small blocks (the long-text regime) on these short texts."""
    if request.param is not None:
        monkeypatch.setattr(attention_module, "BLOCK_ELEMENTS", request.param)
    return request.param


@pytest.mark.parametrize("method,options", VARIANTS, ids=VARIANT_IDS)
def test_forward_and_attention_map_equal_the_reference_path(method, options, block_elements):
    model = model_for(method, options)
    idx = random_bytes(2, 29)  # learned: 32 rows
    fast, ref = _both(lambda: model(idx).logits)
    torch.testing.assert_close(fast, ref, **TOL)
    fast, ref = _both(lambda: model(idx, attention_layer=1))
    torch.testing.assert_close(fast.logits, ref.logits, **TOL)
    torch.testing.assert_close(fast.attention, ref.attention, rtol=0, atol=1e-5)
    # positions that do not start at 0, and positions that are no run (the shortcut must step aside)
    for positions in (torch.arange(100, 129), torch.arange(29) * 2):
        if model.position.max_positions is not None and int(positions.max()) >= model.position.max_positions:
            continue
        fast, ref = _both(lambda: model(idx, positions=positions).logits)
        torch.testing.assert_close(fast, ref, **TOL)


# A sliding window for every method that can slide: a table that ends at train_length cannot.
CACHE_CASES = [pytest.param(method, options, window, id=f"{vid}-window={window}")
               for (method, options), vid in zip(VARIANTS, VARIANT_IDS) for window in (None, 6)
               if window is None or model_for(method, options).position.max_positions is None]


@pytest.mark.parametrize("method,options,window", CACHE_CASES)
def test_cached_decoding_equals_the_reference_path(method, options, window, block_elements):
    model = model_for(method, options)
    idx = random_bytes(2, 31, seed=3)

    for chunks in ([1] * 31, [5, 1, 12, 13], [31]):
        fast, ref = _both(lambda: decode_in_chunks(model, idx, chunks, window))
        torch.testing.assert_close(fast, ref, **TOL)
    # an attention map returned from a cached step; a recurrent layer's (its implied rows) needs a cache kept for
    # maps, which holds the keys its state forgets, and so the whole text (no window)
    recurrent = model.position.at_layer(0).layer_kind(0) != "attention"

    def new_cache():
        return KVCache(model.config.n_layer, for_maps=True) if recurrent else KVCache(model.config.n_layer, max_size=window)

    cache = new_cache()
    with torch.no_grad():
        model(idx[:, :20], cache=cache)
        fast = model(idx[:, 20:], cache=cache, attention_layer=0).attention
        cache = new_cache()
        with reference_attention():
            model(idx[:, :20], cache=cache)
            ref = model(idx[:, 20:], cache=cache, attention_layer=0).attention
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-5)


SHORTCUTS = [name for name in sorted(POSITION_METHODS) if POSITION_METHODS[name].distance_bias
             is not POSITION_METHODS["nope"].distance_bias]


def test_the_distance_methods_offer_the_shortcut():
    assert {"alibi", "t5", "kerple", "fire"} <= set(SHORTCUTS)


# FIRE's bias is a function of the distance alone only while every query is below its threshold L
BELOW_THRESHOLD = {"fire": {"threshold_init": 1024.0}}


@pytest.mark.parametrize("method", SHORTCUTS)
def test_distance_bias_is_what_logit_bias_puts_at_each_distance(method):
    shape = ModelShape(n_layer=2, n_head=4, head_dim=8, n_embd=32, train_length=32)
    position = build_position_method(method, shape, BELOW_THRESHOLD.get(method))
    with torch.no_grad():
        for p in position.parameters():
            p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(50)
    full = position.logit_bias(1, torch.zeros(1, 4, 50, 8), pos, pos)[0]  # (H, T, T)
    table = position.distance_bias(1, pos, 3, 40)  # (H, 38)
    position.forget()
    rows = torch.stack([full[:, 45, 45 - d] for d in range(3, 41)], dim=-1)
    torch.testing.assert_close(table, rows, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method,shortcut", [*((m, "_attend_by_distance") for m in SHORTCUTS),
                                              ("shaw", "_attend_banded"), ("nezha", "_attend_banded"),
                                              ("transformer_xl", "_attend_relative_shift")])
def test_the_shortcut_runs_where_it_applies(method, shortcut, monkeypatch):
    """So the equality tests above do not pass by falling back to the reference path."""
    calls = []
    real = getattr(attention_module.CausalSelfAttention, shortcut)
    monkeypatch.setattr(attention_module.CausalSelfAttention, shortcut,
                        staticmethod(lambda *a, **k: calls.append(1) or real(*a, **k)))
    model = model_for(method, BELOW_THRESHOLD.get(method))
    with torch.no_grad():
        model(random_bytes(1, 20))
        assert len(calls) == model.config.n_layer
        cache = KVCache(model.config.n_layer, max_size=8)
        model(random_bytes(1, 12), cache=cache)
        model(random_bytes(1, 1), cache=cache)
        assert len(calls) == 3 * model.config.n_layer


def test_transformer_xl_keys_are_not_clipped_so_it_offers_no_band():
    model = model_for("transformer_xl")
    assert model.position.banded_bias(0, torch.zeros(1, 4, 3, 8), torch.arange(3)) is None


@pytest.mark.parametrize("method", ["shaw", "transformer_xl"])
def test_relative_keys_at_16x_a_long_text_equal_the_reference_path(method):
    model = model_for(method, train_length=256)
    idx = random_bytes(1, 4096)
    fast, ref = _both(lambda: model(idx).logits)
    torch.testing.assert_close(fast, ref, **TOL)


def test_alibi_at_16x_a_long_text_equals_the_reference_path():
    """The long-text regime: many blocks of 4,096 queries, fp32 logits within 1e-4."""
    model = model_for("alibi", train_length=256)
    idx = random_bytes(1, 4096)
    fast, ref = _both(lambda: model(idx).logits)
    torch.testing.assert_close(fast, ref, **TOL)


@pytest.mark.parametrize("method", ["alibi", "t5", "shaw", "rope"])
@pytest.mark.parametrize("relabel", ["run", "gaps"])
def test_a_cache_whose_positions_are_relabelled_from_outside_equals_the_reference_path(method, relabel):
    """The KV-cache lab relabels ``cache.positions``; the cache must notice before attention trusts it."""
    model = model_for(method)
    idx = random_bytes(1, 24, seed=9)

    def run():
        cache, out = KVCache(model.config.n_layer, max_size=8), []
        model(idx[:, :12], cache=cache)
        for t in range(12, 20):
            held = len(cache)
            cache.positions = torch.arange(held) + 2 if relabel == "run" else torch.arange(held) * 2
            p = int(cache.positions[-1]) + (1 if relabel == "run" else 2)
            out.append(model(idx[:, t:t + 1], positions=torch.tensor([p]), cache=cache).logits)
        return torch.cat(out, dim=1)

    fast, ref = _both(run)
    torch.testing.assert_close(fast, ref, **TOL)


@pytest.mark.parametrize("method", ["alibi", "kerple", "nope", "rope"])
def test_a_step_whose_position_jumps_equals_the_reference_path(method):
    """Keys that were a run stop being one when a step skips positions: attention must see that at once."""
    model = model_for(method)
    idx = random_bytes(1, 20, seed=4)

    def run():
        cache, out = KVCache(model.config.n_layer), []
        model(idx[:, :10], cache=cache)
        for t, p in zip(range(10, 14), (10, 15, 16, 30)):
            out.append(model(idx[:, t:t + 1], positions=torch.tensor([p]), cache=cache).logits)
        return torch.cat(out, dim=1)

    fast, ref = _both(run)
    torch.testing.assert_close(fast, ref, **TOL)


@pytest.mark.parametrize("rot", [32, 16])
def test_rope_four_op_rotation_is_apply_rotary_exactly(rot):
    from posviz.positions.rope import RopeOptions, _rotate, apply_rotary, rope_cos_sin
    from posviz.positions.rope_scaling import ROPE_SCALINGS

    x = torch.randn(2, 4, 50, 32, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(torch.arange(1000, 1050), ROPE_SCALINGS["none"](rot, RopeOptions(), 50)[0])
    signed = torch.cat((-sin[..., :rot // 2], sin[..., rot // 2:]), dim=-1)
    assert torch.equal(_rotate(x, cos, signed), apply_rotary(x, cos, sin))


@pytest.mark.parametrize("method", [*SHORTCUTS, "transformer_xl"])
def test_tables_kept_across_passes_follow_parameter_changes(method):
    """Per-distance tables are kept from one decoding step to the next; changing a parameter in place
    (an optimiser step, load_state_dict) must not leave a stale table behind."""
    model = model_for(method)
    idx = random_bytes(1, 16)
    with torch.no_grad():
        model(idx)
        for p in [*model.position.parameters(), *model.position.buffers()]:
            p.mul_(1.5).add_(0.1)
        fast = model(idx).logits
        with reference_attention():
            ref = model(idx).logits
    torch.testing.assert_close(fast, ref, **TOL)


@pytest.mark.parametrize("method", SHORTCUTS)
def test_a_decoding_loop_computes_each_distance_table_once_per_step_of_distances(method, monkeypatch):
    """A cached step asks for one more distance each time: the table is kept for a rounded-up range
    (``DISTANCE_STEP``) and read as a view, with the reference path's numbers across each boundary."""
    from posviz.positions.base import PositionMethod

    monkeypatch.setattr(PositionMethod, "DISTANCE_STEP", 8)
    model = model_for(method, BELOW_THRESHOLD.get(method))
    idx = random_bytes(1, 30, seed=4)
    computed = []
    real = PositionMethod._kept

    def counting(self, key, compute, params):
        return real(self, key, lambda: computed.append(key) or compute(), params)

    monkeypatch.setattr(PositionMethod, "_kept", counting)
    fast, ref = _both(lambda: decode_in_chunks(model, idx, [1] * 30))
    torch.testing.assert_close(fast, ref, **TOL)
    distances = [key for key in computed if key[0] == "distance"]  # FIRE also keeps its threshold
    tables = set(distances)
    assert len(distances) == len(tables), "a table was computed twice"
    per_table = len(tables) // len({key[:-2] for key in tables})  # distinct ranges of one layer's table
    assert per_table == 30 // 8 + 1  # distances 0..29: tops 7, 15, 23, 31
