"""``posviz_tools.report``: the tables of docs/results.md drawn from checkpoint folders (here the tiny test set)."""
from __future__ import annotations

import json
import shutil

from posviz.models.checkpoint_files import read_metrics, read_seeds
from posviz.positions import method_names
from posviz_tools import report


def test_every_table_has_a_row_per_pretrained_checkpoint(tiny_models_dir):
    tables = report.results_tables(tiny_models_dir)
    for title in ("quality", "extrapolation", "retrieval"):
        names = [line.split(" | ")[0].lstrip("| ") for line in tables[title].splitlines()[2:]]
        assert [n for n in names if "+" not in n] == method_names(), title
    assert tables["fine-tuning"] == ""  # none fine-tuned
    rows = {line.split(" | ")[0][2:]: line for line in tables["retrieval"].splitlines()[2:]}
    assert rows["learned"].count("cannot run") == 9  # its 32-byte table cannot hold two 64-byte chunks
    assert "cannot run" not in rows["alibi"]
    rope = next(line for line in tables["quality"].splitlines() if line.startswith("| rope |"))
    stored = read_metrics(tiny_models_dir / "rope")["val_bpb_at_train_length"]
    assert rope == f"| rope | — | {stored:.3f} |"  # the tiny set was not scored on the whole split


def test_copy_formation_reads_each_quarter_and_the_first_state_at_the_target(tiny_models_dir, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(tiny_models_dir, models)
    for name in method_names():  # a set trained before the check: no curves, no table
        metrics = read_metrics(models / name)
        (models / name / "metrics.json").write_text(json.dumps({**metrics, "copy_curve": []}))
    assert report.copy_formation_table(models) == ""
    metrics = read_metrics(models / "alibi")
    metrics["copy_curve"] = [{"step": s, "tokens": 1_000_000 * (s + 1), "ratio": r, "gain": r}
                             for s, r in enumerate([0.99, 0.9, 0.7, 0.55, 0.48, 0.5, 0.45, 0.4])]
    (models / "alibi" / "metrics.json").write_text(json.dumps(metrics))
    table = report.copy_formation_table(models).splitlines()
    assert table[0] == "| checkpoint | 2 M bytes | 4 M bytes | 6 M bytes | 8 M bytes | first ≤ 0.5 at |"
    assert table[2:] == ["| alibi | 0.90 | 0.55 | 0.50 | 0.40 | 5.0 M bytes |"]


def test_update_tables_replaces_each_table_by_its_header_and_names_the_ones_it_cannot_place():
    text = "intro\n\n| a | b |\n|---|---:|\n| x | 1.0 |\n| y | 2.0 |\n\nafter\n"
    new, missing = report.update_tables(text, {"ab": "| a | b |\n|---|---:|\n| x | 3.0 |",
                                               "cd": "| c | d |\n|---|---:|\n| z | 4.0 |", "empty": ""})
    assert new == "intro\n\n| a | b |\n|---|---:|\n| x | 3.0 |\n\nafter\n"
    assert missing == ["cd"]


def test_results_option_rewrites_the_tables_and_check_finds_a_stale_one(tiny_models, tmp_path, capsys):
    """``--results FILE`` rewrites every table of FILE in place; ``--check`` writes nothing and fails while
    a table there differs from the metrics (docs/results.md is held to them the same way)."""
    tables = {title: table for title, table in report.results_tables().items() if table}
    first_row = tables["quality"].splitlines()[2]
    stale = tables["quality"].replace(first_row, first_row.replace(" | ", " | 9", 1))
    results = tmp_path / "results.md"
    results.write_text("# Results\n\n" + "\n\nwhat it shows\n\n".join([stale, *list(tables.values())[1:]]) + "\n")
    before = results.read_text()
    assert report.main(["--check", "--results", str(results)]) == 1
    assert results.read_text() == before and not (tmp_path / "bpb_vs_length.svg").exists()
    assert "the quality table differs" in capsys.readouterr().out
    assert report.main(["--out", str(tmp_path / "bpb_vs_length.svg"), "--results", str(results)]) == 0
    assert results.read_text() == before.replace(stale, tables["quality"])
    assert (tmp_path / "bpb_vs_length.svg").read_text().startswith("<svg")
    assert report.main(["--check", "--results", str(results)]) == 0


def test_a_value_span_is_written_from_the_metrics_and_a_stale_one_is_found(tiny_models_dir, tmp_path, capsys):
    rope = read_metrics(tiny_models_dir / "rope")["val_bpb_at_train_length"]
    text = ("<!--v @count:pretrained|words--> checkpoints; rope <!--v rope:val_bpb_at_train_length|.3f-->9<!--/v-->, "
            "<!--v @count:shipped-->0<!--/v--> in all.")
    text = text.replace("|words-->", "|words-->x<!--/v-->", 1)
    filled, moved = report.fill_values(text, tiny_models_dir)
    n = len(method_names())
    assert filled == (f"<!--v @count:pretrained|words-->{report.WORDS[n]}<!--/v--> checkpoints; rope "
                      f"<!--v rope:val_bpb_at_train_length|.3f-->{rope:.3f}<!--/v-->, <!--v @count:shipped-->{n}<!--/v--> in all.")
    assert len(moved) == 3 and report.fill_values(filled, tiny_models_dir)[1] == []
    import pytest
    from posviz.errors import PosvizError
    with pytest.raises(PosvizError, match="no 'nothing'"):
        report.fill_values("<!--v rope:eval.nothing-->1<!--/v-->", tiny_models_dir)
    # a row of a list by one of its fields, and a list's largest number
    block = read_metrics(tiny_models_dir / "rope")["eval"]["retrieval"]
    gain = next(r["gain"] for r in block["repeat"] if r["gap"] == 0)
    assert report.value_of("rope:eval.retrieval.repeat.gap=0.gain|.2f", tiny_models_dir) == f"{gain:.2f}"
    best = max(v for row in block["induction"]["0"] for v in row)
    assert report.value_of("rope:eval.retrieval.induction.0.max|.3f", tiny_models_dir) == f"{best:.3f}"
    with pytest.raises(PosvizError, match="0 rows"):
        report.value_of("rope:eval.retrieval.repeat.gap=7.gain", tiny_models_dir)


def test_a_difference_says_whether_it_holds_across_training_seeds(tiny_models_dir, tmp_path):
    from posviz.training.seeds import write_seeds

    assert report.across_seeds([1.0, 1.1], [1.2, 1.3], "lower") == "lower in every seed (2 and 2)"
    assert report.across_seeds([1.3, 1.4, 1.5], [1.2, 1.25], "lower") == "higher in every seed (3 and 2): not as read"
    assert report.across_seeds([1.0, 1.25], [1.2, 1.3], "lower") == \
        "within one training's spread (2 and 2 seeds; lower in 3 of 4 pairs)"
    assert report.across_seeds([1.0, 1.25], [1.2, 1.3], "higher") == \
        "within one training's spread (2 and 2 seeds; higher in 1 of 4 pairs)"
    # no verdict of its own: the more common way; a tie counts neither way
    assert report.across_seeds([1.2, 1.4, 1.5], [1.2, 1.3], "within the noise") == \
        "within one training's spread (3 and 2 seeds; higher in 4 of 6 pairs)"
    assert report.across_seeds([1.0], [1.2], "lower") == "one run each"
    assert report.across_seeds([1.0, 1.1], [1.2], "lower") == "one run of one of them"

    models = tmp_path / "models"
    shutil.copytree(tiny_models_dir, models)
    assert report.seeds_table(models) == ""  # one run each: no table
    own = read_metrics(models / "alibi")
    table = own["eval"]["nonoverlapping_bpb"]
    write_seeds(models / "alibi", [{"seed": s, "eval": {"nonoverlapping_bpb": {n: v + d for n, v in table.items() if v},
                                                         "effective_length": {"as_trained": {"multiple": 2}}},
                                    "copy_curve": [{"ratio": 0.5 + d}]} for s, d in ((1, 0.5), (2, -0.25))])
    (row,) = report.seeds_table(models).splitlines()[2:]
    one = table["32"]
    mean = (one + (one + 0.5) + (one - 0.25)) / 3
    cells = row.split(" | ")
    assert cells[0] == "| alibi" and cells[1] == "3" and cells[2] == f"{mean:.3f} ({one - 0.25:.3f}–{one + 0.5:.3f})"
    ratios = [r["ratio"] for r in own["copy_curve"][-1:]] + [1.0, 0.25]
    assert cells[5] == f"{sum(ratios) / len(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
    # each seed's first point at or below the copy target: the tiny run's own (tokens read from its curve), never for
    # the ratio of 1.0, and seed 2's 0.25 without a token count
    own_first = next((p for p in own["copy_curve"] if p["ratio"] <= 0.5), None)
    assert cells[6] == ("not reached" if own_first is None else f"{own_first['tokens'] / 1e6:.1f}") + ", not reached, ?"
    assert cells[7].endswith(", 2×, 2×")
    # no sink block in these seeds: no spread over the one run that has one
    assert cells[8:] == ["—", "— |"]
    # seeds that keep their sink blocks: the mean share over attention heads and what StreamingLLM's sinks save
    # (a recurrent layer's None left out of the mean)
    records = [own] + read_seeds(models / "alibi")
    for record, saves in zip(records, (0.1, 0.2, 0.4)):
        record["eval"]["sinks"] = {"first_byte_share": [None, [0.01, 0.03]], "streaming": {"sinks_save_bpb": saves}}
    (models / "alibi" / "metrics.json").write_text(json.dumps(records[0]))
    write_seeds(models / "alibi", records[1:])
    cells = report.seeds_table(models).splitlines()[2].split(" | ")
    assert cells[8:] == ["2.0% (2.0–2.0%)", f"{0.7 / 3:.3f} (0.100–0.400) |"]
