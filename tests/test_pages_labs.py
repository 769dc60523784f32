"""AppTest of the live-lab pages: move the widgets, check the numbers shown against the page's own
module (posviz.labs.extrapolation, posviz.labs.kv_cache, ...) and the shared lab modules.

Pages are run directly from their files (absolute paths) against the tiny checkpoints of the
``tiny_models`` fixture; one test runs the real shipped checkpoints in models/.
"""
from __future__ import annotations

import json
import re

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from conftest import tiny_lab
from default_views import as_shown
from streamlit.testing.v1 import AppTest

from posviz.display import display_name, ids_by_name
from posviz.models.interface import open_model
from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.labs import scoreboard
from posviz.labs import attention_maps, compare, context_extension, extrapolation, inputs as lab_inputs, kv_cache, probes
from posviz.models.checkpoint_files import read_metrics, shipped_checkpoints
from posviz.training.data import load_corpus
from posviz.positions import POSITION_METHODS
from posviz.limits import MAX_TEXT_BYTES, max_eval_length

ROOT = Path(__file__).resolve().parent.parent


def page(name: str, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "views" / f"{name}.py"), default_timeout=60)
    for key, value in params.items():
        at.query_params[key] = value
    return at


def run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


# Pages show display names (posviz.display); these tests look their numbers up by id. ID_OF: a name -> its id.
ID_OF = ids_by_name()
NAME_COLUMNS = ("model", "checkpoint", "curve", "scaling", "of", "method", "remap")
_NAMES = re.compile("|".join(rf"(?<![\w-]){re.escape(n)}(?![\w-])" for n in sorted(ID_OF, key=len, reverse=True)))


def as_ids(text: str) -> str:
    """A label with every display name in it as its id ("RoPE − NoPE" -> "rope − nope")."""
    return ID_OF.get(text) or _NAMES.sub(lambda m: ID_OF[m.group(0)], text)


def ided(frame: pd.DataFrame) -> pd.DataFrame:
    """A shown table or chart dataset with its names (index and naming columns) back as ids."""
    frame = frame.assign(**{c: frame[c].map(lambda v: ID_OF.get(v, v)) for c in NAME_COLUMNS if c in frame.columns})
    if not pd.api.types.is_numeric_dtype(frame.index):  # names (object or pandas' str dtype)
        frame.index = frame.index.map(lambda v: ID_OF.get(v, v))
    return frame


def chart_frames(at: AppTest) -> list[pd.DataFrame]:
    """Every dataset of every chart on the page, as DataFrames (names back as ids: ``ided``)."""
    return [ided(pa.ipc.open_stream(ds.data.data).read_pandas()) for chart in at.get("vega_lite_chart")
            for ds in chart.proto.datasets]


def metrics(at: AppTest) -> dict[str, str]:
    """{label: value} of every metric, each label as shown (a model's name in it is quoted: "p\\-RoPE"), its
    display names back as ids."""
    return {as_ids(as_shown(m.label)): m.value for m in at.metric}


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


@pytest.fixture(scope="module")
def doc_ids():
    """The first held-out document, as the pages' text picker gives it by default."""
    return lab_inputs.prepare_text(load_corpus().eval_documents[0]).ids


# ------------------------------------------------------------------------------------------------
# Extrapolation lab
# ------------------------------------------------------------------------------------------------
def test_extrapolation_numbers_match_labs_and_learned_stops_alone(tiny_models, doc_ids):
    at = run(page("extrapolation", L="128"))
    folders = shipped_checkpoints()
    assert list(metrics(at)) == list(extrapolation.FIRST_VIEW)  # one of each kind at first, in the story's order
    at.multiselect(key="w_models").set_value(list(folders))  # then every checkpoint
    run(at)
    shown = metrics(at)
    assert set(folders) <= set(shown)
    for name, folder in folders.items():
        if name == "learned":
            assert shown[name] == "—"
        else:
            assert shown[name] == f"{extrapolation.score_at_length(open_model(folder), doc_ids, 128).bpb:.3f}", name
    errors = texts(at.error)
    assert "learned" in errors and "32 rows" in errors and "position 127" in errors
    assert at.query_params["L"] == "128"
    assert len(at.image) == 4  # all heads of the inspected model, as pooled images
    assert at.get("html")  # the text coloured by loss

    at.select_slider(key="w_L").set_value(32)
    run(at)
    shown = metrics(at)
    assert shown["learned"] == f"{extrapolation.score_at_length(open_model(folders['learned']), doc_ids, 32).bpb:.3f}"
    assert not at.error
    assert at.query_params["L"] == "32"

    at.selectbox(key="w_head").set_value("1")
    at.selectbox(key="w_inspect").set_value("alibi")
    run(at)
    assert len(at.image) == 0  # one head at 32 bytes: an interactive heatmap instead of an image
    assert "Head 1: mean attention distance" in texts(at.caption)
    view = attention_maps.attention_view(open_model(folders["alibi"]), doc_ids, 32, layer=1)
    assert f"{view.distance[1]:,.1f} bytes" in texts(at.caption)


def test_extrapolation_at_the_cap_scores_the_inspected_model_from_its_map_pass(tiny_models, doc_ids):
    """At 16 x train_length one window fills the cap: the inspected model's number comes from the
    attention map's forward pass, and must be the number the scorer gives; the others are scored."""
    cap = tiny_lab("rope").length_cap
    calls = []
    with pytest.MonkeyPatch.context() as spy:  # its own patch: the fixture's $POSVIZ_CHECKPOINTS must stay
        for module, fn in ((extrapolation, "score_at_length"), (extrapolation, "inspect_at_length"),
                           (attention_maps, "attention_view")):
            real = getattr(module, fn)
            spy.setattr(module, fn, lambda model, *a, _fn=fn, _real=real, **k: calls.append((_fn, model.method))
                        or _real(model, *a, **k))
        at = run(page("extrapolation", L=str(cap), inspect="rope", layer="0", models="rope,alibi"))
    assert not at.exception and at.query_params["inspect"] == "rope"
    assert calls == [("inspect_at_length", "rope"), ("score_at_length", "alibi")]  # one pass for rope, no second map
    folders = shipped_checkpoints()
    for name in ("rope", "alibi"):
        expected = extrapolation.score_at_length(open_model(folders[name]), doc_ids, cap).bpb
        assert metrics(at)[name] == f"{expected:.3f}", name
    view = attention_maps.attention_view(open_model(folders["rope"]), doc_ids, cap, layer=0)
    assert f"distance {view.distance[0]:,.1f} B" in texts(at.caption)


def test_extrapolation_junk_url_params_fall_back_with_a_notice(tiny_models):
    at = run(page("extrapolation", L="abc", models="nope,bogus", layer="9", head="x", doc="999", scale="<b>"))
    notices = texts(at.warning)
    for key in ("L=", "models=", "layer=", "head=", "doc=", "scale="):
        assert f"Ignored URL parameter {key}" in notices, key
    assert metrics(at)["nope"] != "—" and "sinusoidal" not in metrics(at)  # the good part of models= is kept
    assert at.select_slider(key="w_L").value == 32
    # the notice says what is kept, by the name the picker shows, not the default the page did not use
    models_notice = next(w for w in texts(at.warning).splitlines() if "models=" in w)
    assert "kept NoPE (dropped 1 value naming no choice here)" in models_notice and "default" not in models_notice
    assert at.multiselect(key="w_models").value == ["nope"]
    junk = run(page("extrapolation", models="<script>,zzz"))  # nothing usable: the default, in display names
    notice = next(w for w in texts(junk.warning).splitlines() if "models=" in w)
    assert "using the default `" in notice and "'nope'" not in notice and "NoPE" in notice


def test_an_empty_selection_in_a_pages_own_link_raises_no_notice(tiny_models):
    """The page's own link for a cleared multiselect ("refs=", as sync_url writes it after Context extension's
    "Compare with" is emptied) is no junk: it reopens the empty selection without an "Ignored URL parameter" notice."""
    at = run(page("context_extension", refs=""))
    assert "Ignored URL parameter" not in texts(at.warning)
    assert at.multiselect(key="w_refs").value == []
    at.multiselect(key="w_refs").set_value([at.multiselect(key="w_refs").options[0]])
    run(at)
    at.multiselect(key="w_refs").set_value([])
    run(at)
    again = run(page("context_extension", **{k: at.query_params[k] for k in at.query_params}))
    assert "Ignored URL parameter" not in texts(again.warning)


def test_extrapolation_pasted_text(tiny_models):
    at = run(page("extrapolation", src="paste"))
    assert "The text is empty" in texts(at.error)
    assert not at.metric
    snippet = "def add(a, b):\n    return a + b\n\n" * 8
    at.text_area(key="w_paste").input(snippet)
    run(at)
    shown = metrics(at)
    ids = lab_inputs.prepare_text(snippet).ids
    assert shown["rope"] == f"{extrapolation.score_at_length(open_model(shipped_checkpoints()['rope']), ids, 32).bpb:.3f}"
    at.text_area(key="w_paste").input("x" * (MAX_TEXT_BYTES + 5) + "\x01")
    run(at)
    assert f"only the first {MAX_TEXT_BYTES:,} are used" in texts(at.info)
    assert metrics(at)["nope"] != "—"


# ------------------------------------------------------------------------------------------------
# KV cache & sliding window
# ------------------------------------------------------------------------------------------------
def test_kv_cache_strategies_and_t5_check(tiny_models, doc_ids):
    at = run(page("kv_cache", models="learned,alibi,rope", W="16", n="60", dw="4", cl="40", check="t5"))
    folders = shipped_checkpoints()
    table = ided(at.main.dataframe[1].value)  # bits per byte after the window fills, as shown (text)
    assert list(table.columns) == [kv_cache.STRATEGY_TITLES[s] for s in kv_cache.STRATEGIES]
    assert table.loc["learned", kv_cache.STRATEGY_TITLES["cached_window"]] == "cannot run"

    for name in ("alibi", "rope"):
        for strategy in kv_cache.STRATEGIES:
            expected = kv_cache.sliding_score(open_model(folders[name]), doc_ids, 16, strategy, 60).bpb_full
            assert table.loc[name, kv_cache.STRATEGY_TITLES[strategy]] == f"{expected:.3f}", (name, strategy)
    assert "Stopped at byte 32" in texts(at.warning)
    # ALiBi's bias is added at attention time: the shifted cache gives the cached-window result
    alibi = open_model(folders["alibi"])
    assert np.allclose(kv_cache.sliding_score(alibi, doc_ids, 16, "shifted_cache", 60).id_bits,
                       kv_cache.sliding_score(alibi, doc_ids, 16, "cached_window", 60).id_bits, atol=1e-5)
    shown = metrics(at)
    assert float(shown["max |cached − full| logit"]) < 1e-4
    assert shown["cached, per byte"].endswith(" ms")
    check = kv_cache.cache_check(open_model(folders["t5"]), doc_ids, 40)
    assert check["max_abs_diff"] < 1e-4

    # each head's share of attention on the first byte, as first_id_share computes it, for every chosen model
    shares = next(f for f in chart_frames(at) if "share %" in f.columns)
    assert "learned has 32 positions" in texts(at.warning)  # its table ends before the queries read
    for name in ("alibi", "rope"):
        expected = kv_cache.first_id_share(open_model(folders[name]), doc_ids)
        drawn = shares[shares["model"] == name].sort_values(["layer", "head"])
        assert np.allclose(drawn["share %"], [100 * r["share"] for r in expected], atol=1e-6), name
    assert "would put" in texts(at.caption)

    at2 = run(page("kv_cache", W="7", n="40", models="nope", cl="16"))
    assert "Ignored URL parameter W=" in texts(at2.warning)
    assert at2.select_slider(key="w_W").value == 32


def test_kv_cache_draws_the_sinks_of_a_hybrids_attention_layers_only_and_says_why(tiny_models, doc_ids):
    """A recurrent layer has no softmax weight to pour onto the first byte: the sink chart draws the hybrid's
    attention layer alone (first_id_share's rows), and a caption names the layers left out."""
    folders = shipped_checkpoints()
    at = run(page("kv_cache", models="hybrid_deltanet,nope", W="16", n="60", cl="16"))
    hybrid = open_model(folders["hybrid_deltanet"])
    attends = [layer for layer in range(hybrid.n_layer) if hybrid.layer_kind(layer) == "attention"]
    assert 0 < len(attends) < hybrid.n_layer
    shares = next(f for f in chart_frames(at) if "share %" in f.columns)
    drawn = shares[shares["model"] == "hybrid_deltanet"].sort_values(["layer", "head"])
    assert sorted(set(drawn["layer"])) == attends
    expected = kv_cache.first_id_share(hybrid, doc_ids)
    assert np.allclose(drawn["share %"], [100 * r["share"] for r in expected], atol=1e-6)
    assert sorted(set(shares[shares["model"] == "nope"]["layer"])) == list(range(hybrid.n_layer))
    recurrent = [str(layer) for layer in range(hybrid.n_layer) if layer not in attends]
    said = (f"layers {', '.join(recurrent)} are" if len(recurrent) > 1 else f"layer {recurrent[0]} is")
    assert f"{said} Gated DeltaNet (recurrent), with no softmax weight" in texts(at.caption)


def test_kv_cache_tables_are_whole_for_the_first_visitor_and_the_next(tiny_models):
    """The first run fills the tables as it scores (cells read "…" until then); the next finds every
    result stored and draws the same finished tables at once."""
    params = dict(models="alibi,rope", W="16", n="40", dw="4", cl="16")
    first = run(page("kv_cache", **params))
    again = run(page("kv_cache", **params))
    for at in (first, again):
        for table in at.main.dataframe[1:3]:
            assert not (table.value == "…").any().any(), table.value
    pd.testing.assert_frame_equal(first.main.dataframe[1].value, again.main.dataframe[1].value)
    assert f"the mean of {kv_cache.REENCODE_TIMED_STEPS} of those bytes" in texts(first.caption)


# ------------------------------------------------------------------------------------------------
# Context extension
# ------------------------------------------------------------------------------------------------
def test_context_extension_live_numbers(tiny_models, doc_ids):
    at = run(page("context_extension", factor="2.0", scalings="none,linear", refs="alibi"))
    shown = metrics(at)
    folders = shipped_checkpoints()
    longest = context_extension.extension_lengths(32, max_eval_length(32), len(doc_ids))[-1]
    rows = context_extension.rope_scaling_curves(open_model(folders["rope"]), 2.0, doc_ids, [longest], ["none", "linear"])
    for r in rows:
        assert shown[r["scaling"]] == f"{r['bpb']:.3f}"
    assert shown["alibi"] == f"{extrapolation.score_at_length(open_model(folders['alibi']), doc_ids, longest).bpb:.3f}"
    assert set(shown) == {"none", "linear", "alibi"}
    # each legend names only what its chart draws (not every checkpoint in models/)
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        drawn = {v for ds in chart.proto.datasets for col in ("curve", "scaling")
                 for v in pa.ipc.open_stream(ds.data.data).read_pandas().get(col, [])}
        for layer in spec.get("layer", [spec]):
            domain = layer.get("encoding", {}).get("color", {}).get("scale", {}).get("domain")
            if domain and drawn:
                assert set(domain) <= drawn, (domain, drawn)

    at.select_slider(key="w_factor").set_value(4.0)
    run(at)
    linear4 = context_extension.rope_scaling_curves(open_model(folders["rope"]), 4.0, doc_ids, [longest], ["linear"])[0]["bpb"]
    assert metrics(at)["linear"] == f"{linear4:.3f}"
    assert at.query_params["factor"] == "4.0"

    junk = run(page("context_extension", factor="abc", scalings="warp"))
    assert "Ignored URL parameter factor=" in texts(junk.warning)
    assert "Ignored URL parameter scalings=" in texts(junk.warning)

    typed = run(page("context_extension", factor="8", scalings="none"))  # a link typed by hand: 8, not 8.0
    assert "Ignored URL parameter factor=" not in texts(typed.warning)
    assert typed.select_slider(key="w_factor").value == 8.0


def test_context_extension_runs_the_remaps_from_a_link(tiny_models, doc_ids):
    """A link with remaps beside a scaling: each live number is the remap covering the factor, the parameters it ran
    with are stated, and the wavelength chart keeps to the scalings (a remap turns no pair faster or slower)."""
    at = run(page("context_extension", factor="4.0", scalings="yarn,self_extend,string"))
    shown = metrics(at)
    rope = open_model(shipped_checkpoints()["rope"])
    longest = context_extension.extension_lengths(32, max_eval_length(32), len(doc_ids))[-1]
    rows = context_extension.rope_scaling_curves(rope, 4.0, doc_ids, [longest], ["yarn", "self_extend", "string"])
    assert {r["scaling"]: f"{r['bpb']:.3f}" for r in rows} == shown
    settings = ided(next(d.value for d in at.dataframe if "remap" in d.value.columns))
    assert settings.to_dict("records") == [{"remap": "self_extend", "parameters": "group=6, window=8"},
                                           {"remap": "string", "parameters": "shift=98, local_window=2, attention_factor=1.07"}]
    drawn = {v for chart in at.get("vega_lite_chart") for ds in chart.proto.datasets
             if {"wavelength", "scaling"} <= set((frame := pa.ipc.open_stream(ds.data.data).read_pandas()).columns)
             for v in frame["scaling"]}
    assert drawn == {display_name("yarn")}


def test_context_extension_shows_a_finetuned_rope_before_and_after(tiny_models_dir, tmp_path, monkeypatch, corpus):
    import shutil

    from posviz.models.checkpoint_files import load_checkpoint, save_checkpoint, write_metrics
    from posviz.labs import intervals
    from posviz.training.evaluate import evaluate_checkpoint

    models = tmp_path / "models"
    shutil.copytree(tiny_models_dir, models)
    options = {"scaling": "linear", "factor": 4.0, "original_length": 32}
    tuned = load_checkpoint(models / "rope", options)  # stands in for a fine-tuned model: the code path is the same
    tuned.config.train_length = 128
    with torch.no_grad():  # weights that differ from the base's, as fine-tuning leaves them
        gen = torch.Generator().manual_seed(3)
        for p in tuned.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    extra = {"finetuned_from": {"checkpoint": str(models / "rope"), "tokens": 4096, "train_length": 128,
                                "position_options": options}}
    curve = [{"step": 0, "tokens": 512, "train_bpb": 7.5}, {"step": 1, "tokens": 1024, "train_bpb": 6.0}]
    save_checkpoint(tuned, models / "rope-linear-ft4x", extra, {"train_curve": curve})
    block = evaluate_checkpoint(models / "rope-linear-ft4x", corpus.eval_stream(1 << 12), multiples=(1, 2, 4), progress=False)
    copy_curve = [{"step": 1, "tokens": 1024, "ratio": 0.3, "gain": 0.3}]  # its own fine-tuning run's check
    write_metrics(models / "rope-linear-ft4x", {"train_curve": curve, "eval": block, "copy_curve": copy_curve})
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(models))

    at = run(page("context_extension", refs="alibi"))
    rows = [f for f in chart_frames(at) if {"curve", "stage", "bpb"} <= set(f.columns)][0]
    after = rows[rows["stage"] == "after fine-tuning"].set_index("length")["bpb"]
    before = rows[(rows["stage"] == "before fine-tuning")].set_index("length")["bpb"]
    assert dict(after) == pytest.approx({int(k): v for k, v in block["nonoverlapping_bpb"].items()})
    assert set(rows[rows["stage"] == "before fine-tuning"]["curve"]) == {"rope+linear"}
    # "before" is the base checkpoint with the same options: its own scores, not the fine-tune's
    expected_before = {int(k): v for k, v in block["before_finetuning"]["nonoverlapping_bpb"].items()}
    assert dict(before) == pytest.approx(expected_before)
    assert all(abs(before[n] - after[n]) > 0.01 for n in after.index)  # a swapped before/after would show
    facts = ided([d.value for d in at.main.dataframe if "scaling" in d.value.columns][0])
    assert facts.iloc[0]["checkpoint"] == "rope-linear-ft4x" and facts.iloc[0]["bytes"] == 4096
    assert display_name("rope-linear-ft4x") not in at.multiselect(key="w_refs").options  # not a reference: a section of its own
    # beside each score at the fine-tuning length, how far it moves with the evaluation windows (a bootstrap)
    at_target = ided([d.value for d in at.main.dataframe if "after fine-tuning" in d.value.columns][0].set_index("checkpoint"))
    windows = block["nonoverlapping_window_bpb"]["128"]
    low, high = intervals.mean_interval(windows)
    assert at_target.loc["rope-linear-ft4x", "its own score, 95 % interval"] == \
        f"{low:.3f}–{high:.3f} (95 %, {len(windows)} windows)"
    assert low <= float(at_target.loc["rope-linear-ft4x", "after fine-tuning"]) <= high

    # The retrieval page's "when copying formed" draws pre-training runs only, and lists only what it draws.
    at = run(page("retrieval", models="rope"))
    copying = [f for f in chart_frames(at) if {"bytes", "ratio", "gain", "step"} <= set(f.columns)][0]
    assert "rope" in set(copying["model"]) and "rope-linear-ft4x" not in set(copying["model"])


def test_context_extension_shows_drope_as_trained_dropped_and_recalibrated(tiny_models_dir, tmp_path, monkeypatch, corpus):
    """A DroPE checkpoint (nope recalibrated from rope's weights) drawn in three stages, each the stored score: rope as
    trained, rope's weights run without the rotation before any step, and the recalibrated checkpoint; the middle
    stage equals rope's weights saved as a NoPE checkpoint and scored as any checkpoint is."""
    import shutil

    from posviz.config import ModelConfig
    from posviz.models.byte_gpt import GPT
    from posviz.models.checkpoint_files import load_checkpoint, save_checkpoint, write_metrics
    from posviz.training.evaluate import eval_table, evaluate_checkpoint

    models = tmp_path / "models"
    shutil.copytree(tiny_models_dir, models)
    rope = load_checkpoint(models / "rope")
    as_nope = GPT(ModelConfig.from_dict({**rope.config.to_dict(), "position": "nope", "position_options": {}})).eval()
    as_nope.load_state_dict(rope.state_dict())
    save_checkpoint(as_nope, tmp_path / "dropped")  # the middle stage, reached another way: a checkpoint of its own
    with torch.no_grad():  # recalibrated: weights that differ from the base's
        gen = torch.Generator().manual_seed(5)
        for p in as_nope.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    extra = {"finetuned_from": {"checkpoint": str(models / "rope"), "tokens": 4096, "train_length": 32,
                                "position_options": {}, "dropped_positions": "rope"}}
    save_checkpoint(as_nope, models / "rope-drope", extra, {"train_curve": []})
    data = corpus.eval_stream(1 << 12)
    block = evaluate_checkpoint(models / "rope-drope", data, multiples=(1, 2, 4), progress=False)
    write_metrics(models / "rope-drope", {"train_curve": [], "eval": block})
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(models))
    dropped = eval_table(load_checkpoint(tmp_path / "dropped"), data, [32, 64, 128], progress=False)
    assert block["before_recalibration"]["nonoverlapping_bpb"] == pytest.approx(dropped)

    at = run(page("context_extension"))
    assert "DroPE: RoPE's rotation dropped after training, then recalibrated" in [h.value for h in at.subheader]
    rows = next(f for f in chart_frames(at) if {"stage", "bpb", "of"} <= set(f.columns) and "as trained" in set(f["stage"]))
    stages = {stage: dict(zip(part["length"], part["bpb"])) for stage, part in rows.groupby("stage")}
    assert stages["as trained"] == pytest.approx({int(k): v for k, v in block["before_finetuning"]["nonoverlapping_bpb"].items()})
    assert stages["positions dropped, not recalibrated"] == pytest.approx({int(k): v for k, v in dropped.items()})
    assert stages["recalibrated"] == pytest.approx({int(k): v for k, v in block["nonoverlapping_bpb"].items()})
    nope = dict(extrapolation.shipped_bpb_curve(open_model(models / "nope")))
    assert stages["NoPE, trained without positions"] == pytest.approx({n: v for n, v in nope.items() if v is not None})
    caption = " ".join(c.value for c in at.caption)
    assert (f"dropped, not recalibrated {dropped['32']:.3f} and {dropped['128']:.3f}" in caption
            and f"recalibrated {block['nonoverlapping_bpb']['32']:.3f}" in caption), caption


# ------------------------------------------------------------------------------------------------
# Far-context retrieval
# ------------------------------------------------------------------------------------------------
def test_retrieval_shipped_probes_induction_and_live_run(tiny_models):
    at = run(page("retrieval", models="alibi,learned", gap="64", chunks="2"))
    folders = shipped_checkpoints()
    stored = read_metrics(folders["alibi"])["eval"]["retrieval"]
    shipped = [f for f in chart_frames(at) if {"probe", "ratio", "first_bits"} <= set(f.columns)
               and set(f["probe"]) == {"repeat"} and "live" not in f.columns]
    alibi = shipped[0][shipped[0]["model"] == "alibi"].sort_values("gap")
    assert list(alibi["ratio"]) == pytest.approx([r["ratio"] for r in stored["repeat"]])
    heat = [f for f in chart_frames(at) if {"layer", "head", "score"} <= set(f.columns)]
    assert heat and set(heat[0]["gap"]) == {0}  # the heatmap at the default gap
    hybrid = heat[0][heat[0]["model"] == "hybrid_deltanet"]  # every layer scored, the recurrent too
    model = open_model(folders["hybrid_deltanet"])
    recurrent = [layer for layer in range(model.n_layer) if model.layer_kind(layer) != "attention"]
    assert sorted(set(hybrid["layer"])) == list(range(model.n_layer)) and hybrid["score"].between(0, 1).all()
    which = f"layer {recurrent[0]} is a" if len(recurrent) == 1 else f"layers {', '.join(map(str, recurrent))} are"
    assert any(c.value.startswith(rf"DeltaNet \+ NoPE: {which} Gated DeltaNet (recurrent) layer")
               for c in at.caption), texts(at.caption)
    copying = [f for f in chart_frames(at) if {"bytes", "ratio", "gain", "step"} <= set(f.columns)]
    stored_curve = read_metrics(folders["alibi"])["copy_curve"]
    assert "alibi" in set(copying[0]["model"]) and "learned" not in set(copying[0]["model"])  # 32 positions: no room
    assert list(copying[0][copying[0]["model"] == "alibi"]["ratio"]) == [stored_curve[0]["ratio"]]

    live = ided(at.main.dataframe[-2].value)  # the live table (the last one is the retired probe's)
    text = bytes(load_corpus().eval_documents[0])
    gaps = [g for g in probes.default_gaps(32) if g <= 64]
    expected = probes.repeat_probe(open_model(folders["alibi"]), text, gaps, chunks=2)
    assert [live.loc["alibi", g] for g in gaps] == pytest.approx([r.gain for r in expected])  # the default measure
    assert all(math.isnan(live.loc["learned", g]) for g in gaps)  # 32 positions: no room for two 64-byte chunks
    at.select_slider(key="w_hgap").set_value(64)
    run(at)
    heat = [f for f in chart_frames(at) if {"layer", "head", "score"} <= set(f.columns)]
    assert set(heat[0]["gap"]) == {64} and at.query_params["hgap"] == "64"
    # the strongest head's fall with the gap: one line per checkpoint picked under "Checkpoints drawn", not all of them
    def falls():
        return next(f for f in chart_frames(at) if {"gap1", "score"} <= set(f.columns))
    picker = at.multiselect(key="w_shown")
    followed = {n for n in picker.value if (read_metrics(folders[n])["eval"]["retrieval"]["induction"].get("0"))}
    assert set(falls()["model"]) == followed and 1 < len(followed) < len(picker.options)  # no gap-0 head: no line
    picker.set_value(["alibi"])
    run(at)
    alibi_best = falls().sort_values("gap")
    assert set(alibi_best["model"]) == {"alibi"}
    scores = {int(g): np.asarray(v) for g, v in stored["induction"].items() if v is not None}
    head = np.unravel_index(int(np.argmax(scores[0])), scores[0].shape)  # the head chosen at gap 0, followed
    assert list(alibi_best["score"]) == pytest.approx([scores[g][head] for g in sorted(scores)])
    junk = run(page("retrieval", measure="loud", chunks="99", models="alibi"))
    assert "Ignored URL parameter measure=" in texts(junk.warning) and "Ignored URL parameter chunks=" in texts(junk.warning)


# ------------------------------------------------------------------------------------------------
# Compare
# ------------------------------------------------------------------------------------------------
def test_compare_methods_and_lengths(tiny_models, doc_ids):
    folders = shipped_checkpoints()
    at = run(page("compare", a="learned", b="rope", L="64"))
    assert "32 rows" in texts(at.error)  # learned cannot run at 64 ...
    rope = extrapolation.score_at_length(open_model(folders["rope"]), doc_ids, 64).bpb
    assert metrics(at)["rope: bits/byte"] == f"{rope:.3f}"  # ... while rope is still shown

    at.selectbox(key="w_a").set_value("nope")
    run(at)
    nope = extrapolation.score_at_length(open_model(folders["nope"]), doc_ids, 64).bpb
    assert metrics(at)["rope − nope"] == f"{rope - nope:+.3f}"
    assert len(at.get("vega_lite_chart")) == 5  # the loss chart and B − A under it; maps of A, B and B − A as heatmaps at 64 bytes
    # the maps open on the log colour scale, as in the Extrapolation lab: log10 probability, at most 0
    assert at.query_params["scale"] == "log"
    a_map = next(f for f in chart_frames(at) if "value" in f.columns)
    assert a_map["value"].max() <= 0 and a_map["value"].min() < -1
    at.radio(key="w_scale").set_value("prob")
    run(at)
    a_map = next(f for f in chart_frames(at) if "value" in f.columns)
    assert a_map["value"].min() >= 0 and a_map["value"].max() <= 1
    at.select_slider(key="w_L").set_value(256)
    run(at)
    assert len(at.image) == 3  # above 128 bytes the three maps are pooled images

    at.radio(key="w_mode").set_value("lengths")
    run(at)
    at.selectbox(key="w_model").set_value("alibi")
    at.select_slider(key="w_L2").set_value(32)
    run(at)
    result = compare.compare_lengths(open_model(folders["alibi"]), doc_ids, 32)
    shown = metrics(at)
    assert shown["bits/byte at L = 32"] == f"{result['bpb_short']:.3f}"
    assert shown["bits/byte at 2L = 64"] == f"{result['bpb_long']:.3f}"
    assert at.query_params["mode"] == "lengths"


def test_compare_draws_a_recurrent_layer_as_its_implied_matrix_and_says_so(tiny_models, doc_ids):
    """The hybrid beside RoPE, layer 0 (Gated DeltaNet): the map is each row's share of its |implied weight| (the
    lab's own computation), a note says what it is; at its last layer (attention) no note."""
    folders = shipped_checkpoints()
    at = run(page("compare", a="rope", b="hybrid_deltanet", L="64", scale="prob"))
    note = r"Layer 0 of DeltaNet \+ NoPE is a Gated DeltaNet (recurrent) layer"  # Markdown-quoted
    assert any(c.value.startswith(note) and "(its implied matrix)" in c.value for c in at.caption), texts(at.caption)
    hybrid = open_model(folders["hybrid_deltanet"])
    shares = attention_maps.attention_probs(hybrid, doc_ids, 64, 0)[0].numpy()  # (T, T), head 0
    drawn = [f for f in chart_frames(at) if "value" in f.columns][1].dropna()  # A's map, then B's
    cell = drawn.iloc[len(drawn) // 2]
    assert cell["value"] == pytest.approx(float(shares[int(cell["row"]), int(cell["col"])]), abs=1e-6)
    assert hybrid.layer_kind(0) != "attention" and hybrid.layer_kind(hybrid.n_layer - 1) == "attention"
    at.selectbox(key="w_layer").set_value(hybrid.n_layer - 1)
    run(at)
    assert not any("(its implied matrix)" in c.value for c in at.caption)


# ------------------------------------------------------------------------------------------------
# The real shipped checkpoints
# ------------------------------------------------------------------------------------------------
def test_extrapolation_lab_runs_the_shipped_checkpoints(monkeypatch):
    """Fails (never skips) when models/ is empty: the app is useless without its checkpoints."""
    monkeypatch.delenv("POSVIZ_CHECKPOINTS", raising=False)
    found = shipped_checkpoints()
    assert found, f"no checkpoints in {ROOT / 'models'}: run `make checkpoints`"
    at = run(page("extrapolation"))
    assert list(metrics(at)) == list(extrapolation.FIRST_VIEW)  # one of each kind by default
    pretrained = [n for n in found if n in POSITION_METHODS]  # fine-tuned ones on request
    at.multiselect(key="w_models").set_value(pretrained)
    run(at)
    shown = metrics(at)
    train_length = open_model(next(iter(found.values()))).train_length
    for name in pretrained:
        # trained byte-level models on Python source: well under the 8 bits/byte of a uniform guess
        assert float(shown[name]) < 4.0, (name, shown[name])
    # every checkpoint, and the rope checkpoint under each training-free remap (covering 16x)
    remapped = {f"rope+{r}" for r in ROPE_REMAPS} | {"nope+temperature"}
    assert set(shown) >= set(pretrained)
    # the picker shows each by its display name (its id stays in the link)
    assert set(at.multiselect(key="w_models").options) == {display_name(n) for n in set(found) | remapped}
    assert at.select_slider(key="w_L").value == train_length


def test_the_nope_checkpoint_runs_with_the_temperature_switched_on_beside_the_method_trained_with_it(tiny_models, doc_ids):
    """"NoPE + temperature, no retraining" (issue #73): the shipped nope checkpoint with nope_temperature's query
    temperature, listed in every lab's picker, scored as the lab scores any model, beside nope_temperature trained with
    it, in the trained method's hue, dashed."""
    from posviz import palette
    from posviz.positions.nope_temperature import INFERENCE_TEMPERATURE

    at = run(page("extrapolation", L="128", models="nope,nope+temperature,nope_temperature"))
    shown = metrics(at)
    folders = shipped_checkpoints()
    switched = open_model(str(folders["nope"]), INFERENCE_TEMPERATURE)
    switched.load()
    assert switched.net.position.options.temperature_floor_scale == INFERENCE_TEMPERATURE["temperature_floor_scale"]
    assert shown["nope+temperature"] == f"{extrapolation.score_at_length(switched, doc_ids, 128).bpb:.3f}"
    plain = open_model(str(folders["nope"]))
    plain.load()
    ids = torch.as_tensor(doc_ids[:128]).clone()[None]
    with torch.inference_mode():
        assert (switched(ids).logits - plain(ids).logits).abs().max() > 1e-6  # the switch acts (the tiny model barely)
    assert shown["nope_temperature"] == f"{extrapolation.score_at_length(open_model(folders['nope_temperature']), doc_ids, 128).bpb:.3f}"
    assert display_name("nope+temperature") in at.multiselect(key="w_models").options
    assert palette.colour("nope+temperature") == palette.colour("nope_temperature") and palette.dash("nope+temperature")


# ------------------------------------------------------------------------------------------------
# Generation lab
# ------------------------------------------------------------------------------------------------
def shown_texts(at: AppTest) -> list[str]:
    """The plain text of each model's continuation, in the order of the columns (st.code drops trailing
    whitespace, so compare with ``plain``)."""
    return [c.value.rstrip() for c in at.code][1:]  # the first code block is the prompt


def plain(result) -> str:
    return result.text.rstrip()


def test_generation_same_seed_same_text_and_learned_stops_with_its_explanation(tiny_models, doc_ids):
    from posviz.labs import generation

    params = dict(models="learned,alibi", n="96", decode="sample", temp="1.0", topk="20", seed="5", p="16", window="stop")
    at = run(page("generation", **params))
    folders = shipped_checkpoints()
    prompt = doc_ids[:16].tolist()
    settings = generation.DecodeSettings(96, temperature=1.0, top_k=20, seed=5)
    expected = {name: generation.generate(open_model(folders[name]), prompt, settings)
                for name in ("learned", "alibi")}
    learned, alibi = shown_texts(at)
    assert learned == plain(expected["learned"]) and alibi == plain(expected["alibi"])
    assert len(expected["alibi"].ids) == 96 and alibi  # the others keep writing ...
    assert len(expected["learned"].ids) == 32 + 1 - 16  # ... while learned stops at its table's end, and says why
    warnings = texts(at.warning)
    assert "learned** stopped" in warnings and "The learned absolute table has 32 rows" in warnings
    assert "alibi** stopped" not in warnings
    assert "bytes/s" in texts(at.caption)
    # every setting is in the URL, so a link reproduces the text
    for key, value in params.items():
        assert at.query_params[key] == value, key
    again = run(page("generation", **params))
    assert shown_texts(again) == [learned, alibi]
    other = run(page("generation", **{**params, "seed": "6"}))
    assert shown_texts(other)[1] != alibi

    # re-encoding the window lets learned write past its table; the real continuation is scored next to it
    at.radio(key="w_window").set_value("reencode")
    run(at)
    reencoded = generation.generate(open_model(folders["learned"]), prompt,
                                    generation.DecodeSettings(96, temperature=1.0, top_k=20, seed=5, strategy="reencode"))
    assert shown_texts(at)[0] == plain(reencoded) and len(reencoded.ids) == 96
    assert "learned** stopped" not in texts(at.warning)
    table = ided(at.main.dataframe[-1].value)
    real = doc_ids[16:16 + 96].tolist()
    forced = generation.teacher_forced(open_model(folders["alibi"]), prompt, real, "reencode")
    assert table.loc["alibi", "bits/byte, the real continuation"] == pytest.approx(forced.mean_bits)
    assert table.loc["learned", "bits/byte, its own text"] == pytest.approx(reencoded.mean_bits)


def test_generation_opens_on_sampling_greedy_one_click_away_and_junk_params(tiny_models, doc_ids):
    from posviz.labs import generation

    at = run(page("generation", n="40", p="8"))
    # the opening view: two checkpoints, sampled with a fixed seed, so the same link writes the same text
    assert at.query_params["decode"] == "sample" and at.query_params["models"] == "kerple,sinusoidal"
    assert (at.query_params["temp"], at.query_params["topk"], at.query_params["seed"]) == ("0.7", "40", "0")
    folders, prompt = shipped_checkpoints(), doc_ids[:8].tolist()
    sampled = {name: generation.generate(open_model(folders[name]), prompt,
                                         generation.DecodeSettings(40, temperature=0.7, top_k=40, seed=0))
               for name in ("kerple", "sinusoidal")}
    assert shown_texts(at) == [plain(sampled["kerple"]), plain(sampled["sinusoidal"])]
    assert "greedy decoding always takes the single most likely byte" in texts(at.caption)  # why greedy loops
    assert len(at.get("vega_lite_chart")) == 1  # mean entropy per position window
    # greedy: one click away
    at.radio(key="w_decode").set_value("greedy")
    run(at)
    greedy = generation.generate(open_model(folders["sinusoidal"]), prompt, generation.DecodeSettings(40))
    assert shown_texts(at)[1] == plain(greedy) and at.query_params["decode"] == "greedy"
    junk = run(page("generation", n="99999", temp="abc", topk="-3", window="warp", models="bogus", seed="x", colour="red"))
    notices = texts(junk.warning)
    for key in ("n=", "temp=", "topk=", "window=", "models=", "seed=", "colour="):
        assert f"Ignored URL parameter {key}" in notices, key
    assert len(shown_texts(junk)) == 2  # the defaults still write
    pasted = run(page("generation", src="paste"))
    assert "The text is empty" in texts(pasted.error) and not shown_texts(pasted)


# ------------------------------------------------------------------------------------------------
# Scoreboard
# ------------------------------------------------------------------------------------------------
def test_scoreboard_reads_every_number_from_metrics(tiny_models):
    """A row per checkpoint and per stored scaling and remap of a RoPE checkpoint, each number its metrics.json's;
    the rows picker filters the table and the chart and stays in the link."""
    at = run(page("scoreboard"))
    table = at.dataframe[0].value.set_index("checkpoint")
    assert not table.isin(["None", "nan", "NaN", ""]).any().any() and not table.isna().any().any(), table  # #56
    table = ided(table)
    folders = shipped_checkpoints()
    assert set(folders) <= set(table.index)
    assert {f"rope+{r}" for r in list(ROPE_REMAPS) + ["yarn", "linear"]} <= set(table.index)
    rope = read_metrics(folders["rope"])["eval"]
    # shown as text to the column's precision (no None or nan: one mark for a missing number)
    assert table.loc["rope", "bpb 4×"] == f'{rope["nonoverlapping_bpb"]["128"]:.3f}'
    assert table.loc["rope+dca", "bpb 16×"] == f'{rope["rope_remaps"]["dca"]["nonoverlapping_bpb"]["512"]:.3f}'
    assert table.loc["rope+yarn", "bpb 1×"] == f'{rope["nonoverlapping_bpb"]["32"]:.3f}'  # a scaling at 1x is the model
    assert table.loc["rope+yarn", "copy ratio"] == scoreboard.MISSING  # not stored for a scaling
    intervals = at.dataframe[1].value.set_index("checkpoint")  # in the expander, with the reasons
    assert not intervals.isin(["None", "nan", "NaN", ""]).any().any() and not intervals.isna().any().any(), intervals
    intervals = ided(intervals)
    assert intervals.loc["rope", "1× interval"].endswith("windows)") and "not measurable" in texts(at.markdown)
    repeat = next(r for r in read_metrics(folders["alibi"])["eval"]["retrieval"]["repeat"] if r["gap"] == 128)
    assert table.loc["alibi", "copy ratio"] == f'{round(repeat["second_bits"] / repeat["control_bits"], 3):.2f}'
    assert table.loc["alibi", "effective length"] == "not measurable"  # 32 bytes hold no planted pair
    assert table.loc["learned", "KV cache (sliding window)"].startswith("Cannot run")
    at.selectbox(key="w_kinds").set_value("remap")
    run(at)
    assert set(at.dataframe[0].value["kind"]) == {"remap"} and at.query_params["rows"] in ("remap", ["remap"])
