"""posviz.explore.home: the method table and the headline chart's rows, from metrics.json dicts."""
from __future__ import annotations

import pytest

from maths_support import fake_metrics
from posviz.explore import home
from posviz.positions import POSITION_METHODS, method_names


def test_method_rows_from_registry_and_metrics():
    metrics = {"alibi": fake_metrics(2.0, 1.98), "rope": fake_metrics(2.0, 4.5), "learned": fake_metrics(2.1, None),
               "t5": fake_metrics(2.0, 2.3)}
    rows = {r["method"]: r for r in home.method_rows(metrics)}
    assert list(rows) == method_names()
    for name, row in rows.items():
        cls = POSITION_METHODS[name]
        assert row["fixed / learned"] == ("learned" if cls.learned else "fixed")
        assert row["paper"] == cls.paper
        assert row["KV-cacheable"].startswith("yes")
    assert rows["alibi"]["extrapolates"] == "yes" and rows["alibi"]["bits/byte @ 16×"] == pytest.approx(1.98)
    assert rows["rope"]["extrapolates"] == "no" and rows["t5"]["extrapolates"] == "partly"
    assert home.extrapolation(metrics["rope"])["reason"] == "+2.50 bits/byte at 16x"
    short = fake_metrics(2.0, 2.04)  # evaluated up to 8x only: bpb 2.03 there
    del short["eval"]["nonoverlapping_bpb"]["4096"]
    row = {r["method"]: r for r in home.method_rows({"alibi": short})}["alibi"]
    assert row["extrapolates"] == "yes (+0.03 bits/byte at 8x)"
    assert rows["learned"]["extrapolates"] == "no"
    assert home.extrapolation(metrics["learned"])["reason"] == "cannot run past 256 positions"
    assert rows["learned"]["KV-cacheable"] == "yes (≤ 256)" and rows["rope"]["KV-cacheable"] == "yes"
    assert rows["nope"]["extrapolates"].startswith("unknown")


def test_bpb_vs_length_rows():
    metrics = {"alibi": fake_metrics(2.0, 1.98), "learned": fake_metrics(2.1, None)}
    cols = home.bpb_vs_length_rows(metrics)
    assert list(cols["checkpoint"]).count("learned") == 1 and list(cols["checkpoint"]).count("alibi") == 5
    assert set(cols["multiple"]) == {1, 2, 4, 8, 16}
