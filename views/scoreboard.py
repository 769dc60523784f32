"""The scoreboard: every shipped checkpoint, and the rope checkpoint under each scaling and remap, in one sortable,
exportable table (posviz/labs/scoreboard.py reads the numbers from metrics.json)."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from posviz.labs import scoreboard
from posviz.labs.key_value import EFFECTIVE_KEEP
from posviz.models.hf.settings import deployer_models
from posviz.models.interface import open_model
from posviz.slides import ranking_sentence
from views._charts import csv_file, show_chart
from views._page import page_header, plain, usable_checkpoints
from views._url import qp_choice, sync_url

page_header("Scoreboard", "Every checkpoint, scaling and remap in one table: the one a talk puts on a slide.")
st.markdown(
    "One row per shipped checkpoint, and per inference-time scaling and training-free remap of the RoPE checkpoint; "
    "then each published model this server lists, plain and under each scaling and remap it has stored results for "
    "(in its own tokens, at multiples of its own context). "
    "**Bits per byte** (lower is better) on the held-out evaluation text at 1×, 4× and 16× the trained context, each "
    "with how far it moves with the evaluation windows where they were stored. **Copy ratio**: a stretch of text "
    f"repeated {scoreboard.COPY_GAP_MULTIPLE}× the context later, its second copy's bits against the same bytes with no "
    "first copy (1.00: the model does not copy at all). **Effective length**: the longest multiple of the context at "
    "which a name's value planted in the text (at three depths) is still recalled with at least "
    f"{EFFECTIVE_KEEP:.0%} of the bits it saves at 1×, and at every shorter multiple. A flat perplexity curve with a "
    "short effective length is a model that reads far text without using it.")
checkpoints, models = usable_checkpoints(open_model)
# the published models a deployer lists ($POSVIZ_MODELS), with what python -m posviz_tools.measure_published stored
rows = pd.DataFrame(scoreboard.scoreboard_rows(models) + scoreboard.published_rows(deployer_models(), open_model))
if rows.empty:
    st.info("No checkpoint has stored its evaluation yet: run `python -m posviz.evaluate_all`.", icon="ℹ️")
    st.stop()
EVERY = "every row"
choices = [EVERY] + list(dict.fromkeys(rows["kind"]))
shown = st.selectbox("Rows", choices, index=choices.index(qp_choice("rows", EVERY, choices)), key="w_kinds",
                     help="The checkpoints as trained, and the RoPE ones under each scaling (frequencies) and remap "
                          "(positions).")
sync_url(rows=shown)
table = rows if shown == EVERY else rows[rows["kind"] == shown]
if table.empty:
    st.info("Pick at least one kind of row.", icon="ℹ️")
    st.stop()
MAIN = ["checkpoint", "kind"] + [f"bpb {m}×" for m in scoreboard.MULTIPLES] + ["copy ratio", "effective length",
                                                                                 "KV cache (sliding window)"]
seeded = table["seeds"].fillna(1) > 1
if seeded.any():  # beside the values: how many runs stand behind them (their ranges in the table below)
    MAIN.insert(MAIN.index("copy ratio"), "seeds")
shown_table = pd.DataFrame(scoreboard.shown_rows(table.to_dict("records")), columns=table.columns)
st.dataframe(shown_table[MAIN], hide_index=True, width="stretch", height="content",
             column_config={"checkpoint": st.column_config.TextColumn(width="medium"),  # "RoPE + Leaky ReRoPE" whole
                            "seeds": st.column_config.TextColumn(
                                help="Training runs of this recipe (other seeds: other initial weights and data "
                                     "order); their ranges are in the table below.")})
if seeded.any():  # each range whole: in the main table's narrow column it was cut after its first length
    st.markdown("**Across training seeds:** the lowest–highest bits per byte over each recipe's runs")
    st.dataframe(shown_table[seeded.to_numpy()][["checkpoint", "training seeds"]], hide_index=True, width="stretch",
                 height="content", column_config={"checkpoint": st.column_config.TextColumn(width="medium")})
row = st.container(horizontal=True, vertical_alignment="center")
row.download_button("Table (CSV)", csv_file(table), file_name="posviz-scoreboard.csv", mime="text/csv",
                    key="csv-scoreboard", width="content", on_click="ignore")
row.caption("Click a column's header to sort by it. Every number is read from the checkpoints' metrics.json "
            "(`python -m posviz.evaluate_all`); a scaling's and a remap's 4× and 16× are each run with the settings that "
            "cover that length, their effective length with the settings for 16×. The CSV also holds the intervals and "
            f"the reasons below. {scoreboard.MISSING} : no number — the model cannot run that far (a learned table has no "
            "rows past its length), or the evaluation does not store it (a scaling's or a remap's copy ratio and intervals). "
            f"{scoreboard.NOT_MEASURED}: a published model's number that no run has stored "
            "(`python -m posviz_tools.measure_published`).")
with st.expander("How far each score moves with the evaluation windows (95 % intervals), and why each effective length"):
    st.dataframe(shown_table[["checkpoint"] + [f"{m}× interval" for m in scoreboard.MULTIPLES]], hide_index=True,
                 width="stretch", height="content")
    st.markdown("\n".join(f"- **{plain(r.checkpoint)}**: {r.why}" for r in table.itertuples() if r.why))

st.subheader("Perplexity far out against the length a model still recalls")
ORDER = ["not measurable", "1×", "2×", "4×", "8×", "16×"]
points = table[table["bpb 16×"].notna() & table["effective length"].isin(ORDER)]
KINDS = ["checkpoint", "scaling", "remap", scoreboard.PUBLISHED]  # one colour and one shape each, named in the key
kind_scale = dict(domain=KINDS, range=["#0072B2", "#E69F00", "#CC79A7", "#009E73"])
x = alt.X("effective length:O", sort=ORDER, scale=alt.Scale(domain=ORDER), title="effective length (× context)",
          axis=alt.Axis(labelAngle=0))
y = alt.Y("bpb 16×:Q", title="bits/byte at 16× (lower is better)", scale=alt.Scale(zero=False))
dots = alt.Chart(points).mark_point(filled=True, size=110).encode(
    x=x, y=y,
    color=alt.Color("kind:N", title="kind", scale=alt.Scale(**kind_scale), legend=alt.Legend(orient="bottom")),
    shape=alt.Shape("kind:N", title="kind", scale=alt.Scale(domain=KINDS), legend=alt.Legend(orient="bottom")),
    tooltip=["checkpoint", "kind", alt.Tooltip("bpb 1×:Q", format=".3f"), alt.Tooltip("bpb 16×:Q", format=".3f"),
             "effective length", "why"],
)
# the best and the worst of each kind named beside their dots (every name would overlap on 35 dots)
named = scoreboard.extremes_by(points, "kind", "bpb 16×")
labels = alt.Chart(named).mark_text(align="left", dx=9, dy=-9).encode(
    x=x, y=y, text="checkpoint:N", color=alt.Color("kind:N", title="kind", scale=alt.Scale(**kind_scale),
                                                   legend=alt.Legend(orient="bottom")))
chart = (dots + labels).properties(height=340)
show_chart(chart, points, "posviz-scoreboard-points",
           "A model low on this chart but at the left reads 16× its context well and recalls little of it: its flat "
           "curve comes from the near text.",
           says=lambda: ranking_sentence(points, "checkpoint", "bpb 16×", "bits per byte at 16× its context"))
