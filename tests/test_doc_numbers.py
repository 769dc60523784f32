"""Every measured number in docs/results.md and the README has a source (issue #44): a value span written from the
shipped metrics, a table a tool writes, or the command that measures it beside it. The scanner is tested on text
made to fail it, and each kind of value span against the files it reads, computed here by hand."""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from posviz_tools.doc_numbers import unsourced
from posviz_tools.report import pretrained, results_tables, value_of

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


def metrics(name: str) -> dict:
    return json.loads((MODELS / name / "metrics.json").read_text())


def config(name: str) -> dict:
    return json.loads((MODELS / name / "config.json").read_text())


@pytest.mark.parametrize("doc", ["docs/results.md", "README.md"])
def test_every_measured_number_in_the_docs_has_a_source(doc):
    found = unsourced((ROOT / doc).read_text())
    assert not found, (f"{doc}: measured numbers with no value span and no command beside them "
                       f"(python -m posviz_tools.doc_numbers): {found}")


@pytest.mark.parametrize("text, flagged", [
    ("The model scores 1.234 bits per byte at 4×.", ["1.234"]),
    ("It leaves 26 % of the weight unspent.", ["26 %"]),
    ("Training took 62 min on the CPU.", ["62 min"]),
    ("Eighteen checkpoints ship, and 21 checkpoints in all.", ["Eighteen checkpoints", "21 checkpoints"]),
    ("- a list item: 0.45 to 0.09\n  at 1,024 bytes", ["0.45", "0.09"]),
    ("The model scores <!--v rope:eval.x|.3f-->1.234<!--/v--> at 4×.", []),
    ("It scores 1.234 (`python -m posviz.evaluate --checkpoint models/rope`).", []),
    ("Python 3.11, GPT-2 and Llama 3 in 2024, at 4× and 256 bytes, seed 1337.", []),
    ("p = 0.25 and c = 0.1; the goal is ≤ 0.5 and < 1 s; a 95 % interval.", []),
    ("| rope | 1.234 | 2.345 |", []),  # tables are compared whole by the tools that write them
    ("```\nlosses 1.234\n```", []),
])
def test_the_scanner_flags_a_bare_measured_number_and_nothing_else(text, flagged):
    assert [number for _, number, _ in unsourced(text)] == flagged


def test_each_kind_of_value_span_reads_what_its_files_say():
    bpb = {n: metrics(n)["eval"]["nonoverlapping_bpb"] for n in ("fire", "rope", "p_rope")}
    assert value_of("@ratio:fire:eval.nonoverlapping_bpb.4096 / fire:eval.nonoverlapping_bpb.256|.3f", MODELS) \
        == f"{bpb['fire']['4096'] / bpb['fire']['256']:.3f}"
    assert value_of("@diff:p_rope:eval.nonoverlapping_bpb.256 - rope:eval.nonoverlapping_bpb.256|.3f", MODELS) \
        == f"{bpb['p_rope']['256'] - bpb['rope']['256']:.3f}"
    gains = [next(r["gain"] for r in metrics(n)["eval"]["retrieval"]["repeat"] if r["gap"] == 256)
             for n in ("sinusoidal", "nope", "rope")]
    assert value_of("@range:sinusoidal,nope,rope:eval.retrieval.repeat.gap=256.gain|.3f", MODELS) \
        == f"{min(gains):.3f}–{max(gains):.3f}"
    relative = ["shaw", "nezha", "t5", "alibi"]
    assert value_of(f"@median:{','.join(relative)}:eval.validation_split_bpb|.4f", MODELS) \
        == f"{statistics.median(metrics(n)['eval']['validation_split_bpb'] for n in relative):.4f}"
    minutes = [config(n)["trained_on"]["seconds"] / 60 for n in ("irope", "local_global", "rope_sinks")]
    assert value_of("@range:irope,local_global,rope_sinks:config.trained_on.seconds/60|.1f", MODELS) \
        == f"{min(minutes):.1f}–{max(minutes):.1f}"
    left = metrics("rope_sinks")["eval"]["sinks"]["weight_left_by_layer"]
    assert value_of("rope_sinks:eval.sinks.weight_left_by_layer.mean|pct1", MODELS) == f"{100 * sum(left) / len(left):.1f} %"
    params = [p for n in pretrained(MODELS) if n not in ("fox", "cope") and (p := metrics(n).get("parameters"))]
    assert value_of("@range:pretrained!fox,cope:parameters/1e6|.3f", MODELS) \
        == f"{min(params) / 1e6:.3f}–{max(params) / 1e6:.3f}"


def test_a_table_span_reads_the_cell_of_the_table_the_report_writes():
    table = results_tables(MODELS, only="copy formation")["copy formation"]
    row = next(line for line in table.splitlines() if line.startswith("| alibi |"))
    cell = [c.strip() for c in row.strip("|").split("|")][-1]
    assert value_of("@table:copy formation;alibi;first ≤ 0.5 at", MODELS) == cell
    assert value_of("@table:copy formation;alibi;first ≤ 0.5 at|num", MODELS) == re.match(r"[\d.]+", cell).group(0)


def test_the_readme_list_of_published_models_is_the_benchmark_run_that_measured_it():
    """The README's table of proposed models (size, one forward at its context) is BENCHMARKS.md's rows, as
    ``make bench-published`` wrote them."""
    readme = (ROOT / "README.md").read_text()
    bench = (ROOT / "BENCHMARKS.md").read_text()
    measured = {}
    for line in bench.split("### The README's default list", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and "/" in cells[0]:
            measured[cells[0]] = {"method": cells[1], "context": cells[2], "weights": cells[4], "forward": cells[6]}
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in readme.splitlines()
            if line.startswith("| ") and "/" in line.split("|")[1]]
    assert len(rows) >= 5 and measured
    for model, method, context, weights, forward in rows:
        assert model in measured, f"the README lists {model}, which BENCHMARKS.md did not measure"
        assert {"method": method, "context": context, "weights": weights, "forward": forward} == measured[model], model
    assert "make bench-published" in readme
