"""The Layers section of the RoPE page: which layers of each layout checkpoint rotate, with which θ, through
which window, with learned sinks (``positions.layers``), beside plain RoPE; and the sink logits it learned."""
import altair as alt
import pandas as pd
import streamlit as st

from posviz.display import display_name
from posviz.explore import layers
from posviz.palette import colour
from posviz.positions import POSITION_METHODS
from views._checkpoints import shipped_checkpoint_json, shipped_lab_model
from views._charts import show_chart
from views._sections import RopePage, section

SECTION = "layer-layout"


def layout_chart(rows: pd.DataFrame, order: list[str]) -> alt.Chart:
    """A row of cells per model, one per layer: coloured by the position method acting there, labelled with θ,
    the window and sinks. (Also drawn for a published model, from its config.)"""
    ids = list(dict.fromkeys(rows["position"]))
    # shown by display name (posviz.display), coloured by id (posviz.palette); a published model keeps its hub id
    rows = rows.assign(model=rows["model"].map(display_name), position=rows["position"].map(display_name))
    order = [display_name(n) for n in order]
    methods = [display_name(m) for m in ids]
    base = alt.Chart(rows).encode(
        x=alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("model:N", sort=order, title=None, axis=alt.Axis(labelLimit=200)))
    cells = base.mark_rect(stroke="white", strokeWidth=3).encode(
        color=alt.Color("position:N", title="acting in the layer", legend=alt.Legend(orient="bottom"),
                        scale=alt.Scale(domain=methods, range=[colour(m) for m in ids])),
        opacity=alt.value(0.55),
        tooltip=["model", "layer", "position", alt.Tooltip("base:Q", title="RoPE base θ", format=",.0f"),
                 alt.Tooltip("rotary share:Q", format=".0%"), alt.Tooltip("window:Q", title="window (keys)"), "sinks",
                 alt.Tooltip("options:N", title="options (iRoPE's NoPE layer: its temperature)")])
    text = base.mark_text(fontSize=12).encode(text="label:N")  # one line: a cell is wide enough at 1366 px
    return (cells + text).properties(height=max(80, 62 * len(order)))


@section(SECTION, "rope", order=20)
def layers_section(page: RopePage, method: str) -> None:
    shipped = shipped_checkpoint_json()
    names = [n for n, (config, _, _) in shipped.items() if config and SECTION in getattr(
        POSITION_METHODS.get(config.get("model", {}).get("position")), "explore_sections", ())]
    st.header("Layers: which rotate, with which θ, through which window")
    st.caption("Today's models place position per layer (Llama 4's NoPE layers, Gemma 3's local and global layers, "
               "GPT-OSS's sinks). Each row is a checkpoint trained with the shared recipe, its layers left to right; "
               "W is a sliding window of keys, θ the RoPE base. Published models' layouts are drawn further down.")
    models = {}
    for name in ["rope", *names]:
        model, problem = shipped_lab_model(name)
        if model is not None:
            models[name] = model
        elif name != "rope":
            st.warning(problem, icon="⚠️")
    if len(models) <= 1:
        st.info("No layout checkpoint is shipped here: `make checkpoints` trains "
                f"{', '.join(display_name(n) for n in ('irope', 'local_global', 'rope_sinks'))}.")
        return
    rows = pd.DataFrame(layers.layout_rows(models))
    show_chart(layout_chart(rows, list(models)), rows, "layer_layouts",
               f"{display_name('rope')}: the same RoPE in every layer, for reference. Hover a cell for its numbers.")
    sinks = pd.DataFrame([r for name, model in models.items() for r in layers.sink_logit_rows(display_name(name), model)])
    if sinks.empty:
        return
    st.markdown("**Learned sink logits, per layer and head** (GPT-OSS's arrangement): each joins every softmax row "
                "as one more key with no value, so a head can put weight nowhere.")
    heat = alt.Chart(sinks).mark_rect(stroke="white").encode(
        x=alt.X("head:O", axis=alt.Axis(labelAngle=0)), y=alt.Y("layer:O"),
        color=alt.Color("sink logit:Q", scale=alt.Scale(scheme="purples")),
        tooltip=["model", "layer", "head", alt.Tooltip("sink logit:Q", format=".2f"),
                 alt.Tooltip("share at even scores:Q", format=".1%")])
    text = heat.mark_text(fontSize=12).encode(text=alt.Text("sink logit:Q", format=".1f"), color=alt.value("black"))
    show_chart((heat + text).properties(height=200, width=300).facet(column=alt.Column("model:N", title=None)),
               sinks, "sink_logits",
               "Share at even scores: the weight the sink takes from a row of 64 keys that all score the same.")
