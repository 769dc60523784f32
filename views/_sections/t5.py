"""T5's section of the Attention biases page: how distances fall into buckets, and what the checkpoint
learned per bucket and head."""
from posviz.display import display_name
import numpy as np
import pandas as pd
import streamlit as st

from posviz.explore import attention_biases
from posviz.positions import POSITION_METHODS
from views._bias_charts import bucket_chart, learned_bias_chart
from views._checkpoints import shipped_lab_model
from views._explore import chart, kept
from views._matrices import show_matrix
from views._sections import BiasPage, section, show_head_bounds
from views._url import qp_bool, qp_choice, qp_int, sync_url

VIEW = "biases"
BUCKETS = [8, 16, 32, 64, 128]
T5_MAX_DISTANCES = [16, 32, 64, 128, 256, 512, 1024]


@section("t5-buckets", "biases", order=20)
def buckets_section(page: BiasPage, method: str) -> None:
    st.header("T5: learned biases per distance bucket")
    model, problem = shipped_lab_model(method)
    learned = None if model is None else kept(VIEW, "t5-learned", model.key, lambda: attention_biases.t5_learned(model))
    _buckets(page, method, model, problem, learned)


@st.fragment
def _buckets(page: BiasPage, method: str, model, problem: str | None, t5: dict | None) -> None:
    options = POSITION_METHODS[method].Options
    defaults = options() if t5 is None else options(t5["num_buckets"], t5["max_distance"])
    c1, c2, c3, c4 = st.columns(4)
    num_buckets = c1.select_slider("buckets", BUCKETS, value=int(qp_choice(
        "nb", str(defaults.num_buckets) if defaults.num_buckets in BUCKETS else "32", [str(b) for b in BUCKETS])), key="nb")
    max_distance = c2.select_slider("max_distance (positions)", T5_MAX_DISTANCES, value=int(qp_choice(
        "md", str(defaults.max_distance) if defaults.max_distance in T5_MAX_DISTANCES else "128",
        [str(d) for d in T5_MAX_DISTANCES])), key="md")
    bidirectional = c3.toggle("bidirectional (encoder)", qp_bool("bidir", False), key="bidir",
                              help="An encoder gives half the buckets to keys after the query; a causal decoder uses all for keys before.")
    t5_len = c4.slider("positions in the matrix", 8, 128, qp_int("tlen", 48, 8, 128), step=8, key="tlen")
    sync_url(nb=num_buckets, md=max_distance, bidir=bidirectional, tlen=t5_len)
    if max_distance <= num_buckets // 2:
        st.warning(f"max_distance must exceed half the buckets ({num_buckets // 2}); showing max_distance = "
                   f"{num_buckets} instead.", icon="⚠️")
        max_distance = num_buckets
    left, right = st.columns(2)
    with left:
        chart(VIEW, ("t5-buckets", num_buckets, max_distance), lambda: bucket_chart(pd.DataFrame(
            attention_biases.t5_bucket_table(4 * max_distance, num_buckets, max_distance))),
              f"t5_buckets_{num_buckets}_{max_distance}",
              "Small distances get a bucket each (causal: the first half of the buckets; bidirectional: the first "
              f"quarter on each side), then buckets widen log-spaced; every distance from {max_distance} on shares "
              "the last bucket.")
    with right:
        st.markdown(f"**Bucket of each (query, key)**, {'bidirectional' if bidirectional else 'causal; blank = masked'}")
        matrix = kept(VIEW, "t5-bucket-matrix", (t5_len, bidirectional, num_buckets, max_distance),
                      lambda: attention_biases.t5_bucket_matrix(t5_len, bidirectional, num_buckets, max_distance))
        show_matrix(matrix, f"t5_bucket_matrix_{'bi' if bidirectional else 'causal'}", x_title="key position",
                    y_title="query position", value_title="bucket", key=(t5_len, num_buckets, max_distance))

    st.subheader(f"What the {display_name(method)} checkpoint learned")
    if t5 is None:
        st.warning(problem, icon="⚠️")
        return
    H = t5["weights"].shape[1]
    st.markdown(f"{t5['num_buckets']} buckets × {H} heads, max_distance {t5['max_distance']} (the checkpoint's own "
                "settings; the controls above do not change them). Causal model: all buckets are for keys before the query.")
    t5_head = st.slider("head shown", 0, H - 1, min(qp_int("thead", 0, 0, 63), H - 1), key="thead")
    sync_url(thead=t5_head)
    n_keys, margin, grid = page.n_keys, page.margin, page.grid
    left, right = st.columns(2)
    with left:
        def per_head():
            bias = attention_biases.t5_bias_by_distance(t5["weights"], n_keys, t5["max_distance"])  # (H, n)
            frame = pd.DataFrame({"distance": np.tile(grid, H), "head": np.repeat(np.arange(H), grid.size),
                                  "bias": bias[:, grid].ravel()})
            return learned_bias_chart(frame, n_keys)

        chart(VIEW, ("t5-learned-bias", n_keys) + tuple(model.key), per_head, "t5_learned_bias")
    with right:
        st.markdown(f"**Learned bias of head {t5_head}**; blank = masked")
        matrix = kept(VIEW, "t5-bias-matrix", (t5_head, t5_len) + tuple(model.key),
                      lambda: attention_biases.t5_bias_matrix(t5["weights"], t5_head, t5_len, t5["max_distance"]))
        show_matrix(matrix, f"t5_bias_head{t5_head}", x_title="key position", y_title="query position",
                    value_title="T5 bias (logits)", scheme="redblue", key=(t5_head, t5_len) + tuple(model.key))

    def bounds():
        lw = attention_biases.log_max_attention_weight(
            attention_biases.t5_bias_by_distance(t5["weights"], n_keys, t5["max_distance"]), margin)
        return lw, attention_biases.strongest_head(lw)

    t5_lw, lenient = kept(VIEW, "t5-bounds", (n_keys, margin) + tuple(model.key), bounds)
    show_head_bounds(page, method, "T5 checkpoint", f"T5, most lenient of {H} heads", t5_lw, lenient,
                     ("t5-max-weight", n_keys, margin) + tuple(model.key), f"t5_max_weight_n{n_keys}",
                     f"Past {t5['max_distance']} positions every key shares one bias, so the ceiling stops falling: far "
                     "keys are diluted by their many equals, not pushed down further.")
