"""AppTest tests of the Positions from content page (issue #35): every content checkpoint, its layer and head
sliders, what each method's section draws against ``posviz.explore.content_positions`` run here, and junk links."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from conftest import ROOT
from posviz.explore import content_positions
from posviz.models.checkpoint_files import load_checkpoint, shipped_checkpoints
from posviz.training.data import load_corpus

PAGE = "views/content_positions.py"
SECTION_TITLE = {"fox": "Where this head forgets", "cope": "What this head counts", "stick_breaking": "What no earlier key took",
                 "path": "How far each key has turned by the time the last byte reads it"}


def open_page(**params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "menu.py"), default_timeout=120)
    at.run()
    at.switch_page(PAGE)
    at.query_params = {k: str(v) for k, v in params.items()}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def chart_frames(at) -> list:
    return [pa.ipc.open_stream(ds.data.data).read_pandas() for c in at.get("vega_lite_chart") for ds in c.proto.datasets]


def test_every_content_method_has_a_shipped_checkpoint_and_a_section():
    assert set(content_positions.content_methods()) == set(SECTION_TITLE) <= set(shipped_checkpoints())


@pytest.mark.parametrize("method", sorted(SECTION_TITLE))
def test_each_checkpoint_shows_its_attention_and_its_own_section(method):
    at = open_page(model=method, layer=1, head=2, n=64)
    headers = [h.value for h in at.header]
    assert headers == ["Attention of head 2, layer 1", SECTION_TITLE[method]]
    assert not at.error and not at.warning
    frames = chart_frames(at)
    assert frames and all(len(f) for f in frames)
    # the method's weights as the page draws them are posviz's own, for this text and head
    view = content_positions.layer_view(load_checkpoint(shipped_checkpoints()[method]),
                                        list(load_corpus().eval_documents[0][:64]), 1)
    weights = frames[0]  # the heatmap's long format: row (query), col (key), value
    drawn = np.full((64, 64), np.nan)
    drawn[weights["row"].astype(int), weights["col"].astype(int)] = weights["value"]
    shown = ~np.isnan(drawn)
    assert shown.sum() > 1000
    np.testing.assert_allclose(drawn[shown], view.weights[2][shown], atol=1e-6)


def test_moving_the_head_and_layer_sliders_redraws_from_that_head():
    at = open_page(model="fox", n=48)
    before = chart_frames(at)[0]
    at.slider(key="w_head").set_value(3).run()
    at.slider(key="w_layer").set_value(3).run()
    assert not at.exception
    assert [h.value for h in at.header][0] == "Attention of head 3, layer 3"
    assert str(at.query_params["head"]) in ("3", "['3']") and str(at.query_params["layer"]) in ("3", "['3']")
    after = chart_frames(at)[0]
    assert len(after) == len(before) and not np.allclose(after["value"], before["value"], equal_nan=True)
    html = at.get("html")[0].proto.body  # the forget gates, coloured along the text
    assert "forgotten" in html and "<script" not in html


def test_junk_in_the_link_is_named_and_the_page_still_draws():
    at = open_page(model="nonsense", layer="-3", head="x", n="100000")
    warnings = " ".join(w.value for w in at.warning)
    assert "model=" in warnings and "layer=" in warnings and "head=" in warnings and "n=" in warnings
    assert [h.value for h in at.header][0] == "Attention of head 0, layer 0"
    assert chart_frames(at)


def test_pasted_text_of_one_byte_says_what_to_do():
    at = open_page(model="cope", src="paste")
    at.text_area(key="w_paste").set_value("x").run()
    assert not at.exception
    assert any("at least two bytes" in w.value for w in at.warning)
