"""The Workshop's position method (issue #47): a logit bias written as a formula, through the interface every method
implements; its checkpoints, its KV cache verdicts read off the syntax tree, and its training (``--formula``,
``--quick``, the page's progress and cancel, the hosted demo's time cap).

The language itself (the whitelist, the hostile inputs) is tested in test_core_bad_input; the formulas' values
against ALiBi's and KERPLE's in test_bias_methods.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, tiny_model
from maths_support import sharp, text_ids  # noqa: F401  (text_ids: a fixture)

from posviz.display import display_name
from posviz.config import ModelConfig
from posviz.errors import ConfigError, PosvizError
from posviz.labs import kv_cache
from posviz.models.attention import reference_attention
from posviz.models.byte_gpt import GPT
from posviz.models.checkpoint_files import load_checkpoint
from posviz.models.interface import open_model
from posviz.models.shipped import as_lab_model
from posviz.positions import POSITION_METHODS, VISITOR_METHODS, ModelShape, build_position_method, method_names
from posviz.training.command_line import formula_options, main
from posviz.training.train import TrainConfig, TrainingCancelled, train
from posviz.positions.formula_language import FormulaError

ALIBI = "-(2**(-8*(h+1)/H))*d"  # ALiBi's slopes for a power-of-two head count, as the issue writes it
KERPLE = "-a[layer, h] * log(1 + b[layer, h] * d)"
KERPLE_PARAMS = {"a": {"init": [0, 2], "floor": 0.01}, "b": {"init": [0, 1], "floor": 0.01}}  # the authors' draws
SHAPE = ModelShape(n_layer=2, n_head=4, head_dim=8, n_embd=32, train_length=32)


def formula_model(formula: str, parameters: dict | None = None, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    options = {"formula": formula, "parameters": parameters or {}}
    return GPT(ModelConfig(position="formula", position_options=options, **{**TINY, **overrides})).eval()


def causal_part(bias: torch.Tensor) -> torch.Tensor:
    T = bias.shape[-1]
    return bias.expand(-1, SHAPE.n_head, T, T)[..., torch.ones(T, T, dtype=torch.bool).tril()]


def test_a_formula_is_a_visitors_method_on_no_page():
    """Built by name like any method, but not among the literature's: no page lists it, no shipped checkpoint."""
    assert "formula" in VISITOR_METHODS and "formula" not in POSITION_METHODS and "formula" not in method_names()
    assert build_position_method("formula", SHAPE, {"formula": "-d"}).name == "formula"


def test_alibi_as_a_formula_method_is_alibi():
    """Its bias on every causal pair, its per-distance shortcut, and a whole model's logits with the same weights."""
    formula, alibi = (build_position_method(m, SHAPE, o) for m, o in (("formula", {"formula": ALIBI}), ("alibi", None)))
    pos, q = torch.arange(40), torch.zeros(1, 4, 40, 8)
    assert torch.equal(causal_part(formula.logit_bias(1, q, pos, pos)), causal_part(alibi.logit_bias(1, q, pos, pos)))
    assert torch.equal(formula.distance_bias(0, pos, 0, 39), alibi.distance_bias(0, pos, 0, 39))

    ours, theirs = formula_model(ALIBI), tiny_model("alibi")
    ours.load_state_dict(theirs.state_dict())
    idx = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(1))  # past train_length too
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, theirs(idx).logits, rtol=0, atol=1e-6)
        with reference_attention():  # the (H, Tq, Tk) path as well as the per-distance one
            torch.testing.assert_close(ours(idx).logits, theirs(idx).logits, rtol=0, atol=1e-6)


def test_kerple_log_as_a_formula_method_at_kerples_values_is_kerple():
    torch.manual_seed(2)
    kerple = build_position_method("kerple", SHAPE)
    formula = build_position_method("formula", SHAPE, {"formula": KERPLE, "parameters": KERPLE_PARAMS})
    assert formula.param_a.shape == formula.param_b.shape == kerple.r1.shape == (2, 4)  # (n_layer, H)
    with torch.no_grad():
        kerple.r1[0, 0] = -3.0  # below the floor: both use 0.01
        formula.param_a.copy_(kerple.r1)
        formula.param_b.copy_(kerple.r2)
    pos, q = torch.arange(30), torch.zeros(1, 4, 30, 8)
    for layer in (0, 1):
        torch.testing.assert_close(causal_part(formula.logit_bias(layer, q, pos, pos)),
                                   causal_part(kerple.logit_bias(layer, q, pos, pos)), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(formula.distance_bias(layer, pos, 0, 29), kerple.distance_bias(layer, pos, 0, 29),
                                   rtol=1e-6, atol=1e-6)
    formula.after_optimizer_step()  # the stored value is kept at its floor, as KERPLE's own step does
    assert float(formula.param_a[0, 0].detach()) == pytest.approx(0.01)


def test_learned_parameters_take_their_initial_values_and_learn():
    method = build_position_method("formula", SHAPE, {"formula": "-m[h] * d - c[layer, h] * (d > 4)",
                                                      "parameters": {"m": {"init": 0.5}, "c": {"init": [1, 3]}}})
    assert torch.equal(method.param_m, torch.full((4,), 0.5)) and method.param_c.shape == (2, 4)
    assert bool(((method.param_c >= 1) & (method.param_c <= 3)).all())
    assert method.options.parameters == {"c": {"init": [1.0, 3.0], "floor": None}, "m": {"init": 0.5, "floor": None}}
    net = formula_model("-m[h] * d", {"m": {"init": 0.5}}).train()
    net(torch.randint(0, 256, (1, 20))).logits.sum().backward()
    assert net.position.param_m.grad is not None and bool(net.position.param_m.grad.abs().sum() > 0)


@pytest.mark.parametrize("options,words", [
    ({"formula": KERPLE}, "need an initial value"),
    ({"formula": "-d", "parameters": {"a": {"init": 1}}}, "not in the formula"),
    ({"formula": "-a[h] * d", "parameters": {"a": {"init": "one"}}}, "init must be a number or a range"),
    ({"formula": "-a[h] * d", "parameters": {"a": {"init": 1, "flor": 0}}}, "expected {'init'"),
    ({"formula": "-a[h] * d", "parameters": {"a": {"init": [2, 1]}}}, "init must be a number or a range"),
    ({"formula": "-log(L / 2 - d)"}, "NaN"),  # no bias within the trained context: said when it is built
    ({"formula": "__import__('os')"}, "not allowed"),
    ({}, "formula"),
])
def test_a_bad_formula_method_is_refused_with_words(options, words):
    with pytest.raises((ConfigError, FormulaError)) as err:
        build_position_method("formula", SHAPE, options)
    assert words in str(err.value)


@pytest.mark.parametrize("formula,words", [
    ("-log(L + 1 - d)", "NaN on some causal pair at a distance below 64"),  # fine within L, NaN past it
    ("where(i > 40, -inf, 0)", "no key with a finite bias"),
])
def test_a_formula_that_breaks_past_the_trained_length_says_where(formula, words):
    net = formula_model(formula)
    with torch.no_grad():
        assert torch.isfinite(net(torch.zeros(1, 32, dtype=torch.long)).logits).all()
        with pytest.raises(FormulaError, match=words):
            net(torch.zeros(1, 64, dtype=torch.long))


@pytest.mark.parametrize("formula,shift_invariant", [("-0.3 * log(1 + d)", True), ("-0.05 * d * (1 + i / L)", False)])
def test_kv_cache_verdicts_come_from_the_syntax_tree(formula, shift_invariant, text_ids):
    """A formula of d alone is shift-invariant: a cached window equals re-encoding it in one layer. One that reads i
    is not, and the lab says so. Cached decoding equals the full pass either way."""
    model = as_lab_model(sharp(formula_model(formula, n_layer=1)), name="yours")
    assert model.is_shift_invariant() is shift_invariant
    verdict = kv_cache.strategy_verdict(model, "cached_window")
    assert verdict.startswith("Correct") if shift_invariant else "also reads each query's true position" in verdict
    cached = kv_cache.sliding_score(model, text_ids, 8, "cached_window", 40)
    reencode = kv_cache.sliding_score(model, text_ids, 8, "reencode", 40)
    gap = np.abs(cached.id_bits - reencode.id_bits).max()
    assert (gap < 2e-4) if shift_invariant else (gap > 1e-3), gap
    check = kv_cache.cache_check(model, text_ids, 32)
    assert check["max_abs_diff"] < 1e-4 * max(1.0, check["logit_scale"])


def tiny_recipe(**changes) -> TrainConfig:
    return TrainConfig(**{"method": "formula", "position_options": {"formula": KERPLE, "parameters": KERPLE_PARAMS},
                          "n_layer": 1, "n_embd": 32, "train_length": 32, "batch_size": 4, "tokens": 4 * 32 * 6,
                          "eval_bytes": 4096, "warmup_steps": 2, "log_every": 1, **changes})


def test_a_formula_checkpoint_holds_its_formula_and_loads_like_a_shipped_one(tmp_path):
    train(tiny_recipe(), tmp_path / "yours", progress=False)
    config = json.loads((tmp_path / "yours" / "config.json").read_text())
    assert config["model"]["position"] == "formula"
    assert config["model"]["position_options"] == {"formula": KERPLE, "parameters": {
        "a": {"init": [0.0, 2.0], "floor": 0.01}, "b": {"init": [0.0, 1.0], "floor": 0.01}}}
    net = load_checkpoint(tmp_path / "yours")
    assert float(net.position.param_a.detach().min()) >= 0.01  # the floors held through training
    lab = open_model(tmp_path / "yours", device="cpu")
    ids = torch.randint(0, 256, (1, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(lab.net(ids).logits, net(ids).logits)
    assert lab.name == "yours" and lab.acts_on == "logits" and lab.is_shift_invariant()


def test_training_reports_each_step_cancels_and_keeps_to_its_time_cap(tmp_path):
    seen = []
    with pytest.raises(TrainingCancelled, match="cancelled at step 3 of 6"):
        train(tiny_recipe(), tmp_path / "cancelled", progress=False,
              on_step=lambda done, steps, seconds: seen.append((done, steps)) or done == 3)
    assert seen == [(1, 6), (2, 6), (3, 6)] and not (tmp_path / "cancelled").exists()
    metrics = train(tiny_recipe(), tmp_path / "capped", progress=False, max_seconds=0)
    assert metrics["stopped_early"] == "stopped at step 1 of 6: the 0 s cap on training"
    assert json.loads((tmp_path / "capped" / "metrics.json").read_text())["stopped_early"] == metrics["stopped_early"]


def test_a_formula_with_no_derivative_stops_training_with_words(tmp_path):
    """sqrt(a d) has no derivative in a at d = 0: the first step's gradient is NaN, and would make every weight NaN."""
    with pytest.raises(PosvizError, match=r"stopped at step 0: the gradient of position\.param_a \(and \d+ more\) is not a number"):
        train(tiny_recipe(position_options={"formula": "-sqrt(a[h] * d)", "parameters": {"a": {"init": 1.0}}}),
              tmp_path / "nan", progress=False)
    assert not (tmp_path / "nan").exists()


def test_the_formula_command_line_writes_under_runs_and_scores_1_4_and_16x(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    main(["--formula", ALIBI, "--quick", "--set", "tokens=768", "n_layer=1", "n_embd=32", "train_length=32",
          "batch_size=4", "eval_bytes=4096"])
    (out,) = (tmp_path / "runs").iterdir()
    assert out.name.startswith("formula-") and out.name.endswith("-quick") and not any((tmp_path / "models").iterdir())
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["eval"]["lengths_x_train"] == {"32": 1.0, "128": 4.0, "512": 16.0}
    assert all(v > 0 for v in metrics["eval"]["nonoverlapping_bpb"].values())
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["warmup_steps"] == 30 and config["train"]["tokens"] == 768  # --quick, then --set
    assert "bits per byte on" in capsys.readouterr().out


def test_formula_options_from_the_command_line():
    assert formula_options(KERPLE, ["a=0:2", "b=0.5"], ["a=0.01"]) == {
        "formula": KERPLE, "parameters": {"a": {"init": [0.0, 2.0], "floor": 0.01}, "b": {"init": 0.5}}}
    with pytest.raises(SystemExit, match="expected NAME=NUMBER or NAME=LOW:HIGH"):
        formula_options(KERPLE, ["a=big"], [])


# ------------------------------------------------------------------------------------------------
# The queue a server trains visitors' formulas in (posviz/workshop/training.py)
# ------------------------------------------------------------------------------------------------
PAGE_TOKENS = 4096  # one step of the shipped shape, scored on 4 KiB: the page's runs in tests
PAGE_RECIPE = json.dumps({"tokens": PAGE_TOKENS, "eval_bytes": 4096})


def test_the_trainer_runs_one_at_a_time_and_others_see_their_place(tmp_path, monkeypatch):
    from posviz.workshop.training import RunStore, Trainer

    monkeypatch.setenv("POSVIZ_WORKSHOP_RECIPE", PAGE_RECIPE)
    trainer = Trainer(RunStore(tmp_path / "runs"))
    first = trainer.submit("first", {"formula": ALIBI})
    second = trainer.submit("second", {"formula": "-0.1 * d"})
    assert trainer.place(second) == 1  # the first runs or waits ahead of it
    with pytest.raises(PosvizError, match="already waiting on this server"):
        Trainer(RunStore(tmp_path / "other"), queue_size=0).submit("third", {"formula": "-d"})
    trainer.cancel(second)  # still waiting: it leaves the line at once, and never runs
    assert second.status == "cancelled" and second.message == "cancelled before it started"
    assert trainer.wait(first, 120) and first.status == "done", first.message
    assert (first.step, first.steps) == (1, 1) and set(first.scores) == {1.0, 4.0, 16.0}
    config = json.loads((first.folder / "config.json").read_text())
    assert config["workshop"] == {"label": "first"} and config["train"]["tokens"] == PAGE_TOKENS
    assert open_model(first.folder, device="cpu").name == "yours: first"
    with pytest.raises(FormulaError):  # refused when submitted, not when its turn comes
        trainer.submit("bad", {"formula": "import os"})


def test_a_cancelled_run_leaves_nothing(tmp_path, monkeypatch):
    from posviz.workshop.training import RunStore, Trainer

    monkeypatch.setenv("POSVIZ_WORKSHOP_RECIPE", json.dumps({"tokens": 4096 * 50}))
    trainer = Trainer(RunStore(tmp_path / "runs"))
    job = trainer.submit("cancelled", {"formula": ALIBI})
    while job.step < 1 and not job.finished:
        trainer.wait(job, 0.2)
    trainer.cancel(job)
    assert trainer.wait(job, 60) and job.status == "cancelled" and "cancelled at step" in job.message
    assert not any((tmp_path / "runs").iterdir())


# ------------------------------------------------------------------------------------------------
# The Workshop page (views/workshop.py), in the app's menu
# ------------------------------------------------------------------------------------------------
def workshop_page(tiny_models, in_menu: bool = False, **params):
    """The Workshop page run with ``params`` as its link: alone, or in the app's menu (to switch to the labs after)."""
    from streamlit.testing.v1 import AppTest

    from conftest import ROOT

    if in_menu:
        at = AppTest.from_file(str(ROOT / "menu.py"), default_timeout=90)
        at.run()
        at.switch_page("views/workshop.py")
    else:
        at = AppTest.from_file(str(ROOT / "views" / "workshop.py"), default_timeout=90)
    at.query_params = {k: str(v) for k, v in params.items()}
    return shown(at)


def shown(at):
    at = at.run()  # an AppTest, or a widget of one (whose run() reruns the app and returns it)
    assert not at.exception, [e.value for e in at.exception]
    return at


def drawing_module():
    from posviz.workshop import drawing

    return drawing


def curve_data(at):
    import pyarrow as pa

    frames = [pa.ipc.open_stream(ds.data.data).read_pandas() for chart in at.get("vega_lite_chart")
              for ds in chart.proto.datasets]
    (curves,) = [f for f in frames if {"head", "distance", "bias"} <= set(f.columns)]
    return curves


def test_the_workshop_draws_alibi_per_head_and_a_hard_cut(tiny_models):
    from posviz.positions.alibi import alibi_slopes

    at = workshop_page(tiny_models)
    assert at.selectbox(key="w_example").value == "ALiBi" and not at.error
    curves = curve_data(at)
    slopes = alibi_slopes(4).double().numpy()
    for h in range(4):
        head = curves[curves["head"] == f"head {h}"]
        assert np.allclose(head["bias"], -slopes[h] * head["distance"], rtol=1e-6)
    assert {m.label: m.value for m in at.metric}["shift-invariant"] == "yes"
    assert at.query_params["bias"] == ALIBI and at.query_params["example"] == "ALiBi"
    (table,) = [d.value for d in at.dataframe if "model" in d.value.columns]  # before any run: the quick baselines
    runs = json.loads((Path(drawing_module().__file__).with_name("quick_runs.json")).read_text())
    for name in ("alibi", "rope", "nope"):
        row = table[table["model"] == f"{display_name(name)} (quick)"].iloc[0]  # shown by name
        assert [row["1×"], row["4×"], row["16×"]] == [runs[name]["bits_per_byte"][m] for m in ("1", "4", "16")]
        at16 = [e["bits_per_byte"]["16"] for e in runs[name]["seeds"]]  # the first seed is the number shown
        assert runs[name]["seeds"][0]["bits_per_byte"] == runs[name]["bits_per_byte"]
        assert f"16×: {min(at16):.3f}–{max(at16):.3f} ({len(at16)} seed" in row["training seeds"]

    shown(at.selectbox(key="w_example").set_value("Hard cut at 64"))
    curves = curve_data(at)
    assert (curves[curves["distance"] < 64]["bias"] == 0).all() and curves[curves["distance"] >= 64]["bias"].isna().all()
    shown(at.text_input(key="w_formula").set_value("-0.01 * d * i / L"))
    assert {m.label: m.value for m in at.metric}["shift-invariant"] == "no: reads i or j"
    assert at.query_params["bias"] == "-0.01 * d * i / L"
    # the picker and its caption follow what was typed: no longer the hard cut's, and back to ALiBi when it is ALiBi's
    assert at.selectbox(key="w_example").value == "Your own" and at.query_params["example"] == "Your own"
    captions = [c.value for c in at.caption]
    assert "Your own formula" in " ".join(captions) and drawing_module().EXAMPLES["Hard cut at 64"].why not in captions
    shown(at.text_input(key="w_formula").set_value(ALIBI))
    assert at.selectbox(key="w_example").value == "ALiBi"


def test_a_link_reproduces_the_drawing_with_its_parameters(tiny_models):
    at = workshop_page(tiny_models, bias="-a[layer, h] * log(1 + b[layer, h] * d)", init="a=0.5;b=0:1",
                       floor="a=0.01;b=0.01", layer=2, head=1)
    assert at.selectbox(key="w_example").value == "KERPLE-log"
    assert at.text_input(key="w_init_a").value == "0.5" and at.text_input(key="w_init_b").value == "0:1"
    options = {"formula": "-a[layer, h] * log(1 + b[layer, h] * d)",
               "parameters": {"a": {"init": 0.5, "floor": 0.01}, "b": {"init": [0.0, 1.0], "floor": 0.01}}}
    from posviz.workshop import drawing
    method = drawing.drawn_method(options, SHAPE_SHIPPED)  # the same draw (seed 0) as the page's
    want = method.bias_by_distance(2, 4 * 256).numpy()
    curves = curve_data(at)
    for h in range(4):
        assert np.allclose(curves[curves["head"] == f"head {h}"]["bias"], want[h], rtol=1e-6)
    assert at.select_slider(key="w_layer").value == 2 and at.select_slider(key="w_head").value == 1


SHAPE_SHIPPED = ModelShape(n_layer=4, n_head=4, head_dim=32, n_embd=128, train_length=256)


def test_a_score_against_a_baselines_seeds_says_inside_or_by_how_much_outside():
    d = drawing_module()
    assert d.against_seeds(2.50, [2.49, 2.52, 2.51]) == "within the baseline's seed range (2.490–2.520, 3 seeds)"
    assert d.against_seeds(2.49, [2.49, 2.52]).startswith("within")  # the range's ends belong to it
    assert d.against_seeds(2.40, [2.49, 2.52, None]) == "outside it: better than all 2 seeds by 0.090"
    assert d.against_seeds(2.60, [2.49, 2.52, 2.51]) == "outside it: worse than all 3 seeds by 0.080"
    assert d.against_seeds(2.60, [2.50]) == "+0.100 (one seed: no range to compare with)"
    assert d.against_seeds(None, [2.5, 2.6]) == d.against_seeds(2.5, [None]) == "—"
    assert d.seed_spread([2.5, None, 2.4, 2.45]) == "2.400–2.500 (3 seeds)" and d.seed_spread([2.5]) == "2.500–2.500 (1 seed)"


def test_a_hostile_formula_gets_words_and_no_training(tiny_models):
    at = workshop_page(tiny_models)
    shown(at.text_input(key="w_formula").set_value("().__class__"))
    assert "is not allowed" in at.error[0].value and at.button(key="w_train").disabled
    shown(at.text_input(key="w_formula").set_value("-log(L / 2 - d)"))  # no bias within the trained context
    assert "NaN" in at.error[0].value and at.button(key="w_train").disabled


def trained_on_the_page(at) -> None:
    """Press Train and rerun as the page's progress fragment does, until the run's result is on the page."""
    import time

    shown(at.button(key="w_train").click())
    deadline = time.monotonic() + 120
    while not any(h.value == "Yours" for h in at.header) and time.monotonic() < deadline:
        time.sleep(0.5)
        shown(at)
    assert any(h.value == "Yours" for h in at.header), [e.value for e in list(at.error) + list(at.warning)]


def test_train_on_the_page_then_pick_it_in_the_extrapolation_lab(tiny_models, monkeypatch):
    monkeypatch.setenv("POSVIZ_WORKSHOP_RECIPE", PAGE_RECIPE)
    at = workshop_page(tiny_models, in_menu=True)
    trained_on_the_page(at)
    (table,) = [d.value for d in at.dataframe if "model" in d.value.columns]
    ours = table[table["model"] == "yours: ALiBi"].iloc[0]
    (result,) = at.session_state["_workshop_results"]
    metrics = json.loads((Path(result["folder"]) / "metrics.json").read_text())
    assert ours["1×"] == metrics["eval"]["nonoverlapping_bpb"]["256"] and ours["16×"] == metrics["eval"]["nonoverlapping_bpb"]["4096"]
    # against each baseline's training seeds: inside their range or past it, read from quick_runs.json here
    (verdicts,) = [d.value for d in at.dataframe if "baseline" in d.value.columns]
    runs = json.loads((Path(drawing_module().__file__).with_name("quick_runs.json")).read_text())
    assert len(verdicts) == 3 and set(verdicts["yours"]) == {"ALiBi"}
    for name in ("alibi", "rope", "nope"):
        row = verdicts[verdicts["baseline"] == f"{display_name(name)} (quick)"].iloc[0]
        for m, n in (("1", "256"), ("16", "4096")):
            values = [e["bits_per_byte"][m] for e in runs[name]["seeds"]]
            mine = metrics["eval"]["nonoverlapping_bpb"][n]
            assert row[f"{m}×"].startswith("within" if min(values) <= mine <= max(values) else "outside") or len(values) == 1
    at.switch_page("views/extrapolation.py")
    shown(at)
    assert "yours: ALiBi" in at.multiselect(key="w_models").options
    for lab in ("kv_cache", "retrieval", "generation", "compare"):  # every lab's picker lists it, for this session
        at.switch_page(f"views/{lab}.py")
        shown(at)
        pickers = [w.options for w in list(at.multiselect) + list(at.selectbox)]
        assert any(any(str(o).startswith("yours: ALiBi") for o in options) for options in pickers), (lab, pickers)


def test_what_a_visitor_typed_is_quoted_never_rendered(tiny_models):
    """A string in a formula is refused, and the refusal quotes it with every Markdown character escaped: no image, no
    link, no emphasis comes from the text."""
    at = workshop_page(tiny_models)
    shown(at.text_input(key="w_formula").set_value("'![x](/x.png)' + __import__"))
    (box,) = at.error
    assert "Only numbers are allowed as constants" in box.value
    assert r"\!\[x\]\(/x\.png\)" in box.value and "![x](" not in box.value and at.button(key="w_train").disabled


# ------------------------------------------------------------------------------------------------
# What a visitor types on the Workshop page, and the labels its runs get, everywhere they are shown
# ------------------------------------------------------------------------------------------------
def test_an_initial_value_is_read_by_splitting_and_refused_past_40_characters(tiny_models):
    """A range was matched by a regular expression that backtracked for seconds on a long run of dots: the box
    holds 40 characters, and a longer value is refused with words before anything reads it."""
    from posviz.errors import ConfigError

    drawing = drawing_module()
    assert [drawing.parse_init(t, "a") for t in ("0:2", "0..2", "-1:1", "1e-3:2", "1.5", " 2 ")] == [
        [0.0, 2.0], [0.0, 2.0], [-1.0, 1.0], [0.001, 2.0], 1.5, 2.0]
    assert drawing.parse_floor("", "a") is None and drawing.parse_floor("0.01", "a") == 0.01
    with pytest.raises(ConfigError, match=r"write its initial value as a number \(1\.5\) or a range \(0:2\)"):
        drawing.parse_init("1" + "." * 38 + "x", "a")  # 40 characters: read, and refused
    for parse, what in ((drawing.parse_init, "initial value"), (drawing.parse_floor, "floor")):
        with pytest.raises(ConfigError, match=f"parameter a: its {what} has 30,002 characters; at most 40 are allowed"):
            parse("1" + "." * 30_000 + "x", "a")

    at = workshop_page(tiny_models, example="KERPLE-log")
    assert at.text_input(key="w_init_a").max_chars == at.text_input(key="w_floor_a").max_chars == 40
    shown(at.text_input(key="w_init_a").set_value("1" + "." * 30_000 + "x"))  # the box keeps its first 40
    assert len(at.text_input(key="w_init_a").value) == 40
    (box,) = at.error
    assert r"parameter a\: write its initial value as a number" in box.value and at.button(key="w_train").disabled


def test_the_pages_own_link_reopens_it_without_a_notice(tiny_models):
    """The page wrote init= and floor= empty for a formula without parameters, and its own link then warned
    "Ignored URL parameter init=''". It leaves them out, and an empty one names none."""
    def notices(at) -> list[str]:
        return [w.value for w in at.warning if "Ignored URL parameter" in w.value]

    at = workshop_page(tiny_models)  # ALiBi: no learned parameter
    link = {k: v for k, v in at.query_params.items()}
    assert "init" not in link and "floor" not in link, link
    assert not notices(workshop_page(tiny_models, **link))
    again = workshop_page(tiny_models, bias=ALIBI, init="", floor="")
    assert not notices(again) and again.text_input(key="w_formula").value == ALIBI

    # KERPLE with its floors cleared: the link names the inits and no floor, and reopens with none
    at = workshop_page(tiny_models, example="KERPLE-log")
    at.text_input(key="w_floor_a").set_value("")
    shown(at.text_input(key="w_floor_b").set_value(""))
    link = {k: v for k, v in at.query_params.items()}
    assert link["init"] == "a=0:2;b=0:1" and "floor" not in link, link
    again = workshop_page(tiny_models, **link)
    assert not notices(again)
    assert [again.text_input(key=f"w_{part}_{p}").value for part in ("init", "floor") for p in "ab"] == [
        "0:2", "0:1", "", ""]


def test_a_runs_label_holds_no_comma_bracket_or_markdown():
    """A label is a model's name in every lab: in the Extrapolation lab's link (models=, comma-separated) and in
    Markdown. It is the formula as its tree writes it back (a # comment gone), in a safe alphabet."""
    drawing = drawing_module()
    hostile = "max(-d,-9)#**yours** [x](//e.vil), <script>`_|~$\\"
    labels = {f: drawing.label_for(f, set()) for f in ("where(d < 64, 0, -inf)", KERPLE, hostile)}
    assert list(labels.values()) == ["where(d < 64; 0; -inf)", "-a(layer; h) · log(1 + …", "max(-d; -9)"]
    for label in labels.values():
        assert not set(label) & set(",[]*#`_|~$\\"), label
        assert drawing.lab_link_models(label).split(",") == ["alibi", "rope", "nope", f"yours: {label}"]
    assert drawing.label_for(ALIBI, set()) == "-2 ^ (-8 · (h + 1) / H)…"
    assert drawing.label_for(ALIBI, {"ALiBi", "ALiBi (2)"}, "ALiBi") == "ALiBi (3)"
    assert drawing.safe_label("a_b [x](y), **z** #1 `c`\n$d$ <i>") == "ab (x)(y); ^z^ 1 c d <i>"


def test_a_formula_with_a_comma_opens_in_the_extrapolation_lab(tiny_models, monkeypatch):
    """Trained on the page, a formula with a comma (max(-d, -9)) is one model in its link to the lab, and the lab
    opens with it picked."""
    from urllib.parse import parse_qs

    monkeypatch.setenv("POSVIZ_WORKSHOP_RECIPE", PAGE_RECIPE)
    at = workshop_page(tiny_models, in_menu=True, bias="max(-d, -9)")
    assert at.selectbox(key="w_example").value == "Your own"
    trained_on_the_page(at)
    (link,) = [e.proto for e in at.get("page_link") if e.proto.label == "Open in the Extrapolation lab"]
    models = parse_qs(link.query_string)["models"][0]
    assert models.split(",") == ["alibi", "rope", "nope", "yours: max(-d; -9)"]
    at.query_params = {"models": models}
    at.switch_page("views/extrapolation.py")
    shown(at)
    assert at.multiselect(key="w_models").value == ["alibi", "rope", "nope", "yours: max(-d; -9)"]


HOSTILE_LABEL = "**bold** [x](y) #h, <script>"  # as a label made before labels were safe (or a config.json) holds it


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    """A tiny trained formula whose config.json names it HOSTILE_LABEL, as the Workshop's trainer names its runs."""
    folder = tmp_path_factory.mktemp("hostile") / "run"
    train(tiny_recipe(), folder, progress=False)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "workshop": {"label": HOSTILE_LABEL}}))
    return folder


def test_every_lab_quotes_a_models_name_in_markdown(tiny_models, hostile_run):
    """A model's name goes into headings, captions, metric labels, expanders and message boxes as Markdown: every
    lab quotes it (views._page.plain), so no link, emphasis or tag comes from it. The label here was never made
    safe (``drawing.label_for``): what is tested is each lab's quoting."""
    import re

    from streamlit.testing.v1 import AppTest

    from conftest import ROOT
    from views._page import plain

    name = f"yours: {HOSTILE_LABEL}"
    at = AppTest.from_file(str(ROOT / "menu.py"), default_timeout=90)
    at.session_state["_workshop_results"] = [{"label": HOSTILE_LABEL, "folder": str(hostile_run), "formula": KERPLE,
                                              "scores": {}, "message": ""}]
    shown(at)
    # each lab with the model picked (a link cannot: its models= splits on the comma), and as little else as can be
    picks = {"extrapolation": ("w_models", [name]), "kv_cache": ("w_models", [name]), "retrieval": ("w_models", [name]),
             "generation": ("w_models", [name]), "compare": ("w_a", name)}
    quoted = {}
    for lab, (key, value) in picks.items():  # first opened on one shipped model (and 16 bytes to write): light
        at.query_params = {"models": "alibi", "n": "16"} if lab != "compare" else {"a": "alibi", "b": "nope", "L": "32"}
        at.switch_page(f"views/{lab}.py")
        shown(at)
        widget = at.multiselect(key=key) if key == "w_models" else at.selectbox(key=key)
        shown(widget.set_value(value))
        texts = [e.value for kind in ("markdown", "caption", "subheader", "header", "title", "error", "warning", "info",
                                      "success") for e in getattr(at, kind)] + [m.label for m in at.metric] + [
                     e.label for e in at.expander]
        for text in (re.sub(r"`[^`]*`", "", t) for t in texts):  # a code span shows its text as it is
            assert "[x](y)" not in text and "**bold**" not in text and "<script>" not in text, (lab, text)
        quoted[lab] = [t for t in texts if plain(name) in t]
    # the KV cache lab names a model in its progress bars only, gone once the numbers are in
    assert all(quoted[lab] for lab in ("extrapolation", "retrieval", "generation", "compare")), quoted
