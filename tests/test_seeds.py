"""Training seeds (#59): ``python -m posviz.train --seed S`` changes the initial weights and the data order and
nothing else of the recipe, and ``posviz.training.seeds`` keeps a seed's scores beside the checkpoint, measured as
the shipped run's are."""
from __future__ import annotations

import contextlib
import json
import shutil

import pytest
from safetensors.torch import load_file

from posviz.errors import PosvizError
from posviz.training import seeds
from posviz.training.data import load_corpus
from posviz.training.evaluate import evaluate_checkpoint
from posviz.training.command_line import main as train_main

RECIPE = ["tokens=4096", "n_embd=32", "n_layer=1", "train_length=32", "batch_size=4", "eval_bytes=4096",
          "log_every=8", "checkpoint_every=8", "precision=fp32"]


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    """The 'shipped' run (the recipe's own seed, in a models/ folder) and the same recipe with --seed 7."""
    where = tmp_path_factory.mktemp("seeds")
    shipped = where / "models" / "alibi"
    with contextlib.chdir(where):  # the command line, in this process: runs/ is the working folder's
        train_main(["--method", "alibi", "--out", str(shipped), "--set", *RECIPE])
        train_main(["--method", "alibi", "--seed", "7", "--set", *RECIPE])
    return where, shipped, where / "runs" / "seeds" / "alibi-seed7"


def test_a_seed_changes_the_weights_and_the_data_order_and_nothing_else(two_seeds):
    where, shipped, seeded = two_seeds
    a, b = (json.loads((f / "config.json").read_text()) for f in (shipped, seeded))
    assert (a["train"]["seed"], b["train"]["seed"]) == (1337, 7)  # recorded, in the seed's own folder under runs/
    assert seeds.recipe_differences(b, a) == [] and {k for k in a["train"] if a["train"][k] != b["train"][k]} == {"seed"}
    wa, wb = (load_file(str(f / "model.safetensors")) for f in (shipped, seeded))
    assert any((wa[k] != wb[k]).any() for k in wa)
    # another data order: the first logged step's loss differs (same recipe, other rows)
    ca, cb = (json.loads((f / "metrics.json").read_text())["train_curve"] for f in (shipped, seeded))
    assert ca[1]["train_bpb"] != cb[1]["train_bpb"]


def test_the_seed_is_given_once(tmp_path):
    with contextlib.chdir(tmp_path), pytest.raises(SystemExit, match="give the seed once"):
        train_main(["--method", "alibi", "--seed", "7", "--set", "seed=3", *RECIPE])
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_a_recorded_seed_is_scored_as_the_shipped_run_is(two_seeds):
    where, shipped, seeded = two_seeds
    corpus = load_corpus()
    data, validation = corpus.eval_stream(1 << 12), corpus.validation[:1 << 14]  # held-out bytes, few: a tiny model
    documents = corpus.eval_documents[:6]
    entry = seeds.record(seeded, shipped, data, validation, documents=documents)
    full = evaluate_checkpoint(seeded, data, validation=validation, progress=False, documents=documents)  # the shipped run's measure
    assert entry["seed"] == 7 and entry["eval"]["nonoverlapping_bpb"] == full["nonoverlapping_bpb"]
    # the sink block (the gate's headline is about sinks), as the shipped run's: its timing aside
    assert {k: v for k, v in entry["eval"]["sinks"].items() if k != "seconds"} == \
        {k: v for k, v in full["sinks"].items() if k != "seconds"}
    assert entry["eval"]["validation_split_bpb"] == full["validation_split_bpb"]
    assert entry["eval"]["retrieval"]["repeat"] == full["retrieval"]["repeat"]
    assert entry["copy_curve"] == json.loads((seeded / "metrics.json").read_text())["copy_curve"]
    records = seeds.seed_records(shipped)
    assert [(r["seed"], r["shipped"]) for r in records] == [(1337, True), (7, False)]
    assert json.loads((shipped / seeds.SEEDS_FILE).read_text())["seeds"][0]["seed"] == 7
    seeds.record(seeded, shipped, data, validation)  # again: replaced, not added
    assert len(seeds.read_seeds(shipped)) == 1


def test_a_run_of_another_recipe_or_the_same_seed_is_refused_in_words(two_seeds, tmp_path):
    where, shipped, seeded = two_seeds
    other = tmp_path / "other"
    shutil.copytree(seeded, other)
    config = json.loads((other / "config.json").read_text())
    config["train"]["lr"] = 1e-3
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(PosvizError, match="differs in train.lr"):
        seeds.record(other, shipped, b"x" * 4096, b"x" * 4096)
    with pytest.raises(PosvizError, match="own seed"):
        seeds.record(shipped, shipped, b"x" * 4096, b"x" * 4096)


def test_a_run_of_another_recipe_is_scored_beside_the_checkpoint_with_the_settings_that_differ(two_seeds, tmp_path):
    """``python -m posviz.evaluate_all --only NAME --other-recipe KEY RUN`` (DroPE at rope's learning rate): the run
    scored as the checkpoint is, at the checkpoint's stored lengths, with the settings in which the two differ."""
    from posviz.training.evaluate_all import other_recipe_block

    where, shipped, seeded = two_seeds
    checkpoint = tmp_path / "models" / "alibi"
    shutil.copytree(shipped, checkpoint)
    metrics = json.loads((checkpoint / "metrics.json").read_text())
    metrics["eval"] = {"nonoverlapping_bpb": {"32": 0.0, "64": 0.0}}  # the lengths it was scored at (values unread)
    (checkpoint / "metrics.json").write_text(json.dumps(metrics))
    run = tmp_path / "runs" / "alibi-lr"
    with contextlib.chdir(where):
        train_main(["--method", "alibi", "--out", str(run), "--set", *RECIPE, "lr=0.0007"])
    corpus = load_corpus()
    data, validation = corpus.eval_stream(1 << 12), corpus.validation[:1 << 14]
    block = other_recipe_block(checkpoint, run, data, validation, "cpu")
    shipped_lr = json.loads((shipped / "config.json").read_text())["train"]["lr"]
    assert block["recipe"] == {"train": {"lr": 0.0007}} and block["checkpoint_recipe"] == {"train": {"lr": shipped_lr}}
    full = evaluate_checkpoint(run, data, validation=validation, progress=False)
    assert block["nonoverlapping_bpb"] == {n: full["nonoverlapping_bpb"][n] for n in ("32", "64")}
    assert block["retrieval"]["repeat"] == full["retrieval"]["repeat"]
    assert block["final_train_bpb"] == json.loads((run / "metrics.json").read_text())["final_train_bpb"]
    with pytest.raises(SystemExit, match="record another seed"):  # the same recipe: a seed, not another recipe
        other_recipe_block(checkpoint, seeded, data, validation, "cpu")


# rope's options as a run of today writes them out (runs/seeds/rope-seed1/config.json, #59's first full-recipe seed)
ROPE_WRITTEN_OUT = {"base": 10000.0, "rotary_fraction": 1.0, "scaling": "none", "factor": 1.0, "original_length": 32,
                    "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "long_factor": None, "short_factor": None, "remap": "none",
                    "remap_options": None}


def test_a_checkpoint_from_before_options_were_pinned_is_the_recipe_its_options_build(two_seeds):
    """rope and the other early checkpoints store ``"position_options": {}`` (they were trained before options were
    written out) and build the code's defaults; a new seed's run writes those defaults out. The same recipe; an
    option that differs from what ``{}`` builds is another one, named."""
    _, shipped, seeded = two_seeds
    run, old = (json.loads((f / "config.json").read_text()) for f in (seeded, shipped))
    for config in (run, old):
        config["model"]["position"] = "rope"
    run["model"]["position_options"], old["model"]["position_options"] = dict(ROPE_WRITTEN_OUT), {}
    assert seeds.recipe_differences(run, old) == []
    run["model"]["position_options"]["base"] = 500.0
    assert seeds.recipe_differences(run, old) == ["model.position_options"]
