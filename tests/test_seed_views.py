"""Training seeds where a difference is shown (#59): the Extrapolation lab draws a curve's range over its seeds as
a band (a toggle kept in the link), from the seeds.json beside the checkpoint; one run alone draws none."""
from __future__ import annotations

import json

import pytest

from posviz.models.checkpoint_files import read_metrics
from posviz.models.interface import open_model
from posviz.training.seeds import SEEDS_FILE, write_seeds
from test_pages_explore import models_copy
from test_pages_labs import chart_frames, page, run


@pytest.fixture()
def alibi_seeds(tiny_models_dir, tmp_path, monkeypatch):
    """The tiny models with two more seeds of alibi recorded: its stored curve moved up and down by a little."""
    folder = models_copy(tiny_models_dir, tmp_path / "models")
    own = read_metrics(folder / "alibi")["eval"]["nonoverlapping_bpb"]
    entries = [{"seed": s, "eval": {"nonoverlapping_bpb": {n: None if v is None else v + shift for n, v in own.items()}}}
               for s, shift in ((1, 0.25), (2, -0.125))]
    write_seeds(folder / "alibi", entries)
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(folder))
    return folder, own


def band_of(at):
    frames = [f for f in chart_frames(at) if {"lowest", "highest", "seeds"} <= set(f.columns)]
    return frames[0] if frames else None


def test_the_extrapolation_lab_draws_each_curves_seed_range(alibi_seeds):
    folder, own = alibi_seeds
    at = run(page("extrapolation", models="alibi,rope"))
    band = band_of(at)
    assert band is not None and set(band["model"]) == {"alibi"}  # rope: one run, no band
    for row in band.itertuples():
        stored = own[str(row.length)]
        assert (row.lowest, row.highest, row.seeds) == pytest.approx((stored - 0.125, stored + 0.25, 3))
    assert sorted(band["length"]) == sorted(int(n) for n, v in own.items() if v is not None)
    assert any("Training seeds: ALiBi 3" in c.value for c in at.caption)
    at.toggle(key="w_seeds").set_value(False)
    run(at)
    assert band_of(at) is None or band_of(at).empty
    assert at.query_params["seeds"] == "off"


def test_a_damaged_seeds_record_draws_no_band_and_the_lab_runs(alibi_seeds):
    folder, _ = alibi_seeds
    (folder / "alibi" / SEEDS_FILE).write_text("{not json")
    at = run(page("extrapolation", models="alibi,rope"))
    assert band_of(at) is None and not at.error
    assert open_model(folder / "alibi", device="cpu").stored_seeds() == []
    (folder / "alibi" / SEEDS_FILE).write_text(json.dumps({"seeds": [{"seed": 1}]}))  # an entry without scores
    at = run(page("extrapolation", models="alibi,rope"))
    assert band_of(at) is None and not at.error


def test_the_scoreboard_shows_each_checkpoints_seed_range_beside_its_values(alibi_seeds):
    folder, own = alibi_seeds
    at = run(page("scoreboard"))
    table = at.dataframe[0].value.set_index("checkpoint")
    L = 32  # the tiny models' training length
    want = " · ".join(f"{m}×: {own[str(m * L)] - 0.125:.3f}–{own[str(m * L)] + 0.25:.3f}" for m in (1, 4, 16)
                      if own.get(str(m * L)) is not None) + " (3 seeds)"
    assert table.loc["ALiBi", "seeds"] == "3" and table.loc["RoPE", "seeds"] == "1"
    assert list(table.columns).index("seeds") == list(table.columns).index("bpb 16×") + 1
    ranges = at.dataframe[1].value  # each range whole, in a table of its own: only the checkpoints with seeds
    assert list(ranges["checkpoint"]) == ["ALiBi"] and ranges["training seeds"].iloc[0] == want
