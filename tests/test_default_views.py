"""Every live lab's default view on the shipped checkpoints shows the recorded numbers: bits per byte, the
cache check, the context-extension curves, the retrieval ratios, the generated text at its seed and the compare
deltas, one entry per page, chart, model row and column, each at the precision it is computed in: the labs
compute in float32, so a number holds to 1e-5 of its size (a few float32 roundings of its sum: another CPU's
kernels add in another order), and a coloured text by its characters and its tooltips' numbers, not by its markup.

The record (tests/data/default_views.json) holds each entry as first recorded; every later change to an entry
is in tests/data/default_views_changes.json with the reason it moved. ``python tests/default_views.py`` adds
new entries and writes changed ones only with ``--why``; see that module for what is read off each page.
"""
from __future__ import annotations

import json
import math

import pytest
import default_views
from default_views import LABS, RECORD, default_text_sha, entries, expected_entries, export_fingerprint, fingerprint, review

# float32 carries 24 bits (6e-8 relative): a sum of a few thousand float32 terms added in another order (another
# CPU's kernels, AVX-512 against AVX2) moves by a few 1e-7 to 1e-6 of its size. 1e-5 is ten of those and still
# a hundred times finer than the 0.001 a page shows.
TOLERANCE = 1e-5
SUMMED = ("sum", "weighted", "abs")  # a column summary's sums: their rounding scales with the summed magnitudes


SHOWN_ROUNDING = 0.0100001  # a tooltip's 2 decimals


def differences(expected, got, where: str = "", scale: float = 0.0) -> list[str]:
    """Where two fingerprints differ: numbers by more than ``TOLERANCE`` of their size (of the summed magnitudes
    for a column's sums, where values of both signs cancel; absolute below 1), anything else at all."""
    if isinstance(expected, dict) and isinstance(got, dict):
        out = [f"{where}/{k}: {'missing' if k not in got else 'new'}" for k in set(expected) ^ set(got)]
        # a column summary: its sums are as exact as the sum of magnitudes ("abs"), twice that for "weighted"
        magnitude = max((abs(d.get("abs", 0.0)) for d in (expected, got) if isinstance(d.get("abs"), float)), default=0.0)
        for k in expected.keys() & got.keys():
            out += differences(expected[k], got[k], f"{where}/{k}", 2.0 * magnitude if k in SUMMED else 0.0)
        return out
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: {len(expected)} items recorded, {len(got)} shown"]
        return [d for i, (e, g) in enumerate(zip(expected, got)) for d in differences(e, g, f"{where}[{i}]")]
    if isinstance(expected, float) or isinstance(got, float):
        if not isinstance(got, (int, float)) or math.isnan(expected) != math.isnan(got):
            return [f"{where}: {expected!r} recorded, {got!r} shown"]
        # a coloured text's tooltips are rounded to 0.01: one step of that rounding, no more
        tolerance = (SHOWN_ROUNDING if "/values[" in where
                     else TOLERANCE * max(1.0, abs(expected), abs(got), scale))
        if not math.isnan(expected) and abs(expected - got) > tolerance:
            return [f"{where}: {expected!r} recorded, {got!r} shown"]
        return []
    return [] if expected == got else [f"{where}: {expected!r} recorded, {got!r} shown"]


@pytest.fixture(autouse=True)
def as_recorded_threads():
    """The record was made with the torch threads `make test` gives a process on 2 cores (2): the pages name the
    thread count in their captions, and a sum split over another number of threads rounds its last digit
    differently. Under pytest-xdist each worker runs on one; these tests ask for the record's two."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def recorded() -> dict:
    record = json.loads(RECORD.read_text())
    assert record["text_sha"] == default_text_sha(), (
        f"The record was made on Python {record['python']}'s standard library, whose first held-out document "
        "differs from this interpreter's: the numbers cannot be compared.")
    return expected_entries()


def unexplained(recorded: dict, shown: dict, where: str) -> list[str]:
    """The recorded entries of ``where`` that the page no longer shows as recorded (new entries are fine)."""
    mine = {k: v for k, v in recorded.items() if k.startswith(where + "/")}
    _, changed = review(mine, shown, lambda a, b, k: differences(a, b, k))
    return [f"{k}: gone" if now is None else differences(was, now, k)[0] for k, (was, now) in sorted(changed.items())]


def assert_as_recorded(recorded: dict, fp: dict, where: str) -> None:
    assert fp["charts"] or fp["tables"] or fp["code"], f"{where}: nothing drawn"
    diff = unexplained(recorded, entries(fp, where), where)
    assert not diff, (f"{where}: {len(diff)} entries moved, e.g. {diff[:8]}. If meant, run `python tests/default_views.py "
                      "--why \"...\"` to record them with the reason.")


@pytest.mark.parametrize("page", LABS)
def test_the_exports_opened_by_a_link_show_the_recorded_numbers(page, recorded):
    """The same labs on the exports in models/hf, run as published models (transformers' forward)."""
    assert_as_recorded(recorded, export_fingerprint(page), f"exports/{page}")


@pytest.mark.parametrize("page", LABS)
def test_default_view_shows_the_recorded_numbers_and_the_same_read_back_from_the_result_files(page, recorded, tmp_path,
                                                                                               monkeypatch):
    """The lab's default view, computed on a store that holds nothing (no other test's result), shows the recorded
    numbers; then what a restarted server shows from the files its warm-up wrote (posviz.result_files): every
    result the page stored, written to disk; the page run again on a store that holds nothing in memory reads them
    all back, computes nothing, and shows the very same fingerprint. (Two tests computed the same view apart, one
    of them on whatever the process's store held: 6-8 s a lab.)"""
    import views._serving as serving
    from posviz.result_files import ResultFiles
    from posviz.serving import SharedResults

    computing = SharedResults()
    monkeypatch.setattr(serving, "shared_results", lambda: computing)
    computed = fingerprint(page)
    assert_as_recorded(recorded, computed, f"pages/{page}")
    files = ResultFiles(tmp_path, edition_name="test")
    for key, value in computing.items():
        assert files.put(key, value), f"{key[0]}: {files.unstorable}"
    reading = SharedResults(files=ResultFiles(tmp_path, edition_name="test"))
    monkeypatch.setattr(serving, "shared_results", lambda: reading)
    shown = fingerprint(page)
    assert reading.misses == 0 and reading.files.reads > 0  # nothing computed: every result read back
    assert not differences(computed, shown)
    assert_as_recorded(recorded, shown, f"pages/{page}")


def test_a_changed_entry_needs_a_reason_and_a_new_one_does_not(tmp_path, monkeypatch, capsys):
    """The recorder adds a new entry freely, refuses a changed one without --why, and with it keeps the new value
    and the reason apart from the record, which the pages are then held to."""
    page = {"charts": [{"columns": "bits,model", "rows": {"model=rope": {"bits": {"sum": 1.0}},
                                                          "model=alibi": {"bits": {"sum": 2.0}}}}],
            "tables": [], "metrics": {}, "code": ["x"], "html": [], "captions": [], "errors": []}
    monkeypatch.setattr(default_views, "RECORD", tmp_path / "record.json")
    monkeypatch.setattr(default_views, "CHANGES", tmp_path / "changes.json")
    shown = {}
    monkeypatch.setattr(default_views, "shown_entries", lambda: dict(shown))
    shown.update(entries(page, "pages/x"))
    assert default_views.main([]) == 0  # a first record: every entry new
    key = "pages/x/chart[bits,model]#0/model=alibi/bits"
    assert default_views.expected_entries()[key] == {"sum": 2.0}
    shown["pages/x/chart[bits,model]#0/model=fox/bits"] = {"sum": 3.0}  # a new model: added freely
    assert default_views.main([]) == 0 and "1 new entries, 0 changed" in capsys.readouterr().out
    shown[key] = {"sum": 2.5}  # alibi retrained
    assert unexplained(default_views.expected_entries(), shown, "pages/x") == [f"{key}/sum: 2.0 recorded, 2.5 shown"]
    assert default_views.main([]) == 1 and "changed: " + key in capsys.readouterr().out
    assert default_views.expected_entries()[key] == {"sum": 2.0}  # refused: nothing written
    assert default_views.main(["--why", "alibi retrained"]) == 0
    assert default_views.expected_entries()[key] == {"sum": 2.5}
    record = json.loads((tmp_path / "record.json").read_text())["entries"]
    assert record[key] == {"sum": 2.0}  # the record keeps the first value; the change and its reason are apart
    assert json.loads((tmp_path / "changes.json").read_text()) == [{"why": "alibi retrained", "entries": {key: {"sum": 2.5}}}]
    assert not unexplained(default_views.expected_entries(), shown, "pages/x")
    del shown[key]  # a vanished entry is a change too
    assert default_views.main([]) == 1


def test_every_recorded_change_says_why():
    changes = json.loads(default_views.CHANGES.read_text()) if default_views.CHANGES.is_file() else []
    record = json.loads(RECORD.read_text())["entries"]
    for change in changes:
        assert len(change["why"].split()) >= 5, change["why"]
        # a change moves entries that were recorded (new entries go into the record itself)
        assert change["entries"] and set(change["entries"]) <= set(record), set(change["entries"]) - set(record)


def test_the_comparison_catches_a_changed_number():
    base = {"charts": [{"bits": {"sum": 12.5, "n": 3}}], "code": ["def f"]}
    assert not differences(base, json.loads(json.dumps(base)))
    assert not differences(base, {"charts": [{"bits": {"sum": 12.5 * (1 + 3e-6), "n": 3}}], "code": ["def f"]})  # rounding
    assert differences(base, {"charts": [{"bits": {"sum": 12.5 * (1 + 1e-4), "n": 3}}], "code": ["def f"]})  # a real move
    assert differences(base, {"charts": [{"bits": {"sum": 12.5, "n": 3}}], "code": ["def g"]})
    assert differences(base, {"charts": [], "code": ["def f"]})
    # a column whose values cancel: its sum is held to the size of what was summed, not of the near-zero result
    delta = {"sum": 0.002, "abs": 40.0, "weighted": 0.003, "min": -1.0, "max": 1.0, "n": 80, "nan": 0}
    assert not differences(delta, {**delta, "sum": 0.002 + 1e-4})
    assert differences(delta, {**delta, "sum": 0.002 + 1e-2})
    assert differences(delta, {**delta, "min": -1.0 - 1e-3})
    coloured = {"html": [{"text": "ab12", "values": [float("nan"), 1.25, 3.5]}]}
    assert not differences(coloured, {"html": [{"text": "ab12", "values": [float("nan"), 1.26, 3.5]}]})  # one rounding step
    assert differences(coloured, {"html": [{"text": "ab12", "values": [float("nan"), 1.27, 3.5]}]})
    assert differences(coloured, {"html": [{"text": "ab13", "values": [float("nan"), 1.25, 3.5]}]})


def test_a_deliberately_moved_number_and_a_changed_label_fail_the_record(recorded):
    """On a real page: the Extrapolation lab's recorded entries, one number moved by 1e-4 of its size (ten times the
    tolerance) and one model renamed in a chart row, are both reported; the same entries untouched are not."""
    page = {k: v for k, v in recorded.items() if k.startswith("pages/extrapolation/")}
    key = next(k for k, v in page.items() if "/chart[" in k and "model=" in k and isinstance(v, dict)
               and isinstance(v.get("sum"), float) and abs(v["sum"]) > 1)
    assert not unexplained(page, dict(page), "pages/extrapolation")
    moved = {**page, key: {**page[key], "sum": page[key]["sum"] * (1 + 1e-4)}}
    assert unexplained(page, moved, "pages/extrapolation") == [
        f"{key}/sum: {page[key]['sum']!r} recorded, {moved[key]['sum']!r} shown"]
    name = key.split("model=")[1].split("/")[0]
    renamed = {k.replace(f"model={name}/", f"model={name}2/"): v for k, v in page.items()}
    assert any(line.endswith(": gone") and f"model={name}/" in line for line in unexplained(page, renamed, "pages/extrapolation"))
    text_key = next(k for k in page if "/html#" in k)
    relabelled = {**page, text_key: {**page[text_key], "text": "0" * 16}}
    assert unexplained(page, relabelled, "pages/extrapolation") == [
        f"{text_key}/text: {page[text_key]['text']!r} recorded, '0000000000000000' shown"]


def test_coloured_text_is_read_as_shown():
    from default_views import _html_summary, html_text

    body = ('<div style="x"><span style="background:#fff" title="not scored">&quot;</span><span title="1.85 bits">a'
            '</span><span style="border-left:3px solid #d00"></span><span title="2.00 bits"><br></span></div>')
    assert html_text(body) == '"a¦\n'
    recoloured = body.replace("#fff", "#fffffe")
    assert not differences(_html_summary(body), _html_summary(recoloured))  # a colour one step off: the same page
    assert differences(_html_summary(body), _html_summary(body.replace(">a<", ">b<")))
    assert _html_summary(body)["values"][1:] == [1.85, 2.0]
