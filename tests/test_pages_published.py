"""AppTest of the live labs with published models in the picker: $POSVIZ_MODELS names two tiny saved
transformers models (GPT-2, learned table of 64 tokens; GPT-NeoX, RoPE, 64 tokens) next to the tiny
shipped checkpoints (32 bytes). A visitor picks them, moves their widgets, and the numbers shown are the
labs' own (posviz.labs.extrapolation, posviz.labs.kv_cache, ...) on the models as ``open_model`` opens them.
"""
from __future__ import annotations

import numpy as np
import pytest
from hf_tiny import save_oversized_config, save_pickle_only, save_unsupported
from test_pages_labs import chart_frames, metrics, page, run, texts

from posviz.labs import attention_maps, context_extension, extrapolation, kv_cache, inputs as lab_inputs
from posviz.models.checkpoint_files import shipped_checkpoints
from posviz.training.data import load_corpus
from posviz.models.interface import open_model


@pytest.fixture()
def published(tiny_models, hf_family_dir, monkeypatch) -> dict:
    """The tiny checkpoints, and gpt2 and neox listed by the deployer ($POSVIZ_MODELS), offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("POSVIZ_ALLOW_ANY_MODEL", raising=False)
    folders = {name: hf_family_dir[name] for name in ("gpt2", "neox")}
    monkeypatch.setenv("POSVIZ_MODELS", ",".join(str(f) for f in folders.values()))
    return folders


@pytest.fixture(scope="module")
def doc() -> bytes:
    """The first held-out document, as the pages' text picker gives it by default."""
    return lab_inputs.prepare_text(load_corpus().eval_documents[0]).as_bytes()


def bpb(model, text: bytes, length: int) -> str:
    return f"{extrapolation.score_at_length(model, model.encode(text), length).bpb:.3f}"


def test_extrapolation_published_models_in_multiples_of_their_context(published, doc):
    gpt2, rope = open_model(published["gpt2"]), open_model(shipped_checkpoints()["rope"])
    at = run(page("extrapolation", models="rope,gpt2", M="1"))
    options = at.multiselect(key="w_models").options
    assert "gpt2 — learned, 64 tokens" in options and "neox — RoPE, 64 tokens" in options
    # bytes next to tokens: each model at 1x its own context (rope 32 bytes, gpt2 64 tokens), in bits per byte
    assert metrics(at) == {"rope": bpb(rope, doc, 32), "gpt2": bpb(gpt2, doc, 64)}
    live = [f for f in chart_frames(at) if {"multiple", "bits/byte"} <= set(f.columns) and "live" in " ".join(f["source"])]
    assert set(live[0]["model"]) == {"rope", "gpt2"} and set(live[0]["multiple"]) == {1.0}
    assert dict(zip(live[0]["model"], live[0]["length"])) == {"rope": 32, "gpt2": 64}

    # the attention of the published model, any layer and head
    at.selectbox(key="w_inspect").set_value("gpt2")
    at.selectbox(key="w_layer").set_value(0)
    at.selectbox(key="w_head").set_value("1")
    run(at)
    view = attention_maps.attention_view(gpt2, gpt2.encode(doc), 64, layer=0)
    assert f"Head 1: mean attention distance {view.distance[1]:,.1f} tokens" in texts(at.caption)

    # past its 64-row table gpt2 cannot run, and says why; the checkpoint goes on at 2 x 32 bytes
    at.select_slider(key="w_M").set_value("2")
    run(at)
    assert metrics(at) == {"rope": bpb(rope, doc, 64), "gpt2": "—"}
    assert "gpt2 cannot run 128 positions: its learned table holds 64" in texts(at.error)

    # sliding windows (YaRN's evaluation): each model's stride is its own window's fraction
    at.select_slider(key="w_M").set_value("1")
    at.radio(key="w_stride").set_value("1/2")
    run(at)
    strided = extrapolation.score_with_stride(gpt2, gpt2.encode(doc), 64, 32)
    assert metrics(at)["gpt2"] == f"{strided.bpb:.3f}"
    assert metrics(at)["rope"] == f"{extrapolation.score_with_stride(rope, rope.encode(doc), 32, 16).bpb:.3f}"

    # two published models of one unit and context share a length in tokens
    at = run(page("extrapolation", models="gpt2,neox", L="128"))
    assert metrics(at) == {"gpt2": "—", "neox": bpb(open_model(published["neox"]), doc, 128)}
    assert "cannot run 128 positions" in texts(at.error)


def test_kv_cache_runs_published_models_in_tokens(published, doc):
    at = run(page("kv_cache", models="gpt2,neox", W="16", n="40", dw="4", check="neox", cl="24"))
    table = at.main.dataframe[1].value
    for name in ("gpt2", "neox"):
        model = open_model(published[name])
        for strategy in kv_cache.STRATEGIES:
            expected = kv_cache.sliding_score(model, model.encode(doc), 16, strategy, 40).bpb_full
            assert table.loc[name, kv_cache.STRATEGY_TITLES[strategy]] == f"{expected:.3f}", (name, strategy)
    shown = metrics(at)
    assert float(shown["max |cached − full| logit"]) < 1e-4 and shown["cached, per token"].endswith(" ms")

    # a window past gpt2's table: every strategy stops there, and the page says where
    at = run(page("kv_cache", models="gpt2", W="128", n="130", check="alibi", cl="16"))
    assert (at.main.dataframe[1].value.loc["gpt2"] == "cannot run").all()
    assert "Stopped at token 64: gpt2 cannot run 65 positions" in texts(at.warning)


def test_context_extension_scales_a_published_rope_model(published, doc):
    neox = open_model(published["neox"])
    at = run(page("context_extension", base="neox", factor="2.0", scalings="none,linear", refs="alibi,gpt2"))
    assert "neox — RoPE, 64 tokens" in at.selectbox(key="w_base").options
    assert not any("gpt2" in o for o in at.selectbox(key="w_base").options)  # learned: no scalings to apply
    ids = neox.encode(doc)
    longest = context_extension.extension_lengths(64, neox.length_cap, ids.numel())[-1]  # 16 x 64 tokens
    rows = context_extension.rope_scaling_curves(neox, 2.0, ids, [longest], ["none", "linear"])
    shown = metrics(at)
    for r in rows:
        assert shown[r["scaling"]] == f"{r['bpb']:.3f}"
    # the scaling is the model's own rope_parameters through with_position_options
    linear = neox.with_position_options({"scaling": "linear", "factor": 2.0})
    assert linear.rope_parameters["rope_type"] == "linear" and shown["linear"] == bpb(linear, doc, longest)
    # the checkpoint compared at the same multiple of its own context (16 x 32 bytes)
    assert shown["alibi"] == bpb(open_model(shipped_checkpoints()["alibi"]), doc, 512)
    live = [f for f in chart_frames(at) if {"curve", "multiple", "bpb"} <= set(f.columns) and len(f)][-1]
    assert sorted(live[live["curve"] == "gpt2"]["multiple"]) == [1.0]  # learned: its 64-token table, no further
    assert sorted(live[live["curve"] == "alibi"]["multiple"]) == [1.0, 2.0, 4.0, 8.0, 16.0]

    at.select_slider(key="w_factor").set_value(4.0)
    run(at)
    linear4 = context_extension.rope_scaling_curves(neox, 4.0, ids, [longest], ["linear"])[0]["bpb"]
    assert metrics(at)["linear"] == f"{linear4:.3f}"


def test_compare_a_published_model_against_a_checkpoint(published, doc):
    gpt2, rope = open_model(published["gpt2"]), open_model(shipped_checkpoints()["rope"])
    at = run(page("compare", a="rope", b="gpt2", M="1", layer="1", head="2"))
    shown = metrics(at)
    assert shown["rope: bits/byte"] == bpb(rope, doc, 32) and shown["gpt2: bits/byte"] == bpb(gpt2, doc, 64)
    a = extrapolation.score_at_length(rope, rope.encode(doc), 32).bpb
    b = extrapolation.score_at_length(gpt2, gpt2.encode(doc), 64).bpb
    assert shown["gpt2 − rope"] == f"{b - a:+.3f}"
    loss = next(f for f in chart_frames(at) if {"model", "multiple", "bits"} <= set(f.columns))
    assert loss.groupby("model")["position"].max().to_dict() == {"gpt2": 63, "rope": 31}  # each in its own ids
    maps = [f for f in chart_frames(at) if "value" in f.columns]
    assert len(maps) == 2  # each over its own ids; no difference map
    expected = attention_maps.display_attention(attention_maps.attention_probs(gpt2, gpt2.encode(doc), 64, 1)[2], True)
    got = maps[1].pivot(index="row", columns="col", values="value").to_numpy()
    assert np.allclose(got, expected, atol=1e-5, equal_nan=True)

    at.select_slider(key="w_M").set_value("2")
    run(at)
    assert "gpt2 cannot run 128 positions" in texts(at.error)
    assert metrics(at) == {"rope: bits/byte": bpb(rope, doc, 64)}

    # two published models reading the text as the same tokens line up position by position
    at = run(page("compare", a="neox", b="gpt2", L="64"))
    neox = open_model(published["neox"])
    n = extrapolation.score_at_length(neox, neox.encode(doc), 64).bpb
    assert metrics(at)["gpt2 − neox"] == f"{b - n:+.3f}"
    assert len([f for f in chart_frames(at) if "value" in f.columns]) == 3  # A, B and B − A


def test_bad_published_entries_get_an_error_box_and_the_pages_go_on(tiny_models, hf_family_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bad = [save_unsupported(tmp_path / "mamba"), "nonexistent/model", save_oversized_config(tmp_path / "llama70b")]
    pickled = save_pickle_only(tmp_path / "pickled")
    monkeypatch.setenv("POSVIZ_MODELS", ",".join(map(str, [*bad, pickled, hf_family_dir["gpt2"]])))
    runs = {"extrapolation": dict(models="rope"), "kv_cache": dict(models="alibi", W="16", n="20", cl="16"),
            "context_extension": dict(scalings="none", refs="alibi"), "compare": dict(a="rope", b="alibi", L="32")}
    for name, params in runs.items():
        at = run(page(name, **params))
        errors = texts(at.error)
        assert "is a 'mamba' model, whose position method posviz does not read" in errors, name
        assert "nonexistent/model" not in errors, name  # not in the local cache: listed, fetched only when picked
        assert "over this server's cap" in errors and "POSVIZ_MAX_PARAMS" in errors, name
        assert metrics(at), name  # the shipped checkpoints are still scored
        assert not any("gpt2" in m for m in metrics(at)), name  # published models are never picked by default
    # a model listed fine but whose weights are pickle-only: picking it says so, the rest goes on
    at = run(page("extrapolation", models="rope,pickled"))
    assert "posviz loads safetensors only" in texts(at.error) and set(metrics(at)) == {"rope"}
    # a hub id picked offline: the hub cannot be reached, said in words; the rest goes on
    at = run(page("extrapolation", models="rope,nonexistent/model"))
    assert "Cannot reach the Hugging Face hub to fetch nonexistent/model" in texts(at.error)
    assert set(metrics(at)) == {"rope"}


def test_the_proposed_models_are_listed_with_their_download_size_and_nothing_is_fetched(tiny_models, monkeypatch,
                                                                                         tmp_path):
    """The Docker image's default (POSVIZ_MODELS=proposed), offline with an empty hub cache: every proposed
    model is in the picker with what picking it downloads; nothing is fetched until one is picked, and a
    pick says the hub cannot be reached while the checkpoints are still scored."""
    import views._models as listing
    from posviz.models.hf.settings import PROPOSED_MODELS

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("POSVIZ_MODELS", "proposed")
    opened = []
    real_open = listing._open
    monkeypatch.setattr(listing, "_open", lambda read, ref: opened.append(ref) or real_open(read, ref))
    at = run(page("extrapolation", models="rope"))
    options = at.multiselect(key="w_models").options
    for ref, size in PROPOSED_MODELS.items():
        assert f"{ref} — published, {size} download when picked" in options
    assert opened == [] and not at.error and set(metrics(at)) == {"rope"}
    at = run(page("extrapolation", models="rope,openai-community/gpt2"))
    assert opened == ["openai-community/gpt2"]
    assert "Cannot reach the Hugging Face hub to fetch openai-community/gpt2" in texts(at.error)
    assert set(metrics(at)) == {"rope"}


def test_a_visitor_adds_a_model_where_any_model_is_allowed(tiny_models, hf_family_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("POSVIZ_MODELS", raising=False)
    at = run(page("extrapolation", models="rope"))
    assert not at.text_input  # not allowed: no input
    monkeypatch.setenv("POSVIZ_ALLOW_ANY_MODEL", "1")
    at = run(page("extrapolation", models="rope"))
    at.text_input(key="w_add_model").input(str(hf_family_dir["neox"]))
    run(at)
    assert "neox — RoPE, 64 tokens" in at.multiselect(key="w_models").options
    assert set(metrics(at)) == {"rope"}  # listed, not picked
    at.multiselect(key="w_models").set_value(["rope", "neox"])
    run(at)
    assert set(metrics(at)) == {"rope", "neox"}


def test_a_hub_model_not_in_the_cache_is_listed_by_its_id_and_fetched_only_when_picked(tiny_models, hf_family_dir,
                                                                                     monkeypatch, doc):
    """Online, a hub id whose config is not cached yet costs nothing until a visitor picks it: it is listed
    by its id alone; picking it fetches it (here: the tiny gpt2 folder stands in for the hub) and loads it."""
    import views._models as listing

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("POSVIZ_MODELS", "someone/tiny-gpt2")
    monkeypatch.setattr(listing, "_config_cached", lambda ref: False)
    fetched = []
    monkeypatch.setattr(listing, "_open", lambda read, ref: fetched.append(ref) or read(str(hf_family_dir["gpt2"])))
    at = run(page("compare", a="rope", b="alibi", L="32"))
    assert "someone/tiny-gpt2 — published (fetched when picked)" in at.selectbox(key="w_b").options
    assert fetched == []
    at.selectbox(key="w_b").set_value("someone/tiny-gpt2")
    run(at)
    assert fetched == ["someone/tiny-gpt2"]
    assert "cannot run 128 positions" in texts(at.error)  # opens at 2 x each context: past gpt2's 64 rows
    at.select_slider(key="w_M").set_value("1")
    run(at)
    assert metrics(at)["someone/tiny-gpt2: bits/byte"] == bpb(open_model(hf_family_dir["gpt2"]), doc, 64)
