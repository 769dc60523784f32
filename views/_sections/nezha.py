"""NEZHA's section of the Attention biases page: its fixed sinusoidal relative keys next to the ones Shaw's
checkpoint learned in their place (handed on by Shaw's section)."""
import streamlit as st

from posviz.explore import attention_biases
from posviz.positions import POSITION_METHODS
from views._explore import kept
from views._matrices import show_matrix
from views._sections import BiasPage, section
from views._url import qp_int, sync_url

VIEW = "biases"
DEFAULT_HEAD_DIM = 32  # without a learned table to match: the shipped models' head size


@section("nezha-keys", "biases", order=70)
def keys_section(page: BiasPage, method: str) -> None:
    st.header("NEZHA: Shaw's relative keys, as fixed sinusoids")
    _, shaw, problem, shaw_key = page.handed_on.get("learned_relative_keys", (
        None, None, "No method with learned relative keys is registered.", None))
    nezha_k = shaw["max_distance"] if shaw is not None else POSITION_METHODS[method].Options().max_distance
    head_dim = shaw["rel_keys"].shape[-1] if shaw is not None else DEFAULT_HEAD_DIM
    st.markdown(
        f"NEZHA keeps Shaw's form, a relative key a_d per clipped distance d ≤ k added to the query's dot product, but "
        f"a_d is a sinusoid of d (as the absolute sinusoidal table is of a position), the same in every head and layer. "
        f"Left: NEZHA's table for k = {nezha_k} and head size {head_dim}; right: what Shaw learned in its place."
    )
    left, right = st.columns(2)
    with left:
        st.markdown("**NEZHA: fixed relative keys** (row = distance d, column = feature)")
        table = kept(VIEW, "nezha-table", (nezha_k, head_dim), lambda: attention_biases.nezha_table(nezha_k, head_dim))
        show_matrix(table, f"nezha_table_k{nezha_k}", x_title="feature", y_title="distance d", value_title="a_d",
                    scheme="redblue", key=(nezha_k, head_dim))
    with right:
        if shaw is None:
            st.warning(problem, icon="⚠️")
        else:
            _learned(shaw, shaw_key)
    st.caption("Smooth stripes: neighbouring distances get similar keys by construction (NEZHA). Shaw has to learn any "
               "such structure from data, one distance at a time, and rarely-seen distances stay near their random start.")


@st.fragment
def _learned(shaw: dict, shaw_key: tuple) -> None:
    layers = shaw["rel_keys"].shape[0]
    shaw_layer = st.slider("Shaw layer", 0, layers - 1, min(qp_int("nlayer", 0, 0, 63), layers - 1), key="nlayer")
    sync_url(nlayer=shaw_layer)
    st.markdown(f"**Shaw: learned relative keys**, layer {shaw_layer}")
    show_matrix(shaw["rel_keys"][shaw_layer], f"shaw_table_layer{shaw_layer}", x_title="feature",
                y_title="distance d", value_title="a_d", scheme="redblue",
                key=(shaw_layer,) + shaw_key)
