"""The Attention biases page's chart builders: each takes the numbers (posviz.explore.attention_biases) and
returns (Altair chart, the data behind it), for ``views/_explore.chart`` to keep under the view's key.
Nothing here computes a bias; nothing is drawn until a section shows the chart.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from views._charts import method_scales

DISTANCE_TICKS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
LOG10_FLOOR = -24  # weights below 1e-24 are drawn on the bottom edge: they are zero for any purpose


def distance_axis(title: str, n_keys: int) -> alt.X:
    return alt.X("distance:Q", title=title, scale=alt.Scale(type="symlog"),
                 axis=alt.Axis(values=[t for t in DISTANCE_TICKS if t < n_keys], format=",d"))


def weight_chart(columns: dict, series_title: str, n_keys: int, sort=None) -> tuple[alt.Chart, pd.DataFrame]:
    """Largest-weight curves (log10 on the y axis, symlog distance); the section writes the title above."""
    df = pd.DataFrame(columns)
    lowest = min(-1, int(np.floor(df["log10_max_weight"].min()))) if len(df) else -1
    chart = alt.Chart(df).mark_line().encode(
        x=distance_axis("distance from the query to the relevant key (positions, symlog scale)", n_keys),
        y=alt.Y("log10_max_weight:Q", title="largest attention weight it can get (log scale)",
                scale=alt.Scale(domain=[max(LOG10_FLOOR, lowest), 0], clamp=True),
                axis=alt.Axis(tickMinStep=1, labelFlush=True, labelExpr="datum.value == 0 ? '1' : '1e' + datum.value")),
        color=alt.Color("series:N", title=series_title, sort=sort, legend=alt.Legend(labelLimit=320)),
        tooltip=[alt.Tooltip("series:N", title=series_title), alt.Tooltip("distance:Q"),
                 alt.Tooltip("max_weight:Q", title="largest weight", format=".3g")],
    ).properties(height=320)
    return chart, df


def far_rule(far: int) -> alt.Chart:
    return alt.Chart(pd.DataFrame({"distance": [far]})).mark_rule(strokeDash=[5, 4], color="gray").encode(
        x=alt.X("distance:Q"))


def slope_chart(slopes: pd.DataFrame) -> tuple[alt.Chart, pd.DataFrame]:
    chart = alt.Chart(slopes).mark_line(point=alt.OverlayMarkDef(size=70)).encode(
        x=alt.X("head:O", title="head"), y=alt.Y("slope:Q", title=["slope m (logits per", "position, log scale)"],
                                                 # no round domain end at 1: its label stuck out of the chart
                                                 scale=alt.Scale(type="log", nice=False, domain=[
                                                     float(slopes["slope"].min()) / 1.5, float(slopes["slope"].max()) * 1.5])),
        tooltip=[alt.Tooltip("head:O"), alt.Tooltip("slope:Q", format=".4g"),
                 alt.Tooltip("half_weight_distance:Q", title="distance that halves the weight", format=",.1f")],
    ).properties(height=300)
    return chart, slopes


def published_slope_chart(facts: dict) -> tuple[alt.Chart, pd.DataFrame]:
    """A published ALiBi model's slope per head beside the paper's, as bars on a log axis."""
    slope_table = pd.DataFrame(facts["columns"])
    own, paper = f"{facts['name']} (as it adds them)", f"ALiBi paper, {facts['n_head']} heads"
    bars = pd.concat([slope_table.assign(series=own),
                      slope_table.assign(series=paper, slope=slope_table["paper_slope"],
                                         half_weight_distance=slope_table["paper_half_weight_distance"])],
                     ignore_index=True)[["series", "head", "slope", "half_weight_distance", "ratio"]]
    low, high = float(bars["slope"].min()), float(bars["slope"].max())
    chart = alt.Chart(bars).mark_bar().encode(
        x=alt.X("head:O", title="head", axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("series:N", sort=[own, paper]),
        y=alt.Y("slope:Q", title=["slope (logits per token", "of distance, log scale)"],
                scale=alt.Scale(type="log", nice=False, domain=[low / 1.5, high * 1.5])),
        y2=alt.Y2Datum(low / 1.5),  # bars rise from the bottom of the log axis (it has no 0)
        color=alt.Color("series:N", title=None, sort=[own, paper], legend=alt.Legend(orient="bottom", labelLimit=400)),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip("head:O"), alt.Tooltip("slope:Q", format=".4g"),
                 alt.Tooltip("half_weight_distance:Q", title="weight halves every (tokens)", format=",.1f"),
                 alt.Tooltip("ratio:Q", title="model / paper", format=".4g")],
    ).properties(height=300)
    return chart, bars


def bucket_chart(buckets: pd.DataFrame) -> tuple[alt.Chart, pd.DataFrame]:
    # the legend reads in words, not the table's column names
    shown = buckets.rename(columns={"causal": "causal (decoder)", "bidirectional_before": "bidirectional, key before",
                                    "bidirectional_after": "bidirectional, key after"})
    bucket_long = shown.melt(id_vars="distance", var_name="direction", value_name="bucket")
    chart = alt.Chart(bucket_long).mark_line(interpolate="step-after").encode(
        x=alt.X("distance:Q", title="distance between query and key (positions)"),
        y=alt.Y("bucket:Q", title="bucket index"),
        color=alt.Color("direction:N", title="bucketing"),
        tooltip=[alt.Tooltip("direction:N"), alt.Tooltip("distance:Q"), alt.Tooltip("bucket:Q")],
    ).properties(height=300)
    return chart, buckets


def learned_bias_chart(per_head: pd.DataFrame, n_keys: int) -> tuple[alt.Chart, pd.DataFrame]:
    """A learned bias by distance, one step line per head (T5's buckets)."""
    chart = alt.Chart(per_head).mark_line(interpolate="step-after").encode(
        x=distance_axis("distance (positions, symlog scale)", n_keys),
        y=alt.Y("bias:Q", title="learned bias (logits)"), color=alt.Color("head:N"),
        tooltip=[alt.Tooltip("head:N"), alt.Tooltip("distance:Q"), alt.Tooltip("bias:Q", format=".3f")],
    ).properties(height=300)
    return chart, per_head


def method_curves_chart(curves: pd.DataFrame, methods: list[str], n_curve: int, train_length: int
                        ) -> tuple[alt.LayerChart, pd.DataFrame]:
    """Every distance-only method's bias by distance, one line per head, with the training length dashed."""
    curve_chart = alt.Chart(curves).mark_line().encode(
        x=distance_axis("distance from the query (positions, symlog scale)", n_curve),
        y=alt.Y("bias:Q", title="bias added to the logit (symlog scale)", scale=alt.Scale(type="symlog")),
        color=alt.Color("method:N", title="method", scale=method_scales(methods)[0]),
        detail="head:N",
        tooltip=["method", alt.Tooltip("head:N"), alt.Tooltip("distance:Q", format=","), alt.Tooltip("bias:Q", format=".3f")],
    ).properties(height=340)
    train_rule = alt.Chart(pd.DataFrame({"distance": [train_length - 1]})).mark_rule(
        strokeDash=[4, 3], color="gray").encode(x="distance:Q")
    return curve_chart + train_rule, curves


def formula_chart(df: pd.DataFrame, n_keys: int) -> tuple[alt.Chart, pd.DataFrame]:
    """Curves of a formula by distance (KERPLE's by hand, next to an ALiBi head)."""
    chart = alt.Chart(df).mark_line().encode(
        x=distance_axis("distance (positions, symlog scale)", n_keys), y=alt.Y("bias:Q", title="bias (logits)"),
        color=alt.Color("curve:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=400)),
        tooltip=["curve", alt.Tooltip("distance:Q", format=","), alt.Tooltip("bias:Q", format=".3f")]).properties(height=260)
    return chart, df


def normalised_distance_chart(norm_df: pd.DataFrame, n_keys: int) -> tuple[alt.Chart, pd.DataFrame]:
    chart = alt.Chart(norm_df).mark_line().encode(
        x=distance_axis("distance from the last query (positions, symlog scale)", n_keys),
        y=alt.Y("normalised:Q", title="ψ(d) / ψ(max(L, i))", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("context:N", title="context", sort=None),
        tooltip=["context", alt.Tooltip("distance:Q", format=","), alt.Tooltip("normalised:Q", format=".3f")]).properties(height=260)
    return chart, norm_df


def head_curves_chart(curves: pd.DataFrame, n_keys: int) -> tuple[alt.Chart, pd.DataFrame]:
    """One layer's bias per head at two context lengths (solid and dashed)."""
    chart = alt.Chart(curves).mark_line().encode(
        x=distance_axis("distance from the query (positions, symlog scale)", n_keys),
        y=alt.Y("bias:Q", title="bias added to the logit"),
        color=alt.Color("head:N", title="head"),
        strokeDash=alt.StrokeDash("context:N", title="context", sort=None),
        tooltip=["head", "context", alt.Tooltip("distance:Q", format=","), alt.Tooltip("bias:Q", format=".3f")],
    ).properties(height=300)
    return chart, curves


def stacked_terms_chart(rows: pd.DataFrame, order: list[str]) -> tuple[alt.LayerChart, pd.DataFrame]:
    """Transformer-XL's terms per key, stacked, with their sum as a black tick."""
    stacked = alt.Chart(rows).mark_bar().encode(
        x=alt.X("label:N", title="key (position and byte)", sort=None),
        y=alt.Y("value:Q", title="contribution to the logit", stack="zero"),
        color=alt.Color("term:N", title="term", sort=order, legend=alt.Legend(orient="bottom")),
        order=alt.Order("term_order:Q"),
        tooltip=["label", "term", alt.Tooltip("value:Q", format=".3f"), alt.Tooltip("total:Q", title="logit", format=".3f"),
                 alt.Tooltip("weight:Q", title="attention weight", format=".3f")],
    ).transform_calculate(term_order=f"indexof({order}, datum.term)").properties(height=300)
    total = alt.Chart(rows[rows["term"] == order[0]]).mark_tick(color="black", thickness=2, size=14).encode(
        x=alt.X("label:N", sort=None), y="total:Q", tooltip=[alt.Tooltip("total:Q", title="logit", format=".3f")])
    return stacked + total, rows


def key_weight_chart(weights: pd.DataFrame) -> tuple[alt.Chart, pd.DataFrame]:
    chart = alt.Chart(weights).mark_bar(color="#555").encode(
        x=alt.X("label:N", title="key (position and byte)", sort=None), y=alt.Y("weight:Q", title="attention weight"),
        tooltip=["label", alt.Tooltip("weight:Q", format=".3f")]).properties(height=220)
    return chart, weights
