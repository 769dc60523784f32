"""The explore pages draw whatever position method is registered, through the method interface alone.

A throw-away method defined here (a logit bias of distance, ``TestOnlyBias``) is registered for one test
at a time, with one extra explore section it offers; Home, Attention biases and About must show it
without a line of the app naming it, and the registry is as before once the test is over.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import streamlit as st
import torch

from posviz.explore import attention_biases
from posviz.display import display_name
from posviz.positions import POSITION_METHODS, PositionMethod, method_names, relative_distance
from test_pages_explore import ABOUT, BIASES, HOME, frame_with, metric, open_page, table_with

NAME = "test_only_bias"
SHOWN = "Test-only bias"  # its display_name: what every page must show for it, with nothing else to write (#56)
SECTION = "test-only-extra-section"
STRENGTH_PER_HEAD = 0.25  # head h adds -(h + 1) * 0.25 * log(1 + d)


def expected_bias(n_head: int, distances: np.ndarray) -> np.ndarray:
    """(H, n) the bias ``TestOnlyBias`` adds at ``distances``, written out from its definition."""
    strength = STRENGTH_PER_HEAD * np.arange(1, n_head + 1)
    return -strength[:, None] * np.log1p(np.asarray(distances, dtype=float))[None, :]


class TestOnlyBias(PositionMethod):
    """A fixed bias of distance, -(h + 1)/4 * log(1 + d) for head h: known to no page."""

    __test__ = False  # a method, not a test class
    name = NAME
    display_name = SHOWN
    summary = "A bias for the method-contract test only: -(h + 1)/4 · log(1 + d) per head h."
    paper = "https://example.org/test-only-bias"
    acts_on = "logits"
    kind = "relative"
    explore_sections = (SECTION,)

    def logit_bias(self, layer, q, q_pos, k_pos):
        distance = relative_distance(q_pos, k_pos).clamp(min=0).to(torch.float64)  # (Tq, Tk)
        strength = STRENGTH_PER_HEAD * torch.arange(1, self.shape.n_head + 1, dtype=torch.float64)
        return (-strength[:, None, None] * torch.log1p(distance)).unsqueeze(0).to(q.dtype)  # (1, H, Tq, Tk)


def draw_extra_section(page, method: str) -> None:
    st.subheader(f"An extra section offered by {method}")
    st.metric(f"{method}: visible keys in this section", f"{page.n_keys:,}")


@pytest.fixture()
def registered(tiny_models):
    """TestOnlyBias in the registry and its extra section in the views' registry, for one test."""
    from views._sections import SECTIONS, section

    before = (dict(POSITION_METHODS), dict(SECTIONS))
    POSITION_METHODS[NAME] = TestOnlyBias
    section(SECTION, "biases", order=45)(draw_extra_section)
    try:
        yield tiny_models
    finally:
        POSITION_METHODS.pop(NAME, None)
        SECTIONS.pop(SECTION, None)
        assert (dict(POSITION_METHODS), dict(SECTIONS)) == before


def test_home_lists_a_new_method(registered):
    assert NAME in method_names()
    at = open_page(HOME)
    table = table_with(at, "extrapolates").set_index("method")
    assert list(table.index) == [display_name(n) for n in method_names()] and SHOWN in table.index
    row = table.loc[SHOWN]
    assert row["fixed / learned"] == "fixed" and row["acts on"] == "logits (bias)"
    assert row["bits/byte @ 1×"] == "no checkpoint" and row["paper"] == TestOnlyBias.paper
    links = {link.proto.label.split(" — ")[0]: link.proto.page_script_hash for link in at.get("page_link")}
    assert links[SHOWN] == links[display_name("alibi")]  # a bias: the Attention biases page explains it


def test_attention_biases_page_draws_a_new_method(registered):
    at = open_page(BIASES)
    curves = frame_with(at, "method", "head", "distance", "bias", "context")
    mine = curves[curves["method"] == SHOWN]
    n_head = int(curves[curves["method"] == display_name("alibi")]["head"].nunique())  # formula methods: the shipped shape
    assert sorted(set(mine["head"])) == list(range(n_head))
    for head, part in mine.groupby("head"):
        expected = expected_bias(n_head, part["distance"].to_numpy())[head]
        np.testing.assert_allclose(part["bias"].to_numpy(), expected, rtol=1e-6)

    # its most lenient head in the side-by-side comparison, at the page's context, margin and distance
    n_keys, margin = at.select_slider(key="ctx").value, at.slider(key="margin").value
    far = at.slider(key=f"far-{n_keys}").value
    bound = attention_biases.strongest_head(attention_biases.log_max_attention_weight(
        expected_bias(n_head, np.arange(n_keys)), margin))
    assert metric(at, f"{SHOWN}, most lenient head of layer 0") == f"{math.exp(bound[far]):.3g}"
    comparison = frame_with(at, "series", "distance", "log10_max_weight",
                            where=lambda f: f"{SHOWN}, most lenient head of layer 0" in set(f["series"]))
    assert "no bias (NoPE)" in set(comparison["series"])

    # the section it offers, drawn where its order puts it: after the curves, before KERPLE's formula
    headings = [node.value for node in at.main if type(node).__name__ in ("Header", "Subheader")]
    offered = headings.index(f"An extra section offered by {NAME}")
    assert headings.index("Learned curves of distance: KERPLE and FIRE next to ALiBi and T5") < offered
    assert offered < headings.index("KERPLE's formula, by hand")
    assert metric(at, f"{NAME}: visible keys in this section") == f"{n_keys:,}"

    at.select_slider(key="ctx").set_value(512).run()
    assert not at.exception
    assert metric(at, f"{NAME}: visible keys in this section") == "512"


def test_about_page_lists_a_new_method(registered):
    at = open_page(ABOUT)
    methods = next(t.value for t in at.main.table if "paper" in t.value.columns).set_index("method")
    assert list(methods.index) == [display_name(n) for n in method_names()]
    assert methods.loc[SHOWN, "summary"] == TestOnlyBias.summary
    assert methods.loc[SHOWN, "paper"] == f"[paper ↗]({TestOnlyBias.paper})"
    assert methods.loc[SHOWN, "learned parameters"] == "no"


def test_a_method_offers_the_views_of_its_hooks():
    """The defaults of the interface the explore pages draw through, for methods that act in each place."""
    from posviz.positions import ModelShape, build_position_method

    shape = ModelShape(n_layer=2, n_head=4, head_dim=8, n_embd=32, train_length=16)
    mine = TestOnlyBias(shape)
    np.testing.assert_allclose(mine.bias_by_distance(1, 10).numpy(), expected_bias(4, np.arange(10)), rtol=1e-6)
    assert mine.added_vectors(torch.arange(5)) is None and mine.rotation_frequencies(16) is None

    learned = build_position_method("learned", shape)
    added = learned.added_vectors(torch.arange(5))
    np.testing.assert_allclose(added.numpy(), learned.table.weight[:5].detach().double().numpy())
    rope = build_position_method("rope", shape)
    inv_freq, factor = rope.rotation_frequencies(16)
    assert inv_freq.shape == (4,) and factor == 1.0 and rope.bias_by_distance(0, 8) is None
    assert build_position_method("shaw", shape).bias_by_distance(0, 8) is None  # reads the query: no curve
