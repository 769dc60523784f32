"""Attention biases: ALiBi, T5, KERPLE, FIRE, Shaw, NEZHA and Transformer-XL — and how far each lets a token reach.

The page holds the widgets every section reads (context, margin, the distance compared), draws the
sections of ``views/_sections`` that the registered methods offer (``PositionMethod.explore_sections``)
and the page's own (every method's bias by distance), then the side-by-side comparison they filled in.
No method is named here: a new one shows up through its curve, its bound, and the sections it offers.
"""
import numpy as np
import streamlit as st

from posviz.explore import attention_biases
from posviz.positions import POSITION_METHODS
from posviz.training.train import TrainConfig
from views._bias_charts import far_rule, weight_chart
from views._charts import metric_rows
from views._checkpoints import shipped_checkpoint_json
from views._explore import chart, kept
from views._page import page_header
from views._sections import BiasPage, sections_for
from views._url import qp_choice, qp_float, qp_int, sync_url

VIEW = "biases"
CONTEXTS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]

page_header(
    "Attention biases: ALiBi, T5, KERPLE, FIRE, Shaw, NEZHA, Transformer-XL",
    "These methods leave the token vectors alone and add a number to each attention logit that depends on how far "
    "the key is from the query. The size of that number decides what a head can still see far away.",
    headline="max_weight_comparison",
)

# -- what "largest weight" means -------------------------------------------------------------------
st.header("Can a far but relevant token still get attention?")
st.markdown(
    "For one query with **n** visible keys, suppose the relevant key's content score q·k/√d beats every other key "
    "by at most a **margin** Δ (in logits). The largest softmax weight it can then get is reached when all other "
    r"keys score exactly Δ lower, and equals $\dfrac{1}{1 + e^{-\Delta} \sum_{j \neq d} e^{b_j - b_d}}$, with b the "
    r"position bias. With no bias this is $\dfrac{1}{1 + e^{-\Delta}(n - 1)}$: a far key is only diluted, never suppressed."
)
c1, c2, c3 = st.columns(3)
n_keys = c1.select_slider("visible keys n (context length)", CONTEXTS,
                          value=int(qp_choice("ctx", "4096", [str(c) for c in CONTEXTS])), key="ctx",
                          format_func=lambda c: f"{c:,}")
margin = c2.slider("content margin Δ (logits)", 0.0, 30.0, qp_float("margin", 5.0, 0.0, 30.0), step=0.5, key="margin",
                   help="How much more the relevant key matches the query than any other key does.")
far = c3.slider("distance of the relevant key (positions)", 0, n_keys - 1,
                min(qp_int("far", n_keys // 2, 0, max(CONTEXTS) - 1), n_keys - 1), key=f"far-{n_keys}")
sync_url(ctx=n_keys, margin=margin, far=far)

# The shipped checkpoints share one model shape and training length (one recipe): the sections draw
# formula-only methods, and the layers and lengths of the curves, at that shape.
shipped = next((config["model"] for name, (config, _, _) in shipped_checkpoint_json().items()
                if name in POSITION_METHODS and config and isinstance(config.get("model"), dict)), {})
page = BiasPage(
    n_keys=n_keys, margin=margin, far=far,
    grid=kept(VIEW, "grid", (n_keys,), lambda: attention_biases.distance_grid(n_keys)),
    no_bias=kept(VIEW, "no-bias", (n_keys, margin), lambda: attention_biases.no_bias_log_max_weight(n_keys, margin)),
    train_length=int(shipped.get("train_length", TrainConfig().train_length)),
    n_layer=int(shipped.get("n_layer", 4)), n_head=int(shipped.get("n_head", 8)))
page.summary["no bias (NoPE)"] = page.no_bias

# The summary opens the page (a long page's answer first); it is drawn once the sections below have filled it.
side_by_side = st.container()
st.header("Each method's bias, one by one")
for section, method in sections_for("biases"):
    section.draw(page, method)

# -- side by side -----------------------------------------------------------------------------------------------
side_by_side.__enter__()
st.header(f"Side by side: a relevant key at distance {far:,}")
metric_rows([dict(label=name, value=f"{np.exp(lw[far]):.3g}",
                  help=f"Largest weight at distance {far:,} with n = {n_keys:,} and Δ = {margin:g}.")
             for name, lw in page.summary.items()], per_row=3)
st.markdown(f"**Most lenient head of each method, n = {n_keys:,} keys, margin Δ = {margin:g}**")
summary = dict(page.summary)


def comparison():
    lines, df = weight_chart(attention_biases.max_weight_columns(summary, page.grid), "method", n_keys, sort=list(summary))
    return lines + far_rule(far), df


# The summary's labels say what each line is (method, heads, layer, bound); its values follow from them
# and from the checkpoints, whose keys the sections' labels do not hold: the values' digest does.
digest = tuple((name, float(lw.sum()), float(lw[0]), float(lw[-1])) for name, lw in summary.items())
chart(VIEW, ("comparison", n_keys, margin, far) + digest, comparison, f"max_weight_comparison_n{n_keys}",
      "Exponential fall = the method forgets; flat = the method dilutes but can still find a far key when its "
      "content stands out. Missing lines: that checkpoint is not available.",
      says=lambda: attention_biases.comparison_sentence(summary, far, n_keys, margin))
side_by_side.__exit__(None, None, None)
