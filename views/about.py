"""About: the methods, how the shipped checkpoints were trained, and how to rebuild them."""
import altair as alt
import pandas as pd
import streamlit as st

from posviz.slides import extremes_sentence
from views._charts import legend_for, method_scales
from views._explore import chart
from views._checkpoints import VAL_BPB_HELP, shipped_checkpoint_json
from views._page import page_header, plain, repo_root
from posviz.display import display_name
from posviz.explore import about, home
from posviz.models.checkpoint_files import models_dir
from posviz.positions import POSITION_METHODS, method_names

page_header(
    "Methods & checkpoints",
    "Where every number in this app comes from: the methods, the one training recipe, and the shipped checkpoints.",
)

st.header("The methods")
methods = pd.DataFrame([{
    "method": display_name(name),
    "summary": POSITION_METHODS[name].summary,
    "absolute / relative": POSITION_METHODS[name].kind if POSITION_METHODS[name].kind != "none" else "neither",
    "learned parameters": "yes" if POSITION_METHODS[name].learned else "no",
    "acts on": home.ACTS_ON_LABEL.get(POSITION_METHODS[name].acts_on, POSITION_METHODS[name].acts_on),
    "paper": f"[paper ↗]({POSITION_METHODS[name].paper})",
} for name in method_names()])
# A static table, not a grid: its cells wrap, so every summary is read whole (the grid cut them off).
# Every cell is this app's own text (the methods' class attributes), rendered as Markdown for the links.
st.table(methods, hide_index=True)
st.caption("Every method is one file in `posviz/positions/`, registered by name; a new file appears here on its own.")

st.header("One recipe for every checkpoint")
st.markdown(
    "The checkpoints differ **only** in their position method: same byte-level GPT-2-style model, same data and "
    "data order, same seed, token budget and schedule. Differences in the charts are the method's doing."
)
entries = shipped_checkpoint_json()
configs = {name: c for name, (c, m, problem) in entries.items() if problem is None}
metrics = {name: m for name, (c, m, problem) in entries.items() if problem is None}
left, right = st.columns([2, 3])
with left:
    st.dataframe(pd.DataFrame(about.recipe_rows()), hide_index=True, height="content")
    st.caption("posviz.training.train.TrainConfig defaults: the shipped set's recipe. Vocabulary: the 256 byte values.")
with right:
    corpus = next((c.get("corpus") for c in configs.values() if c.get("corpus")), None)
    if corpus:
        st.markdown("**Training text** (from the checkpoints' config.json)")
        st.dataframe(pd.DataFrame({"field": list(corpus), "value": [str(v) for v in corpus.values()]}), hide_index=True,
                     height="content")
curves = pd.DataFrame(about.train_curve_rows(metrics))
if not curves.empty:
    # The whole width, under the two columns: in the right one, twenty legend entries left the curves 110 px wide.
    legend = legend_for(curves["checkpoint"].nunique())

    def curve_chart():
        lines = alt.Chart(curves).mark_line().encode(
            x=alt.X("tokens:Q", title="training tokens (bytes)"),
            y=alt.Y("train_bpb:Q", title="training bits per byte", scale=alt.Scale(zero=False)),
            color=alt.Color("checkpoint:N", scale=method_scales(list(curves["checkpoint"]))[0], title="checkpoint",
                            legend=legend),
            strokeDash=alt.StrokeDash("checkpoint:N", scale=method_scales(list(curves["checkpoint"]))[1], title="checkpoint",
                                      legend=legend),
            tooltip=[alt.Tooltip("checkpoint:N"), alt.Tooltip("tokens:Q", format=","), alt.Tooltip("train_bpb:Q", format=".3f")],
        ).properties(height=300)
        return lines, curves

    # the training logs behind the chart, as numbers: a retrained checkpoint is another chart
    logged = tuple(map(tuple, curves.itertuples(index=False)))
    chart("about", ("training-curves", tuple(metrics)) + logged, curve_chart, "training_curves",
          says=lambda: extremes_sentence(curves, "checkpoint", "tokens", "train_bpb", "training bits per byte",
                                 lambda t: f"the last step ({int(t):,} training bytes)"))

st.header("The shipped checkpoints")
for name, (_, _, problem) in entries.items():
    if problem is not None:
        st.warning(f"**{plain(display_name(name))}**: {problem}", icon="⚠️")
if not entries:
    st.warning(f"No checkpoints in {models_dir()}. Run `make checkpoints` to train them.", icon="⚠️")
else:
    table = pd.DataFrame(about.shown_checkpoint_rows(about.checkpoint_rows(configs, metrics)))
    if not table.empty:
        st.dataframe(table, hide_index=True, height="content", column_config={
            about.VAL_BPB: st.column_config.TextColumn(help=VAL_BPB_HELP)})
        st.caption(f"From config.json and metrics.json in {models_dir()}. Weights are float16 safetensors. "
                   f"{about.MISSING} : not in the checkpoint's files (its training run did not record it).")

st.header("Rebuild them")
st.markdown("Train every method with the shared recipe, evaluate each (bits/byte against length, the copy probe, "
            "every RoPE scaling) into its metrics.json, and redraw the results chart and tables (docs/results.md):")
st.code("make checkpoints            # runs scripts/make_checkpoints.sh", language="bash")
st.markdown("One method at a time, or one evaluation:")
st.code("python -m posviz.train --method rope --out models/rope\n"
        "python -m posviz.evaluate --checkpoint models/rope --write", language="bash")

readme = repo_root() / "README.md"
st.header("More")
if readme.is_file():
    st.markdown("The repository's README.md (in its root folder) has the overview, installation and hosting; "
                "docs/results.md has every results table and what it shows against the papers.")
    with st.expander("Read README.md here"):
        st.markdown(readme.read_text(encoding="utf-8", errors="replace"))
else:
    st.info("README.md is not in this copy of the repository; see the project page it came from.", icon="ℹ️")
