"""What the explore pages share to stay cheap to move: charts and numbers kept once per server under the
view's key, and fragments that rerun the whole page only when they change what the rest of it shows.

A widget moved inside an ``st.fragment`` reruns that fragment alone. A fragment whose widgets also feed
a part of the page outside it (the Attention biases page's side-by-side comparison sums up every
section) calls ``rerun_page_if_changed`` with what it hands on: the page then reruns once more, with
every chart already kept, so nothing is computed twice.
"""
from __future__ import annotations

import streamlit as st

from views._charts import show_cached_chart
from views._serving import shared


def kept(view: str, what: str, key: tuple, build):
    """``build()`` once per server for (``view``, ``what``, ``key``): numbers a page derives, the same
    for every visitor at the same settings."""
    return shared(f"explore-{view}-{what}", key, build)


def chart(view: str, key: tuple, build, name: str, caption: str | None = None, says: str | None = None) -> None:
    """``show_cached_chart`` of ``build()`` -> (chart, data), kept under the view's key: moving a widget
    back to a setting seen before draws the kept Vega-Lite spec, without Altair."""
    show_cached_chart((f"explore-{view}",) + tuple(key), build, name, caption, says=says)


def rerun_page_if_changed(what: str, value) -> None:
    """Rerun the whole page when ``value`` (what a fragment hands to the rest of the page) differs from
    what this session's last run handed on; the first run only notes it."""
    state_key = f"_handed_on_{what}"
    before = st.session_state.get(state_key, value)
    st.session_state[state_key] = value
    if before != value:
        st.rerun(scope="app")
