"""Stored results of published models past their context (issue #57): ``posviz_tools.measure_published`` measures
a tiny rotary family plain, under YaRN and under remaps, and its effective length, each entry written as soon as it
is measured and skipped when run again; the scoreboard lists a deployer's model from that file and says "not
measured" where it has none; docs/published_models.md's table is what ``posviz_tools.published_table`` writes."""
from __future__ import annotations

import json

import pytest

from posviz.labs import scoreboard
from posviz.labs.published_results import read_results, result_file
from posviz.models.interface import open_model
from posviz.training.evaluate import published_eval_table
from posviz_tools import measure_published, published_table


@pytest.fixture()
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("POSVIZ_PUBLISHED_RESULTS", str(tmp_path / "published"))
    return tmp_path / "published"


def test_a_measurement_is_stored_entry_by_entry_and_read_by_the_scoreboard(results, hf_family_dir, corpus, monkeypatch):
    folder = str(hf_family_dir["qwen2"])
    assert measure_published.main(["--model", folder, "--multiples", "1", "2", "--remaps", "self_extend", "dca",
                                   "--effective", "as_trained", "--trials", "1", "--threads", "1"]) == 0
    record = read_results(folder)
    assert result_file(folder) == results / "qwen2.json" and record["train_length"] == 64 and record["unit"] == "token"
    ev = record["eval"]
    model = open_model(folder, None, "cpu")
    ids = model.encode(corpus.eval_stream(8 * 129).tobytes())[:129]
    assert record["eval_ids"] == 129
    assert ev["nonoverlapping_bpb"] == published_eval_table(model, ids, [64, 128], progress=False)
    dca = open_model(folder, {"remap": "dca", "factor": 2.0}, "cpu")
    assert ev["rope_remaps"]["dca"]["nonoverlapping_bpb"]["128"] == published_eval_table(dca, ids, [128], progress=False)["128"]
    assert ev["rope_remaps"]["dca"]["remap_options"]["128"] == dca.position_options["remap_options"]
    assert set(ev["rope_scalings"]) == {"yarn"} and set(ev["effective_length"]) == {"as_trained"}
    assert set(ev["effective_length"]["as_trained"]["rows"]) == {"1", "2"}
    assert set(record["seconds"]) == {"nonoverlapping_bpb", "rope_scalings.yarn", "rope_remaps.self_extend",
                                      "rope_remaps.dca", "effective_length.as_trained"}

    # run again: everything stored is skipped (nothing is measured), a new remap is added beside it
    monkeypatch.setattr("posviz.training.evaluate.published_eval_table",
                        lambda model, *a, **k: pytest.fail(f"measured {model.name} again") if "string" not in model.name
                        else {str(n): 1.5 for n in a[1]})
    measure_published.main(["--model", folder, "--multiples", "1", "2", "--remaps", "self_extend", "string",
                            "--effective", "as_trained"])
    again = read_results(folder)
    assert again["eval"]["rope_remaps"]["dca"] == ev["rope_remaps"]["dca"]
    assert again["eval"]["rope_remaps"]["string"]["nonoverlapping_bpb"] == {"64": 1.5, "128": 1.5}

    # the scoreboard: the plain model and each variant stored, at 1x from the file, "not measured" past it
    rows = scoreboard.published_rows([folder, str(hf_family_dir["llama3"])], open_model)
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == {folder, f"{folder}+yarn", f"{folder}+self_extend", f"{folder}+dca", f"{folder}+string",
                          str(hf_family_dir["llama3"])}
    plain = scoreboard.shown_rows([by_id[folder]])[0]
    assert plain["bpb 1×"] == f"{ev['nonoverlapping_bpb']['64']:.3f}" and plain["bpb 4×"] == "not measured"
    assert plain["checkpoint"] == "qwen2" and plain["kind"] == "published"
    assert f"2×: {ev['nonoverlapping_bpb']['128']:.3f}" in plain["why"]
    assert by_id[f"{folder}+dca"]["checkpoint"] == "qwen2 + dual chunk attention"
    assert by_id[f"{folder}+dca"]["effective length"] == "not measured"
    nothing = scoreboard.shown_rows([by_id[str(hf_family_dir["llama3"])]])[0]
    assert {nothing[f"bpb {m}×"] for m in scoreboard.MULTIPLES} == {"not measured"}
    assert "None" not in json.dumps(scoreboard.shown_rows(rows)) and "nothing stored" in nothing["why"]

    # the docs' table of this record, every cell read from it
    text = published_table.model_table(again)
    assert f"| plain | {ev['nonoverlapping_bpb']['64']:.3f} | {ev['nonoverlapping_bpb']['128']:.3f} |" in text
    assert "| dual chunk attention |" in text and "Effective context length, plain:" in text


def test_the_docs_table_is_what_the_stored_results_give():
    assert published_table.main(["--check"]) == 0, "run python -m posviz_tools.published_table"
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in published_table.DOC.read_text()
