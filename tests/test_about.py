"""posviz.explore.about: the per-checkpoint facts, the training recipe and the training curves."""
from __future__ import annotations

from maths_support import fake_metrics
from posviz.explore import about


def test_curves_checkpoint_rows_and_recipe():
    metrics = {"alibi": fake_metrics(2.0, 1.98), "learned": fake_metrics(2.1, None)}
    curves = about.train_curve_rows(metrics)
    assert list(curves["train_bpb"]) == [8.0, 4.0, 8.0, 4.0]
    configs = {"alibi": {"model": {"train_length": 256}, "trained_on": {"seconds": 600, "device": "cpu", "processor": "x86"}}}
    row = about.checkpoint_rows(configs, metrics)[0]
    assert row["training time (min)"] == 10.0 and row["device"] == "cpu · x86" and row["parameters"] == 123
    shown = about.shown_checkpoint_rows(about.checkpoint_rows({"alibi": {"model": {}}}, {"alibi": {}}))[0]  # nothing recorded
    assert shown["parameters"] == shown["training time (min)"] == about.MISSING and shown["checkpoint"] == "ALiBi"
    recipe = {r["setting"]: r["value"] for r in about.recipe_rows()}
    assert "None" not in recipe.values()
    assert "lr" in recipe and "method" not in recipe and int(recipe["steps"]) > 0
