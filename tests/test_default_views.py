"""Every live lab's default view on the shipped checkpoints shows the numbers it showed before the
labs ran through the model interface: bits per byte, the cache check, the context-extension curves,
the retrieval ratios, the generated text at its seed and the compare deltas, to 1e-6.

The record (tests/data/default_views.json) was made by ``python tests/default_views.py`` on the code
before the refactor; see that module for what is read off each page.
"""
from __future__ import annotations

import json
import math

import pytest
from default_views import LABS, RECORD, default_text_sha, export_fingerprint, fingerprint

TOLERANCE = 1e-6


SHOWN_ROUNDING = 0.0100001  # a tooltip's 2 decimals


def differences(expected, got, where: str = "") -> list[str]:
    """Where two fingerprints differ: numbers by more than 1e-6 (relative to the larger, or absolute
    below 1), anything else at all."""
    if isinstance(expected, dict) and isinstance(got, dict):
        out = [f"{where}/{k}: {'missing' if k not in got else 'new'}" for k in set(expected) ^ set(got)]
        for k in expected.keys() & got.keys():
            out += differences(expected[k], got[k], f"{where}/{k}")
        return out
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: {len(expected)} items recorded, {len(got)} shown"]
        return [d for i, (e, g) in enumerate(zip(expected, got)) for d in differences(e, g, f"{where}[{i}]")]
    if isinstance(expected, float) or isinstance(got, float):
        if not isinstance(got, (int, float)) or math.isnan(expected) != math.isnan(got):
            return [f"{where}: {expected!r} recorded, {got!r} shown"]
        # a coloured text's tooltips are rounded to 0.01: one step of that rounding, no more
        tolerance = SHOWN_ROUNDING if "/values[" in where else TOLERANCE * max(1.0, abs(expected), abs(got))
        if not math.isnan(expected) and abs(expected - got) > tolerance:
            return [f"{where}: {expected!r} recorded, {got!r} shown"]
        return []
    return [] if expected == got else [f"{where}: {expected!r} recorded, {got!r} shown"]


@pytest.fixture(scope="module")
def recorded() -> dict:
    record = json.loads(RECORD.read_text())
    assert record["text_sha"] == default_text_sha(), (
        f"The record was made on Python {record['python']}'s standard library, whose first held-out document "
        "differs from this interpreter's: the numbers cannot be compared.")
    return record


@pytest.mark.parametrize("page", LABS)
def test_default_view_shows_the_recorded_numbers(page, recorded):
    shown = fingerprint(page)
    assert shown["charts"] or shown["tables"] or shown["code"], f"{page}: nothing drawn"
    diff = differences(recorded["pages"][page], shown)
    assert not diff, f"{page}: {len(diff)} differences, e.g. {diff[:8]}"


@pytest.mark.parametrize("page", LABS)
def test_the_exports_opened_by_a_link_show_the_recorded_numbers(page, recorded):
    """The same labs on the exports in models/hf, run as published models (transformers' forward)."""
    shown = export_fingerprint(page)
    assert shown["charts"] or shown["tables"] or shown["code"], f"{page}: nothing drawn"
    diff = differences(recorded["exports"][page], shown)
    assert not diff, f"{page} on the exports: {len(diff)} differences, e.g. {diff[:8]}"


@pytest.mark.parametrize("page", LABS)
def test_a_default_view_read_back_from_the_result_files_is_the_same(page, recorded, tmp_path, monkeypatch):
    """What a restarted server shows from the files its warm-up wrote (posviz.result_files): every result
    the page stored, written to disk; the page run again on a store that holds nothing in memory reads them
    all back, computes nothing, and shows the very same fingerprint, which is the recorded one."""
    import views._serving as serving
    from posviz.result_files import ResultFiles
    from posviz.serving import SharedResults

    computing = SharedResults()
    monkeypatch.setattr(serving, "shared_results", lambda: computing)
    computed = fingerprint(page)
    files = ResultFiles(tmp_path, edition_name="test")
    for key, value in computing.items():
        assert files.put(key, value), f"{key[0]}: {files.unstorable}"
    reading = SharedResults(files=ResultFiles(tmp_path, edition_name="test"))
    monkeypatch.setattr(serving, "shared_results", lambda: reading)
    shown = fingerprint(page)
    assert reading.misses == 0 and reading.files.reads > 0  # nothing computed: every result read back
    assert not differences(computed, shown)
    diff = differences(recorded["pages"][page], shown)
    assert not diff, f"{page}: {len(diff)} differences, e.g. {diff[:8]}"


def test_the_comparison_catches_a_changed_number():
    base = {"charts": [{"bits": {"sum": 12.5, "n": 3}}], "code": ["def f"]}
    assert not differences(base, json.loads(json.dumps(base)))
    assert differences(base, {"charts": [{"bits": {"sum": 12.5 + 1e-4, "n": 3}}], "code": ["def f"]})
    assert differences(base, {"charts": [{"bits": {"sum": 12.5, "n": 3}}], "code": ["def g"]})
    assert differences(base, {"charts": [], "code": ["def f"]})
    coloured = {"html": [{"markup": "ab12", "values": [float("nan"), 1.25, 3.5]}]}
    assert not differences(coloured, {"html": [{"markup": "ab12", "values": [float("nan"), 1.26, 3.5]}]})  # one rounding step
    assert differences(coloured, {"html": [{"markup": "ab12", "values": [float("nan"), 1.27, 3.5]}]})
    assert differences(coloured, {"html": [{"markup": "ab13", "values": [float("nan"), 1.25, 3.5]}]})
