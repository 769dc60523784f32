"""Shaw's section of the Attention biases page: which relative key each (query, key) uses, and how far
the checkpoint's learned keys let a head reach."""
from posviz.display import display_name
import streamlit as st

from posviz.explore import attention_biases
from posviz.positions import POSITION_METHODS
from views._bias_charts import weight_chart
from views._checkpoints import shipped_lab_model
from views._explore import chart, kept, rerun_page_if_changed
from views._matrices import show_matrix
from views._sections import BiasPage, section
from views._url import qp_bool, qp_float, qp_int, sync_url

VIEW = "biases"


@section("shaw-clip", "biases", order=30)
def clip_section(page: BiasPage, method: str) -> None:
    st.header("Shaw: relative keys, clipped at distance k")
    model, problem = shipped_lab_model(method)
    shaw = None if model is None else kept(VIEW, "shaw-learned", model.key, lambda: attention_biases.shaw_learned(model))
    # NEZHA's section draws these learned keys next to its fixed ones
    page.handed_on["learned_relative_keys"] = (method, shaw, problem, None if model is None else tuple(model.key))
    default_k = POSITION_METHODS[method].Options().max_distance if shaw is None else shaw["max_distance"]
    _clip(default_k)
    st.subheader(f"What the {display_name(method)} checkpoint allows")
    if shaw is None:
        st.warning(problem, icon="⚠️")
    else:
        _bound(page, method, shaw, model.key)


@st.fragment
def _clip(default_k: int) -> None:
    c1, c2, c3 = st.columns(3)
    clip_k = c1.slider("clip distance k", 1, 128, qp_int("sk", min(default_k, 128), 1, 128), key="sk")
    shaw_len = c2.slider("positions in the matrix", 8, 128, qp_int("slen", 48, 8, 128), step=8, key="slen")
    causal = c3.toggle("causal (decoder)", qp_bool("scausal", True), key="scausal")
    sync_url(sk=clip_k, slen=shaw_len, scausal=causal)
    st.markdown(f"**Which relative embedding each (query, key) uses** — {'0…k: distance, clipped at k; blank = masked' if causal else '0…2k: k + clip(key − query, −k, k)'}")
    matrix = kept(VIEW, "shaw-clip", (shaw_len, clip_k, causal), lambda: attention_biases.shaw_clip(shaw_len, clip_k, causal))
    show_matrix(matrix, f"shaw_clip_k{clip_k}", x_title="key position", y_title="query position",
                value_title="embedding index", key=(shaw_len, clip_k, causal))
    st.caption(f"Every distance ≥ {clip_k} uses the same embedding: the model cannot tell {clip_k} bytes back from "
               f"{10 * clip_k:,}.")


@st.fragment
def _bound(page: BiasPage, method: str, shaw: dict, model_key: tuple) -> None:
    rel = shaw["rel_keys"]
    c1, c2, c3 = st.columns(3)
    layer = c1.slider("layer", 0, rel.shape[0] - 1, min(qp_int("layer", 0, 0, 63), rel.shape[0] - 1), key="layer")
    any_query = c2.toggle("any query (no bound on ‖q‖)", qp_bool("anyq", False), key="anyq")
    q_norm = c3.slider("query norm bound ‖q‖", 0.0, 50.0, qp_float("qnorm", 10.0, 0.0, 50.0), step=0.5, key="qnorm",
                       disabled=any_query)
    sync_url(layer=layer, anyq=any_query, qnorm=q_norm)
    st.markdown(
        "Shaw's bias q·a_clip(d)/√d depends on the query, so the bound is over every query with ‖q‖ ≤ the chosen "
        "norm (by Cauchy–Schwarz, b_j − b_d ≥ −‖q‖·‖a_j − a_d‖/√d). With no bound on ‖q‖ only the keys that share "
        "the relevant key's embedding are sure to compete: nothing for d < k, every other far key beyond."
    )
    n_keys, margin = page.n_keys, page.margin
    bound_norm = None if any_query else q_norm
    bound_q = kept(VIEW, "shaw-bound", (layer, n_keys, margin, bound_norm) + tuple(model_key),
                   lambda: attention_biases.shaw_log_max_attention_weight(rel[layer], n_keys, margin, bound_norm))
    label = "any query" if any_query else f"‖q‖ ≤ {q_norm:g}"
    page.summary[f"Shaw, layer {layer}, {label}"] = bound_q
    page.summarised.add(method)
    st.markdown(f"**Largest weight: Shaw checkpoint, layer {layer} (k = {shaw['max_distance']}), "
                f"n = {n_keys:,} keys, margin Δ = {margin:g}**")
    chart(VIEW, ("shaw-max-weight", layer, n_keys, margin, bound_norm) + tuple(model_key),
          lambda: weight_chart(attention_biases.max_weight_columns({label: bound_q, "no bias": page.no_bias}, page.grid),
                               "bound", n_keys), f"shaw_max_weight_layer{layer}_n{n_keys}")
    rerun_page_if_changed("shaw", (layer, label))  # the side-by-side comparison shows this bound
