"""Transformer-XL's section of the Attention biases page: its four logit terms for one query of a sentence,
from the checkpoint's own projections."""
import numpy as np
import pandas as pd
import streamlit as st

from posviz.explore import attention_biases
from views._bias_charts import key_weight_chart, stacked_terms_chart
from views._checkpoints import shipped_lab_model
from views._explore import chart, kept
from views._sections import BiasPage, section
from views._url import qp_int, sync_url

VIEW = "biases"
SENTENCE = "def area(radius):\n    return 3.14159 * radius * radius\n"


@section("transformer-xl-terms", "biases", order=80)
def terms_section(page: BiasPage, method: str) -> None:
    st.header("Transformer-XL: four terms decide where a query looks")
    st.markdown(
        "Transformer-XL splits each logit into **content–content** q_i·k_j, **content–position** q_i·W_R R_(i−j), a "
        "**global content bias** u·k_j and a **global position bias** v·W_R R_(i−j) (R: sinusoids of the distance, "
        "W_R learned per layer, u and v learned per head). Below: one query of a real sentence, every key it can see, "
        "and how much each term adds to that key's logit."
    )
    model, problem = shipped_lab_model(method)
    if model is None:
        st.warning(problem, icon="⚠️")
    else:
        _terms(model)


@st.fragment
def _terms(model) -> None:
    c1, c2, c3 = st.columns(3)
    txl_layer = c1.slider("layer", 0, model.n_layer - 1, min(qp_int("xlayer", 0, 0, 63), model.n_layer - 1), key="xlayer")
    txl_head = c2.slider("head", 0, model.n_head - 1, min(qp_int("xhead", 0, 0, 63), model.n_head - 1), key="xhead")
    txl_query = c3.slider("query position", 1, len(SENTENCE) - 1,
                          min(qp_int("xquery", len(SENTENCE) - 8, 1, len(SENTENCE) - 1), len(SENTENCE) - 1), key="xquery")
    sync_url(xlayer=txl_layer, xhead=txl_head, xquery=txl_query)
    key = tuple(model.key)
    terms = kept(VIEW, "transformer-xl-terms", key + (txl_layer,),
                 lambda: attention_biases.transformer_xl_terms(model, list(SENTENCE.encode()), txl_layer))
    chars = [repr(c)[1:-1] for c in SENTENCE]

    def query_rows():
        rows = pd.DataFrame(attention_biases.transformer_xl_query_rows(terms, txl_head, txl_query, chars))
        rows["label"] = rows["key"].astype(str) + " " + rows["byte"]
        return rows

    rows = kept(VIEW, "transformer-xl-rows", key + (txl_layer, txl_head, txl_query), query_rows)
    shares = attention_biases.deciding_term(terms, txl_head, txl_query)
    decider = max(shares, key=lambda t: abs(shares[t]))
    top_key = int(np.nanargmax(terms["weight"][txl_head, txl_query, : txl_query + 1]))
    st.markdown(f"Query **{txl_query}** (`{chars[txl_query]}`), layer {txl_layer}, head {txl_head}: it looks most at key "
                f"**{top_key}** (`{chars[top_key]}`, weight {terms['weight'][txl_head, txl_query, top_key]:.2f}). "
                f"The term that lifts that key most above the average key: **{decider}** ({shares[decider]:+.2f} logits).")
    order = list(attention_biases.TXL_TERMS)
    view = (txl_layer, txl_head, txl_query) + key
    chart(VIEW, ("transformer-xl-terms",) + view, lambda: stacked_terms_chart(rows, order),
          f"transformer_xl_terms_l{txl_layer}_h{txl_head}_q{txl_query}",
          "Bars: the four terms stacked (positive up, negative down); black tick: their sum, the logit the softmax "
          "sees. Keys whose bars reach highest get the attention.")
    chart(VIEW, ("transformer-xl-weights",) + view,
          lambda: key_weight_chart(rows[rows["term"] == order[0]][["label", "weight"]]),
          f"transformer_xl_weights_l{txl_layer}_h{txl_head}_q{txl_query}")
