"""KERPLE's section of the Attention biases page: its formula by hand, next to the ALiBi head shown above,
and the (r1, r2) the checkpoint learned."""
from posviz.display import display_name
import numpy as np
import pandas as pd
import streamlit as st

from posviz.explore import attention_biases
from views._bias_charts import formula_chart
from views._checkpoints import shipped_lab_model
from views._explore import chart, kept
from views._sections import BiasPage, section
from views._url import qp_float, sync_url

VIEW = "biases"


@section("kerple-formula", "biases", order=50)
def formula_section(page: BiasPage, method: str) -> None:
    st.subheader("KERPLE's formula, by hand")
    _formula(page)
    model, _ = shipped_lab_model(method)
    if model is not None:
        table = kept(VIEW, "kerple-learned", tuple(model.key), lambda: _learned_table(model))
        st.markdown(f"**What the {display_name(method)} checkpoint learned** (per layer and head)")
        st.dataframe(table, hide_index=True, height="content")


def _learned_table(model) -> pd.DataFrame:
    learned = attention_biases.kerple_learned(model)
    return pd.DataFrame([{"layer": l, "head": h, "r1": learned["r1"][l, h], "r2": learned["r2"][l, h]}
                         for l in range(learned["r1"].shape[0]) for h in range(learned["r1"].shape[1])])


@st.fragment
def _formula(page: BiasPage) -> None:
    c1, c2 = st.columns(2)
    r1 = c1.slider("r1 (strength)", 0.01, 4.0, qp_float("r1", 1.0, 0.01, 4.0), step=0.01, key="r1")
    r2 = c2.slider("r2 (bend)", 0.01, 4.0, qp_float("r2", 0.5, 0.01, 4.0), step=0.01, key="r2")
    sync_url(r1=r1, r2=r2)
    n_keys = page.n_keys
    alibi = page.handed_on.get("alibi_head")  # (head, slope) of the ALiBi head shown above, when there is one

    def build():
        kgrid = attention_biases.distance_grid(n_keys)
        curves = {f"KERPLE −{r1:g}·log(1 + {r2:g}·d)": attention_biases.kerple_formula(r1, r2, kgrid)}
        if alibi is not None:
            curves[f"ALiBi head {alibi[0]}: −{alibi[1]:.3g}·d"] = -alibi[1] * kgrid
        df = pd.DataFrame({"distance": np.tile(kgrid, len(curves)), "bias": np.concatenate(list(curves.values())),
                           "curve": [label for label in curves for _ in range(kgrid.size)]})
        return formula_chart(df, n_keys)

    far = -attention_biases.kerple_formula(r1, r2, [n_keys - 1])[0]
    caption = (f"At distance {n_keys - 1:,} KERPLE costs {far:.2f} logits" +
               (f", ALiBi head {alibi[0]} {alibi[1] * (n_keys - 1):,.1f}: a logarithm lets far keys compete."
                if alibi is not None else "."))
    chart(VIEW, ("kerple-formula", r1, r2, n_keys, alibi), build, f"kerple_formula_r1_{r1:g}_r2_{r2:g}", caption)
