"""The sections of the Positions from content page, one per method that computes positions from the text: what
each method computed on the visitor's text (FoX's forget gates, CoPE's counted positions, what stick-breaking's
query keeps for itself), beside the attention it gives. The numbers come from ``posviz.explore.content_positions``."""
import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from posviz.explore import content_positions
from views._explore import chart
from views._matrices import show_matrix
from views._sections import ContentPage, section
from views._text import show_coloured_text

VIEW = "content"


@section("fox-gates", "content", order=10)
def fox_section(page: ContentPage, method: str) -> None:
    view, h = page.view, page.head
    gates = content_positions.forget_gates(view, h)
    newline = view.ids == 10
    means = content_positions.gate_means(view, newline)
    st.header("Where this head forgets")
    st.caption(f"Each byte's forget gate f (head {h}, layer {page.layer}): the share of everything before it that "
               "survives it. The darker a byte, the more it forgets (1 − f). The bias of query i for key j is "
               "Σ log f over the bytes between them: a data-dependent ALiBi. "
               f"Mean gate over the heads on newlines {means['there']:.2f}, elsewhere {means['elsewhere']:.2f}.")
    show_coloured_text([(c, 1.0 - g) for c, g in zip(page.chars, gates)], 1.0, unit="forgotten (1 − f)", height=220,
                       missing="")
    show_matrix(view.bias[h], f"{page.checkpoint}_bias_L{page.layer}_H{h}", "key j", "query i",
                "bias Σ log f (logits)", scheme="viridis", key=page.key + ("bias", h))


@section("cope-counts", "content", order=20)
def cope_section(page: ContentPage, method: str) -> None:
    view, h = page.view, page.head
    query = len(page.chars) - 1
    counted = content_positions.counted_beside_distance(view, h, query)
    st.header("What this head counts")
    st.caption(f"CoPE's position of every key seen from the last byte (head {h}, layer {page.layer}): the sum of "
               "the query's gates from that key to itself. Plain counting (every gate 1) is the diagonal; a head "
               "below it counts only some bytes (lines, words, brackets) and so sees far keys as near.")

    def build():
        data = pd.DataFrame(counted)
        lines = data.melt(id_vars=["key", "distance"], value_vars=["counted", "plain"], var_name="series",
                          value_name="position")
        lines["series"] = lines["series"].map({"counted": "counted by CoPE", "plain": "plain count (distance + 1)"})
        plot = alt.Chart(lines).mark_line().encode(
            x=alt.X("distance:Q", title="distance from the query (bytes)"),
            y=alt.Y("position:Q", title="position of the key"),
            color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom")),
            strokeDash=alt.StrokeDash("series:N", legend=None),
            tooltip=["series:N", "distance:Q", alt.Tooltip("position:Q", format=".2f")]).properties(height=300)
        return plot, data

    chart(VIEW, page.key + ("cope-counts", h), build, f"{page.checkpoint}_counts_L{page.layer}_H{h}")
    show_matrix(view.counts[h], f"{page.checkpoint}_counts_matrix_L{page.layer}_H{h}", "key j", "query i",
                "counted position p", scheme="viridis", key=page.key + ("counts", h))


@section("stick-breaking-left", "content", order=30)
def stick_breaking_section(page: ContentPage, method: str) -> None:
    view, h = page.view, page.head
    kept = content_positions.on_own_value(view, h)
    st.header("What no earlier key took")
    st.caption(f"Each earlier key, nearest first, breaks off a sigmoid share of what is left (head {h}, layer "
               f"{page.layer}); what none took stays with the query: its own byte's value gets it, as in the "
               "reference code, and the map above draws it on the diagonal. Darker bytes kept more for themselves; "
               f"the first byte has no earlier key and keeps everything. Mean kept: {np.nanmean(kept):.3f}.")
    show_coloured_text([(c, v) for c, v in zip(page.chars, kept)], 1.0, unit="kept by the byte itself", height=220,
                       missing="")


@section("path-turn", "content", order=40)
def path_section(page: ContentPage, method: str) -> None:
    view, h = page.view, page.head
    turn, left = view.turn_degrees[h], view.length_left[h]
    st.header("How far each key has turned by the time the last byte reads it")
    st.caption(f"PaTH puts one Householder step H_t = I − β_t w_t w_tᵀ per byte between a key and the query (head {h}, "
               f"layer {page.layer}): every byte after a key turns it, by how much its own content says. Darker bytes' "
               "keys arrive at the last query turned further from where they were written (the angle between k_j and "
               "H_T ⋯ H_(j+1) k_j, in degrees); a key right before the query is barely turned, and a distant one has "
               f"been through every byte in between. Median turn {np.nanmedian(turn):.1f}°, the farthest key's "
               f"{turn[0]:.1f}°; median length left {np.nanmedian(left):.2f} of the key's own.")
    show_coloured_text([(c, v) for c, v in zip(page.chars, turn)], 180.0, unit="degrees turned", height=220,
                       missing="")

    def build():
        data = pd.DataFrame({"key": np.arange(len(turn)), "distance": len(turn) - 1 - np.arange(len(turn)),
                             "degrees turned": turn, "length left": left})
        plot = alt.Chart(data).mark_line(point=True).encode(
            x=alt.X("distance:Q", title="distance from the last byte (bytes)"),
            y=alt.Y("degrees turned:Q", title="angle turned (degrees)"),
            tooltip=["key:Q", "distance:Q", alt.Tooltip("degrees turned:Q", format=".1f"),
                     alt.Tooltip("length left:Q", format=".2f")]).properties(height=260)
        return plot, data

    chart(VIEW, page.key + ("path-turn", h), build, f"{page.checkpoint}_turns_L{page.layer}_H{h}")
