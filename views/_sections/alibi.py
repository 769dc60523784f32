"""ALiBi's sections of the Attention biases page: its fixed slopes, one head's bias, each head's bound,
and the slopes published ALiBi models add ($POSVIZ_MODELS)."""
import pandas as pd
import streamlit as st

from posviz.errors import PosvizError
from posviz.explore import attention_biases
from views._bias_charts import published_slope_chart, slope_chart
from views._charts import metric_rows
from views._checkpoints import shipped_checkpoint_json
from views._explore import chart, kept, rerun_page_if_changed
from views._matrices import show_matrix
from views._published_positions import analysed, published_section, section_failed
from views._sections import BiasPage, section, show_head_bounds
from views._url import qp_int, sync_url

VIEW = "biases"


@section("alibi-slopes", "biases", order=10)
def slopes_section(page: BiasPage, method: str) -> None:
    st.header("ALiBi: a fixed slope per head")
    config = (shipped_checkpoint_json().get(method) or (None, None, None))[0] or {}
    shipped_heads = int(config.get("model", {}).get("n_head", 8))  # default: what the shipped model uses
    _slopes(page, method, shipped_heads)


@st.fragment
def _slopes(page: BiasPage, method: str, shipped_heads: int) -> None:
    c1, c2, c3 = st.columns(3)
    heads = c1.number_input("heads", 1, 64, qp_int("heads", shipped_heads, 1, 64), key="heads",
                            help="Any count works; for non-powers of two ALiBi interleaves the slopes of the next power of two.")
    alibi_head = c2.slider("head shown", 0, heads - 1, min(qp_int("ahead", 0, 0, 63), heads - 1), key=f"ahead-{heads}")
    alibi_len = c3.slider("positions in the bias matrix", 8, 128, qp_int("alen", 32, 8, 128), step=8, key="alen")
    slopes = kept(VIEW, "alibi-slopes", (heads,), lambda: pd.DataFrame(attention_biases.alibi_slope_table(heads)))
    left, right = st.columns(2)
    with left:
        chart(VIEW, ("alibi-slopes", heads), lambda: slope_chart(slopes), f"alibi_slopes_{heads}")
        st.dataframe(slopes.rename(columns={"slope": "slope m", "one_logit_distance": "−1 logit at",
                                            "half_weight_distance": "weight halves every"}),
                     hide_index=True, height="content")
    with right:
        st.markdown(f"**Bias of head {alibi_head}** (slope {slopes['slope'][alibi_head]:.4g}); blank = future keys, masked")
        matrix = kept(VIEW, "alibi-matrix", (heads, alibi_len, alibi_head),
                      lambda: attention_biases.alibi_bias_matrices(heads, alibi_len)[alibi_head])
        show_matrix(matrix, f"alibi_bias_head{alibi_head}", x_title="key position", y_title="query position",
                    value_title="bias (logits)", key=(heads, alibi_len))

    n_keys, margin = page.n_keys, page.margin
    alibi_lw, lenient = kept(VIEW, "alibi-bounds", (heads, n_keys, margin), lambda: _bounds(heads, n_keys, margin))
    show_head_bounds(page, method, f"ALiBi, {heads} heads", f"ALiBi, most lenient of {heads} heads", alibi_lw,
                     lenient, ("alibi-max-weight", heads, n_keys, margin), f"alibi_max_weight_{heads}h_n{n_keys}",
                     "The penalty grows linearly with distance, so every head's ceiling falls exponentially: past a few "
                     "“half-weight distances” no content margin can rescue a key. Curves below 1e-24 run along the "
                     "bottom edge.")
    # KERPLE's formula is drawn next to the head shown here
    page.handed_on["alibi_head"] = (alibi_head, float(slopes["slope"][alibi_head]))
    sync_url(heads=heads, ahead=alibi_head, alen=alibi_len)
    rerun_page_if_changed("alibi", (heads, alibi_head))  # the summary and KERPLE's comparison show them


def _bounds(heads: int, n_keys: int, margin: float):
    lw = attention_biases.log_max_attention_weight(attention_biases.alibi_bias_by_distance(heads, n_keys), margin)  # (H, n)
    return lw, attention_biases.strongest_head(lw)


@section("alibi-published", "biases", order=15)
def published_alibi(page: BiasPage, method: str) -> None:
    published = published_section(
        method, "ALiBi in published models",
        "BLOOM, Falcon-RW and MPT use ALiBi. Their slopes as each model adds them to its attention logits, read from "
        "its own bias builder, next to the paper's geometric slopes for the same number of heads.")
    if published is None:
        return
    try:
        facts = analysed(published, "alibi-slopes", lambda: attention_biases.published_alibi(published))
    except PosvizError as exc:
        section_failed(published, exc)
        return
    lo, hi = facts["ratio_range"]
    metric_rows([
        dict(label="heads", value=f"{facts['n_head']}"),
        dict(label="head dimension", value=f"{facts['head_dim']}"),
        dict(label="slope / the paper's", value=f"{lo:.3g}" if abs(hi - lo) <= 1e-3 * hi else f"{lo:.3g} to {hi:.3g}",
             help="Each head's slope as the model adds it, over the paper's slope for that head."),
    ], per_row=3)
    for note in facts["notes"]:
        st.info(note, icon="ℹ️")
    st.markdown(f"**{facts['name']}: ALiBi slope of each head, as the model adds it and in the paper**")
    chart(VIEW, ("published-alibi",) + tuple(published.key), lambda: published_slope_chart(facts),
          f"published_{facts['name']}_alibi_slopes",
          "A head's bias falls by its slope for every token of distance: a steeper head stays local. "
          "Equal bars: the model adds the paper's slopes; the notes above say where it does not.")
