"""AppTest tests of the explorer pages: Home, Sinusoidal & learned, RoPE, Attention biases, About.

Each test opens the real multipage app (menu.py), switches to the page, moves its widgets and checks the
numbers shown against the page's own module (posviz.explore.home, posviz.explore.sinusoidal_learned, posviz.explore.rope, ...)
or the checkpoints themselves. Charts are checked through the data Streamlit sends to the browser
(Arrow datasets inside the Vega-Lite element).
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from streamlit.testing.v1 import AppTest

from conftest import ROOT
from posviz.display import display_name, ids_by_name
from posviz.explore import about, attention_biases, home, rope, sinusoidal_learned
from posviz.models.checkpoint_files import load_checkpoint, read_metrics, shipped_checkpoints
from posviz.errors import PositionLimitError
from posviz.positions import OPENING_SET, POSITION_METHODS, method_names
from posviz.positions.rope_scaling import ROPE_SCALINGS

HOME, ABSOLUTE, ROPE, BIASES, ABOUT = ("views/home.py", "views/sinusoidal_learned.py", "views/rope.py",
                                       "views/attention_biases.py", "views/about.py")


ID_OF = {**{n: n for n in POSITION_METHODS}, **ids_by_name()}  # a method's display name (as pages show it) -> its id

# -- helpers -------------------------------------------------------------------------------------------
def open_page(page: str, **params) -> AppTest:
    """The app, switched to ``page``, run once with ``params`` as the URL query string."""
    at = AppTest.from_file(str(ROOT / "menu.py"), default_timeout=60)
    at.run()
    at.switch_page(page)
    at.query_params = {k: str(v) for k, v in params.items()}
    at.run()
    assert_clean(at)
    return at


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def chart_frames(at: AppTest) -> list[tuple[dict, list[pd.DataFrame]]]:
    """(Vega-Lite spec, [datasets as DataFrames]) of every Altair chart on the page."""
    out = []
    for element in at.get("vega_lite_chart"):
        frames = [pa.ipc.open_stream(ds.data.data).read_pandas() for ds in element.proto.datasets]
        out.append((json.loads(element.proto.spec), frames))
    return out


def frame_with(at: AppTest, *columns: str, where=None, spec_has: str | None = None) -> pd.DataFrame:
    """The one chart dataset having all ``columns``, passing ``where`` and in a chart whose spec has ``spec_has``."""
    found = [f for spec, frames in chart_frames(at) for f in frames
             if set(columns) <= set(f.columns) and (where is None or where(f))
             and (spec_has is None or spec_has in json.dumps(spec, ensure_ascii=False))]
    assert len(found) == 1, f"expected one chart dataset with {columns}, found {len(found)}"
    return found[0]


def metric(at: AppTest, label_start: str) -> str:
    found = [m.value for m in at.metric if m.label.startswith(label_start)]
    assert len(found) == 1, (label_start, [m.label for m in at.metric])
    return found[0]


def table_with(at: AppTest, column: str) -> pd.DataFrame:
    found = [d.value for d in at.main.dataframe if column in d.value.columns]
    assert len(found) == 1, (column, [list(d.value.columns) for d in at.main.dataframe])
    return found[0]


def warnings(at: AppTest) -> str:
    return "\n".join(w.value for w in at.warning)


def models_copy(src: Path, dst: Path, drop=(), corrupt=()) -> Path:
    """A models/ folder like ``src`` without the ``drop`` checkpoints and with unreadable metrics for ``corrupt``."""
    shutil.copytree(src, dst)
    for name in drop:
        shutil.rmtree(dst / name)
    for name in corrupt:
        (dst / name / "metrics.json").write_text("{not json")
        (dst / name / "model.safetensors").write_bytes(b"truncated")
    return dst


# -- home ------------------------------------------------------------------------------------------------
def test_home_table_chart_and_links(tiny_models):
    at = open_page(HOME)
    table = table_with(at, "extrapolates")
    assert list(table["method"]) == [display_name(n) for n in method_names()]
    for _, row in table.iterrows():
        cls = POSITION_METHODS[ID_OF[row["method"]]]  # the table shows names; the registry is keyed on ids
        assert row["fixed / learned"] == ("learned" if cls.learned else "fixed")
        metrics = read_metrics(tiny_models / cls.name)
        bpb = metrics["eval"]["nonoverlapping_bpb"]
        assert row["bits/byte @ 1×"] == f"{bpb['32']:.3f}"
        if bpb["512"] is None:
            assert row["extrapolates"] == "no"
        else:
            assert row["bits/byte @ 16×"] == f"{bpb['512']:.3f}"
            worse = bpb["512"] - bpb["32"]
            assert row["extrapolates"] == ("yes" if worse <= 0.05 else "partly" if worse <= 0.5 else "no")

    assert table.set_index("method").loc[display_name("learned"), "KV-cacheable"] == "yes (≤ 32)"
    # every cell fits the width a laptop's table gives it (about 24 characters at 1366 px: longer ones were cut)
    long = [v for v in table.drop(columns=["paper"]).to_numpy().ravel() if isinstance(v, str) and len(v) > 24]
    assert not long, long
    # the chart opens on one method of each family (eight lines), and draws every checkpoint one click away
    expected = {(name, int(n)): v for name in method_names()
                for n, v in read_metrics(tiny_models / name)["eval"]["nonoverlapping_bpb"].items() if v is not None}
    got = {(r.id, int(r.length)): r.bpb for r in frame_with(at, "checkpoint", "length", "bpb").itertuples()}  # the CSV keeps the ids
    assert {name for name, _ in got} == set(OPENING_SET) and len(OPENING_SET) == 8
    assert got == pytest.approx({k: v for k, v in expected.items() if k[0] in OPENING_SET})
    at.toggle(key="w_all").set_value(True).run()
    assert at.query_params["all"] == "1"
    got = {(r.id, int(r.length)): r.bpb for r in frame_with(at, "checkpoint", "length", "bpb").itertuples()}
    assert got == pytest.approx(expected)
    assert ("learned", 64) not in got and ("alibi", 512) in got
    specs = json.dumps([spec for spec, _ in chart_frames(at)])
    assert '"type": "log"' in specs and '"base": 2' in specs
    rule = frame_with(at, "length", "label")
    assert list(rule["length"]) == [32] and "training length" in rule["label"][0]

    links = at.get("page_link")
    assert sorted(link.proto.label.split(" — ")[0] for link in links) == sorted(map(display_name, method_names()))
    targets = {ID_OF[link.proto.label.split(" — ")[0]]: link.proto.page_script_hash for link in links}
    assert targets["sinusoidal"] == targets["learned"] and targets["t5"] == targets["alibi"] == targets["shaw"]
    assert targets["fox"] == targets["cope"] == targets["stick_breaking"]  # positions from content
    assert len(set(targets.values())) == 5  # absolute, rope, biases, from content, and the live lab for nope


def test_home_survives_missing_and_corrupt_checkpoints(tiny_models_dir, tmp_path, monkeypatch):
    folder = models_copy(tiny_models_dir, tmp_path / "models", drop=["shaw"], corrupt=["rope"])
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(folder))
    at = open_page(HOME)
    assert display_name("rope") in warnings(at) and "not valid JSON" in warnings(at)
    assert any(display_name("shaw") in i.value and "make checkpoints" in i.value for i in at.info)
    table = table_with(at, "extrapolates")
    assert list(table["method"]) == [display_name(n) for n in method_names()]  # the registry still lists every method
    assert table.set_index("method").loc[display_name("rope"), "extrapolates"].startswith("unknown")
    curve = frame_with(at, "checkpoint", "length", "bpb")
    assert {"rope", "shaw"}.isdisjoint(set(curve["id"])) and "alibi" in set(curve["id"])


def test_home_without_any_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(tmp_path))
    at = open_page(HOME)
    assert "No checkpoints found" in warnings(at)
    assert not at.get("vega_lite_chart")
    assert list(table_with(at, "extrapolates")["method"]) == [display_name(n) for n in method_names()]


def test_home_junk_url_and_presentation_mode(tiny_models):
    at = open_page(HOME, present="banana")
    assert "Ignored URL parameter present=" in warnings(at) and "banana" in warnings(at)
    assert at.sidebar.toggle[0].value is False
    intro = [c.value for c in at.main.caption if "checkpoints you can run" in c.value]
    assert intro
    at.sidebar.toggle[0].set_value(True).run()
    assert_clean(at)
    assert not [c.value for c in at.main.caption if "checkpoints you can run" in c.value]
    assert at.query_params["present"] == "1"


def test_home_on_the_shipped_checkpoints(monkeypatch):
    """The product ships checkpoints in models/: home must show every one of them (fails if there are none)."""
    monkeypatch.delenv("POSVIZ_CHECKPOINTS", raising=False)
    found = {n: f for n, f in shipped_checkpoints().items() if n in POSITION_METHODS}  # one per method
    assert found, "models/ holds no checkpoints; run `make checkpoints`"
    at = open_page(HOME)
    table = table_with(at, "extrapolates").set_index("method")
    plotted = set()
    for name, folder in found.items():
        metrics = read_metrics(folder)
        bpb = (metrics.get("eval") or {}).get("nonoverlapping_bpb") or {}
        train = home.train_length_of(metrics)
        if train is not None and bpb.get(str(train)) is not None:
            assert table.loc[display_name(name), "bits/byte @ 1×"] == f"{bpb[str(train)]:.3f}"
            plotted.add(name)
        else:
            assert table.loc[display_name(name), "extrapolates"].startswith("unknown")
    if plotted:
        curve = frame_with(at, "checkpoint", "length", "bpb")
        assert set(curve["id"]) == plotted & set(OPENING_SET)
        at.toggle(key="w_all").set_value(True).run()
        assert set(frame_with(at, "checkpoint", "length", "bpb")["id"]) == plotted


# -- sinusoidal & learned ------------------------------------------------------------------------------------
def test_sinusoidal_controls_change_what_is_shown(tiny_models):
    at = open_page(ABSOLUTE)
    assert float(metric(at, "max |PE(p+k)")) < 1e-12
    at.slider(key="len").set_value(64).run()
    at.select_slider(key="dim").set_value(16).run()
    assert_clean(at)
    heat = frame_with(at, "row", "col", "value", spec_has='"title": "PE value"')
    assert len(heat) == 64 * 16
    pe = sinusoidal_learned.sinusoidal_pe(64, 16, 10000.0)
    np.testing.assert_allclose(heat.sort_values(["row", "col"])["value"].to_numpy(), pe.ravel(), atol=1e-12)
    assert "p = 0…63, d = 16" in [m.label for m in at.metric][0]

    at.slider(key="k").set_value(10).run()
    at.select_slider(key="small").set_value(2).run()
    m_k = table_with(at, "col 0").to_numpy()
    np.testing.assert_allclose(m_k, sinusoidal_learned.shift_check(64, 2, 10).matrix, atol=1e-6)
    assert m_k.shape == (2, 2)
    example = table_with(at, "M_10·PE(5)")
    np.testing.assert_allclose(example["PE(5+10)"], sinusoidal_learned.sinusoidal_pe(20, 16)[15, :8], atol=1e-9)

    at.multiselect(key="dims-16").set_value(["3", "7"]).run()
    waves = frame_with(at, "position", "dimension", "value")
    assert sorted(set(waves["dimension"])) == [3, 7] and len(waves) == 2 * 64
    assert at.query_params["dims"] == "3,7" and at.query_params["len"] == "64" and at.query_params["k"] == "10"

    at.slider(key="bits_len").set_value(32).run()
    bits = frame_with(at, "row", "col", "value", spec_has='"title": "bit"')
    assert len(bits) == 32 * 5 and bits["value"].isin([0, 1]).all()
    p = bits[bits.row == 22].sort_values("col")["value"].to_numpy()
    assert list(p) == [0, 1, 1, 0, 1]  # 22 = 0b10110, least significant bit first
    at.slider(key="dist").set_value(40).run()
    dots = frame_with(at, "reference", "distance", "dot")
    assert dots["distance"].min() == -40 and dots["distance"].max() == 40
    assert dots[dots["distance"] == 0]["dot"].to_numpy() == pytest.approx([8.0, 8.0])
    assert_clean(at)


def test_learned_table_and_the_real_limit_error(tiny_models):
    at = open_page(ABSOLUTE)
    model = load_checkpoint(tiny_models / "learned")
    with pytest.raises(PositionLimitError) as info:
        model(torch.zeros(1, 33, dtype=torch.long))
    assert [c.value for c in at.code] == [str(info.value)]
    assert any("raises `PositionLimitError`" in m.value for m in at.markdown)
    pca = frame_with(at, "position", "pc1", "pc2")
    expected = sinusoidal_learned.pca_2d(sinusoidal_learned.learned_table(model))
    np.testing.assert_allclose(pca["pc1"], expected["pc1"], atol=1e-6)
    cosine = frame_with(at, "row", "col", "value", spec_has='"title": "cosine similarity"')
    assert len(cosine) == 32 * 32
    np.testing.assert_allclose(cosine[cosine.row == cosine.col]["value"], 1.0, atol=1e-9)


def test_absolute_page_junk_url_and_missing_learned(tiny_models_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(tiny_models_dir))
    at = open_page(ABSOLUTE, len="abc", dim="7", base="-1", k="99999", dims="zz")
    text = warnings(at)
    for key in ("len=", "dim=", "base=", "k=", "dims="):
        assert f"Ignored URL parameter {key}" in text
    assert at.slider(key="len").value == 128 and at.select_slider(key="dim").value == 64
    assert at.select_slider(key="base").value == 10000

    at = open_page(ABSOLUTE, len="256", k="7", base="1000")
    assert at.slider(key="len").value == 256 and at.slider(key="k").value == 7
    assert at.select_slider(key="base").value == 1000
    assert not at.warning, warnings(at)

    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(models_copy(tiny_models_dir, tmp_path / "m", drop=["learned"])))
    at = open_page(ABSOLUTE)
    assert "No 'learned' checkpoint" in warnings(at) and "make checkpoints" in warnings(at)
    assert not at.code and float(metric(at, "max |PE(p+k)")) < 1e-12


# -- RoPE -------------------------------------------------------------------------------------------------------
def test_p_ropes_section_shows_which_pairs_of_its_checkpoint_turn(tiny_models):
    """The tiny p_rope checkpoint: heads of 8 features, 4 pairs, p = 0.25 -> floor(0.25 * 8 / 2) = 1 pair turns,
    at RoPE's fastest speed; the other 3 stand still (no wavelength)."""
    at = open_page(ROPE)
    assert "p-RoPE: only the fastest pairs turn (p = 0.25)" in [h.value for h in at.header]
    assert any("1 of its 4 pairs per head turn" in c.value for c in at.caption)
    pairs = frame_with(at, "pair", "plain_wavelength", "rotates", where=lambda f: "series" in f.columns)
    turning = pairs[pairs["series"].str.startswith(display_name("p_rope"))]
    assert list(turning["pair"]) == [0] and turning["wavelength"].iloc[0] == pytest.approx(2 * math.pi)
    rope_line = pairs[pairs["series"].str.startswith("RoPE")]
    assert len(rope_line) == 4 and rope_line["wavelength"].is_monotonic_increasing


def test_the_layers_section_draws_each_layout_checkpoint_beside_rope(tiny_models):
    """The tiny layout checkpoints (two layers, training length 32): what each layer does, from the models
    themselves, and rope_sinks' learned sink logits as its weights hold them."""
    from posviz.models.interface import open_model
    from posviz.models.checkpoint_files import shipped_checkpoints

    at = open_page(ROPE)
    assert "Layers: which rotate, with which θ, through which window" in [h.value for h in at.header]
    frames = chart_frames(at)
    layout = next(df for spec, dfs in frames for df in dfs if "label" in df.columns and "sinks" in df.columns)
    assert list(dict.fromkeys(layout["model"])) == [display_name(n) for n in ("rope", "irope", "local_global", "rope_sinks")]
    cells = {(ID_OF[r.model], r.layer): r.label for r in layout.itertuples()}  # shown by name, looked up by id
    assert cells[("rope", 0)] == "RoPE · θ 10k · full"
    # two layers: both local (the global layer is every fourth, as Gemma 3's is every sixth)
    assert cells[("local_global", 0)] == cells[("local_global", 1)] == "RoPE · θ 10k · W 8"
    assert cells[("rope_sinks", 0)] == "RoPE · θ 10k · W 8 · sinks" and cells[("rope_sinks", 1)] == "RoPE · θ 10k · full · sinks"
    sinks = next(df for spec, dfs in frames for df in dfs if "sink logit" in df.columns)
    net = open_model(shipped_checkpoints()["rope_sinks"]).position
    for r in sinks.itertuples():
        assert r.model == display_name("rope_sinks")
        assert getattr(r, "_4") == pytest.approx(float(net.at_layer(r.layer).sink_logits[r.head]), abs=1e-6)


def test_rope_rotation_and_dog_example(tiny_models):
    at = open_page(ROPE)
    at.slider(key="m").set_value(8).run()
    at.slider(key="theta").set_value(0.25).run()
    assert_clean(at)
    assert metric(at, "rotation angle") == f"{math.degrees(2.0):.1f}°"
    assert metric(at, "length at position 0") == metric(at, "length at position 8")
    trail = frame_with(at, "position", "x", "y", "angle_deg")
    assert len(trail) == 9

    dog = table_with(at, "angle from k to q (°)")
    assert list(dog["offset m − n"]) == [1, 1, 4]
    angles = dog["angle from k to q (°)"].to_numpy()
    assert angles[0] == pytest.approx(angles[1], abs=1e-9) and abs(angles[2] - angles[0]) > 1
    expected = rope.rope_pair_example((1.0, 0.25), (0.55, 0.85), 0.25, [(1, 0), (4, 3), (4, 0)])
    np.testing.assert_allclose(angles, expected["angle_deg"])


def test_rope_shift_frequencies_decay_and_scalings(tiny_models):
    at = open_page(ROPE)
    at.number_input(key="sm").set_value(123).run()
    at.number_input(key="sn").set_value(45).run()
    at.number_input(key="ss").set_value(99_999).run()
    at.select_slider(key="hd").set_value(64).run()
    assert_clean(at)
    q, k = rope.random_qk(64, 0)
    check = rope.rope_shift_invariance(q, k, 123, 45, 99_999, 10000.0)
    assert metric(at, "q·k at (123, 45)") == f"{check.score:.10f}"
    assert metric(at, "q·k at (100,122, 100,044)") == f"{check.shifted_score:.10f}"
    assert float(metric(at, "absolute difference")) < 1e-9  # float64 angles near 1e5 rad: ~1e-11
    assert len(table_with(at, "wavelength (positions)")) == 32

    at.slider(key="dmax").set_value(256).run()
    decay = frame_with(at, "distance", "bound")
    np.testing.assert_allclose(decay["bound"], rope.rope_decay_bound(64, 10000.0, 256)["bound"])
    assert decay["bound"].iloc[0] == pytest.approx(16.5)

    at.select_slider(key="factor").set_value(8).run()
    waves = frame_with(at, "scaling", "scaling_id", "pair", "wavelength")
    assert set(waves["scaling_id"]) == set(ROPE_SCALINGS) and set(waves["scaling"]) == set(map(display_name, ROPE_SCALINGS))
    by = {name: g.sort_values("pair")["wavelength"].to_numpy() for name, g in waves.groupby("scaling_id")}
    np.testing.assert_allclose(by["linear"], 8 * by["none"])
    # every curve is 2 pi / theta of its registered scaling (test_reference_hf holds those to Hugging Face's),
    # at the page's head size and base, trained length 32, and the target 8 x 32 for dynamic NTK
    from posviz.positions.rope import RopeOptions

    for name, fn in ROPE_SCALINGS.items():
        opts = RopeOptions(scaling=name, factor=1.0 if name == "none" else 8.0, original_length=32, base=10000.0)
        inv_freq, _ = fn(64, opts, 8 * 32)
        np.testing.assert_allclose(by[name], 2 * math.pi / inv_freq.double().numpy(), rtol=1e-6, err_msg=name)
    assert not np.allclose(by["dynamic"], by["none"]) and not np.allclose(by["yarn"], by["llama3"])
    marks = frame_with(at, "y", "label", where=lambda f: len(f) == 2)
    assert list(marks["y"]) == [32, 8 * 32]  # tiny rope checkpoint: training length 32
    assert float(metric(at, "largest relative change")) < 1e-13
    assert at.query_params["factor"] == "8" and at.query_params["ss"] == "99999"


def test_rope_junk_url(tiny_models):
    at = open_page(ROPE, m="999", theta="nan", hd="7", factor="3", seed="x")
    text = warnings(at)
    for key in ("m=", "theta=", "hd=", "factor=", "seed="):
        assert f"Ignored URL parameter {key}" in text
    assert at.slider(key="m").value == 3 and at.slider(key="theta").value == 0.5
    assert at.select_slider(key="factor").value == 4


def test_rope_remap_section_draws_the_relative_positions_each_pair_sees(tiny_models):
    """The remap picker and its length: the largest position a pair sees, the parameters and the matrix's CSV,
    against ``rope_remaps.relative_position_matrix``; the link keeps both, junk in it falls back with a notice."""
    from posviz.positions.rope_remaps import relative_position_matrix

    at = open_page(ROPE, remap="rerope", rn="2")
    shown = {m.label: m.value for m in at.metric}
    assert shown["training length"] == "32" and "`window=8`, `log_scale=True`" in "\n".join(m.value for m in at.markdown)
    assert shown["largest relative position a pair sees"] == "8.0"  # clipped at w = 32 / 4
    at.selectbox(key="remap").set_value("self_extend").run()
    assert_clean(at)
    expected = relative_position_matrix("self_extend", None, 32, 64)
    shown = {m.label: m.value for m in at.metric}
    assert shown["largest relative position a pair sees"] == f"{float(np.nanmax(expected.numpy())):,.1f}"
    assert "`group=3`, `window=8`" in "\n".join(m.value for m in at.markdown) and at.query_params["remap"] in ("self_extend", ["self_extend"])
    junk = open_page(ROPE, remap="magic", rn="3")
    assert "Ignored URL parameter remap=" in warnings(junk) and junk.selectbox(key="remap").value == "self_extend"


# -- attention biases -----------------------------------------------------------------------------------------------
def test_alibi_slopes_matrix_and_bound(tiny_models):
    at = open_page(BIASES)
    at.number_input(key="heads").set_value(6).run()
    assert_clean(at)
    slopes = frame_with(at, "head", "slope", "half_weight_distance")
    np.testing.assert_allclose(slopes["slope"], attention_biases.alibi_slope_table(6)["slope"])
    assert at.slider(key="ahead-6").max == 5
    at.slider(key="ahead-6").set_value(4).run()
    at.slider(key="alen").set_value(16).run()
    matrix = frame_with(at, "row", "col", "value", spec_has='"title": "bias (logits)"')
    assert len(matrix) == 16 * 17 // 2 and matrix["value"].max() == 0
    cell = matrix[(matrix.row == 9) & (matrix.col == 2)]["value"].iloc[0]
    assert cell == pytest.approx(-0.5 * 7)  # head 4 of 6 has slope 1/2

    at.select_slider(key="ctx").set_value(1024).run()
    at.slider(key="margin").set_value(8.0).run()
    at.slider(key="far-1024").set_value(100).run()
    assert_clean(at)
    lw = attention_biases.log_max_attention_weight(attention_biases.alibi_bias_by_distance(6, 1024), 8.0)
    assert metric(at, "ALiBi, most lenient of 6 heads") == f"{np.exp(lw.max(axis=0)[100]):.3g}"
    assert metric(at, "no bias (NoPE)") == f"{1 / (1 + math.exp(-8.0) * 1023):.3g}"
    curves = frame_with(at, "series", "distance", "log10_max_weight", where=lambda f: "head 5" in set(f["series"]))
    assert set(curves["series"]) == {f"head {h}" for h in range(6)} | {"no bias"}
    assert at.query_params["heads"] == "6" and at.query_params["far"] == "100"


def t5_with_a_learned_table(tiny_models_dir: Path, dst: Path) -> Path:
    """A models/ copy whose t5 checkpoint has a non-zero bucket table (an untrained one is all zeros,
    where T5 equals NoPE and any curve-drawing bug would still draw zeros)."""
    from posviz.models.checkpoint_files import save_checkpoint

    models = models_copy(tiny_models_dir, dst)
    model = load_checkpoint(models / "t5")
    with torch.no_grad():
        table = model.position.bucket_bias.weight
        table.copy_(-torch.rand(table.shape, generator=torch.Generator().manual_seed(8)) * 4)  # (buckets, H)
    save_checkpoint(model, models / "t5", {"train": {"method": "t5", "note": "test table"}}, read_metrics(models / "t5"))
    return models


def test_t5_buckets_and_learned_bias(tiny_models_dir, tmp_path, monkeypatch):
    models = t5_with_a_learned_table(tiny_models_dir, tmp_path / "models")
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(models))
    at = open_page(BIASES)
    at.select_slider(key="nb").set_value(16).run()
    at.select_slider(key="md").set_value(64).run()
    buckets = frame_with(at, "distance", "direction", "bucket")
    expected = attention_biases.t5_bucket_table(256, 16, 64)
    causal_rows = buckets[buckets.direction == "causal (decoder)"].sort_values("distance")
    assert np.array_equal(causal_rows["bucket"], expected["causal"])
    # the legend in words, not the table's column names
    assert set(buckets["direction"]) == {"causal (decoder)", "bidirectional, key before", "bidirectional, key after"}
    at.slider(key="tlen").set_value(16).run()
    causal = frame_with(at, "row", "col", "value", spec_has='"title": "bucket"')
    assert len(causal) == 16 * 17 // 2
    at.toggle(key="bidir").set_value(True).run()
    assert_clean(at)
    both = frame_with(at, "row", "col", "value", spec_has='"title": "bucket"')
    assert len(both) == 16 * 16
    assert (causal["col"] <= causal["row"]).all()
    assert both[both.col > both.row]["value"].min() >= 8  # keys after the query: the second half of the buckets
    assert both[both.col < both.row]["value"].max() < 8

    # The learned curve is what the model itself adds (its logit_bias hook) at each distance and head.
    learned = frame_with(at, "distance", "head", "bias", where=lambda f: not {"method", "context"} & set(f.columns))
    position = load_checkpoint(models / "t5").position
    H = position.bucket_bias.weight.shape[1]
    assert set(learned["head"]) == set(range(H))
    by_model = attention_biases.bias_by_distance(position, 0, int(learned["distance"].max()) + 1)  # (H, n)
    expected = by_model[learned["head"].to_numpy(), learned["distance"].to_numpy().astype(int)]
    np.testing.assert_allclose(learned["bias"].to_numpy(), expected, atol=1e-5)
    assert learned["bias"].min() < -0.5  # the non-zero table shows
    # every head pushes far keys down here, so the most lenient head bounds the weight above NoPE's
    assert metric(at, "T5, most lenient") != metric(at, "no bias (NoPE)")


def test_shaw_clip_and_any_query_bound(tiny_models):
    at = open_page(BIASES)
    at.slider(key="sk").set_value(5).run()
    at.slider(key="slen").set_value(16).run()
    clip = frame_with(at, "row", "col", "value", spec_has='"title": "embedding index"')
    assert len(clip) == 16 * 17 // 2 and clip["value"].max() == 5
    assert clip[(clip.row == 12) & (clip.col == 1)]["value"].iloc[0] == 5
    assert clip[(clip.row == 12) & (clip.col == 9)]["value"].iloc[0] == 3
    at.toggle(key="anyq").set_value(True).run()
    at.select_slider(key="ctx").set_value(512).run()
    at.slider(key="far-512").set_value(300).run()
    assert_clean(at)
    k = load_checkpoint(tiny_models / "shaw").position.options.max_distance
    assert metric(at, "Shaw, layer 0, any query") == f"{1 / (1 + math.exp(-5.0) * (512 - k - 1)):.3g}"
    at.slider(key="far-512").set_value(3).run()
    assert metric(at, "Shaw, layer 0, any query") == "1"


def test_biases_junk_url_and_missing_checkpoints(tiny_models_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(models_copy(tiny_models_dir, tmp_path / "m", drop=["t5"], corrupt=["shaw"])))
    at = open_page(BIASES, ctx="5", margin="abc", heads="0", bidir="maybe")
    text = warnings(at)
    for key in ("ctx=", "margin=", "heads=", "bidir="):
        assert f"Ignored URL parameter {key}" in text
    assert "No 't5' checkpoint" in text and "model.safetensors" in text
    heads = load_checkpoint(tiny_models_dir / "alibi").config.n_head  # the default follows the shipped model
    assert at.number_input(key="heads").value == heads and at.select_slider(key="ctx").value == 4096
    assert [m.label for m in at.metric] == ["no bias (NoPE)", f"ALiBi, most lenient of {heads} heads",
                                            "KERPLE, most lenient head of layer 0", "FIRE, most lenient head of layer 0"]


def test_learned_distance_curves_kerple_formula_and_fire_input(tiny_models):
    at = open_page(BIASES)
    train_length = load_checkpoint(tiny_models / "alibi").config.train_length
    curves = frame_with(at, "method", "head", "distance", "bias", "context")
    assert set(curves["method"]) == set(map(display_name, attention_biases.distance_only_bias_methods())) == {
        "T5", "ALiBi", "KERPLE", "FIRE"}  # shown by name
    assert set(curves["context"]) == {16 * train_length}
    kerple = load_checkpoint(tiny_models / "kerple")
    at.slider(key="clayer").set_value(1).run()
    at.select_slider(key="cmult").set_value(4).run()
    assert_clean(at)
    curves = frame_with(at, "method", "head", "distance", "bias", "context")
    expected = attention_biases.bias_by_distance(kerple.position, 1, 4 * train_length)  # (H, n): layer 1's r1, r2
    mine = curves[(curves.method == display_name("kerple")) & (curves.head == 2)]
    np.testing.assert_allclose(mine["bias"], expected[2, mine["distance"]], rtol=1e-6)
    assert at.query_params["clayer"] == "1" and at.query_params["cmult"] == "4"

    at.slider(key="r1").set_value(2.0).run()
    at.slider(key="r2").set_value(1.0).run()
    formula = frame_with(at, "distance", "bias", "curve")
    kerple_rows = formula[formula["curve"].str.startswith("KERPLE")]
    assert kerple_rows[kerple_rows.distance == 1]["bias"].iloc[0] == pytest.approx(-2 * math.log(2))
    assert kerple_rows[kerple_rows.distance == 3]["bias"].iloc[0] == pytest.approx(-2 * math.log(4))

    fire_input = frame_with(at, "context", "distance", "normalised")
    assert fire_input["normalised"].between(0, 1).all()
    for _, part in fire_input.groupby("context"):
        assert part["normalised"].is_monotonic_increasing and part["normalised"].iloc[0] == 0

    # FIRE's own section: layer 1's per-head curves (the layer slider), at 1x and the chosen 4x, and its scalars
    fire = load_checkpoint(tiny_models / "fire")
    heads = frame_with(at, "layer", "context", "head", "distance", "bias", where=lambda f: "method" not in f.columns)
    assert set(heads["layer"]) == {1} and heads["context"].nunique() == 2
    at_4x = heads[heads["context"].str.startswith(f"{4 * train_length:,} bytes")]
    expected = attention_biases.bias_by_distance(fire.position, 1, 4 * train_length)  # (H, n)
    for h in range(fire.config.n_head):
        mine = at_4x[at_4x["head"] == f"head {h}"]
        np.testing.assert_allclose(mine["bias"], expected[h, mine["distance"]], rtol=1e-5, atol=1e-6)
    facts = table_with(at, "L (learned)")
    assert list(facts["layer"]) == list(range(fire.config.n_layer))
    assert facts["c"].tolist() == pytest.approx([float(fire.position.function(l).c) for l in range(fire.config.n_layer)])


def test_nezha_table_next_to_shaws_learned_one(tiny_models):
    at = open_page(BIASES)
    shaw = load_checkpoint(tiny_models / "shaw")
    tables = [f for spec, frames in chart_frames(at) for f in frames
              if {"row", "col", "value"} <= set(f.columns) and '"title": "a_d"' in json.dumps(spec)]
    assert len(tables) == 2
    k, hs = shaw.position.options.max_distance, shaw.config.head_dim
    fixed = attention_biases.nezha_table(k, hs)
    nezha = [t for t in tables if np.allclose(t["value"], fixed[t["row"], t["col"]], atol=1e-6)]
    assert len(nezha) == 1 and len(nezha[0]) == (k + 1) * hs
    at.slider(key="nlayer").set_value(1).run()
    assert_clean(at)
    assert at.query_params["nlayer"] == "1"


def test_transformer_xl_terms_for_one_query(tiny_models):
    at = open_page(BIASES, xquery=20)
    rows = frame_with(at, "key", "term", "value", "total", "weight", where=lambda f: f["term"].nunique() == 4)
    assert set(rows["term"]) == set(attention_biases.TXL_TERMS) and rows["key"].max() == 20
    summed = rows.groupby("key")["value"].sum()
    np.testing.assert_allclose(summed.values, rows.groupby("key")["total"].first().values, atol=1e-9)
    weights = rows.groupby("key")["weight"].first()
    assert weights.sum() == pytest.approx(1.0)
    text = "\n".join(m.value for m in at.markdown)
    assert "Query **20**" in text and f"key **{int(weights.idxmax())}**" in text
    at.slider(key="xhead").set_value(3).run()
    assert_clean(at)
    again = frame_with(at, "key", "term", "value", "total", "weight", where=lambda f: f["term"].nunique() == 4)
    assert not np.allclose(again["value"], rows["value"])  # another head, other terms
    assert at.query_params["xhead"] == "3"


# -- about ------------------------------------------------------------------------------------------------------------
def test_about_lists_methods_recipe_and_checkpoints(tiny_models):
    at = open_page(ABOUT)
    methods = next(t.value for t in at.main.table if "paper" in t.value.columns)  # a static table: summaries wrap
    assert list(methods["method"]) == [display_name(n) for n in method_names()]
    assert list(methods["paper"]) == [f"[paper ↗]({POSITION_METHODS[n].paper})" for n in method_names()]
    assert list(methods["summary"]) == [POSITION_METHODS[n].summary for n in method_names()]
    recipe = table_with(at, "setting").set_index("setting")["value"]
    from posviz.training.train import TrainConfig

    assert recipe["lr"] == str(TrainConfig().lr) and recipe["tokens"] == str(TrainConfig().tokens)
    checkpoints = table_with(at, about.VAL_BPB).set_index("checkpoint")
    assert list(checkpoints.index) == [display_name(n) for n in method_names()]
    for shown in [t.value for t in at.main.dataframe] + [t.value for t in at.main.table]:  # no None or nan (#56)
        assert not shown.isna().any().any() and not shown.astype(str).isin(["None", "nan", "NaN", ""]).any().any(), shown
    for name in method_names():
        metrics = read_metrics(tiny_models / name)
        assert checkpoints.loc[display_name(name), "parameters"] == f'{metrics["parameters"]:,}'  # shown as text
        assert checkpoints.loc[display_name(name), about.VAL_BPB] == f'{metrics["val_bpb_at_train_length"]:.3f}'
    assert any("make checkpoints" in c.value for c in at.code)


def test_about_with_a_corrupt_checkpoint_and_junk_url(tiny_models_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("POSVIZ_CHECKPOINTS", str(models_copy(tiny_models_dir, tmp_path / "m", corrupt=["alibi"])))
    at = open_page(ABOUT, present="2")
    assert "alibi" in warnings(at) and "Ignored URL parameter present=" in warnings(at)
    checkpoints = table_with(at, about.VAL_BPB)
    assert display_name("alibi") not in set(checkpoints["checkpoint"]) and display_name("rope") in set(checkpoints["checkpoint"])


def _bars_from_zero_on_a_log_axis(spec) -> list[str]:
    """Each bar or area of ``spec`` whose length axis is logarithmic but which rises from 0 (no y2 / x2): Vega
    cannot draw it ("Log scale domain includes zero") and the chart shows no bar at all."""
    found = []
    if isinstance(spec, dict):
        mark = spec.get("mark")
        mark = mark.get("type") if isinstance(mark, dict) else mark
        encoding = spec.get("encoding", {})
        if mark in ("bar", "area"):
            for axis in ("x", "y"):
                scale = (encoding.get(axis) or {}).get("scale") or {}
                if scale.get("type") == "log" and f"{axis}2" not in encoding:
                    found.append(f"{mark} on a log {axis} axis from 0: {json.dumps(encoding.get(axis))[:120]}")
        for value in spec.values():
            found += _bars_from_zero_on_a_log_axis(value)
    elif isinstance(spec, list):
        for value in spec:
            found += _bars_from_zero_on_a_log_axis(value)
    return found


@pytest.mark.parametrize("page", [ROPE, BIASES, ABSOLUTE, "views/content_positions.py"])
def test_no_chart_draws_bars_from_zero_on_a_log_axis(tiny_models, page):
    """FoPE's wavelength bars (a log axis, bars from 0) drew an empty chart in the browser; every chart of the explore
    pages is held to a baseline its scale can draw. The check itself catches the bar that was broken."""
    at = open_page(page)
    specs = [spec for spec, _ in chart_frames(at)]
    assert specs
    assert not [problem for spec in specs for problem in _bars_from_zero_on_a_log_axis(spec)]
    broken = {"mark": "bar", "encoding": {"x": {"field": "pair"}, "y": {"field": "wavelength", "scale": {"type": "log"}}}}
    assert _bars_from_zero_on_a_log_axis({"layer": [broken]}) and not _bars_from_zero_on_a_log_axis(
        {"layer": [{**broken, "encoding": {**broken["encoding"], "y2": {"datum": 1.0}}}]})
