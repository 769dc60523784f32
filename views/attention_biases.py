"""Attention biases: ALiBi, T5, KERPLE, FIRE, Shaw, NEZHA and Transformer-XL — and how far each lets a token reach."""
import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from views._charts import method_scales, metric_rows, show_chart
from views._checkpoints import folder_stamp, shipped_checkpoint_json, shipped_model
from views._matrices import show_matrix
from views._page import page_header
from views._published_positions import analysed, published_section, section_failed
from views._url import qp_bool, qp_choice, qp_float, qp_int, sync_url
from posviz.explore import attention_biases
from posviz.models.checkpoint_files import shipped_checkpoints
from posviz.errors import PosvizError
from posviz.positions import POSITION_METHODS
from posviz.limits import CACHE_ENTRIES
from posviz.positions.t5 import T5Options
from posviz.positions.fire import THRESHOLD_FRACTION, FireOptions
from posviz.positions.nezha import NezhaOptions
from posviz.positions.shaw import ShawOptions
from posviz.training.train import TrainConfig

CONTEXTS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
BUCKETS = [8, 16, 32, 64, 128]
T5_MAX_DISTANCES = [16, 32, 64, 128, 256, 512, 1024]

page_header(
    "Attention biases: ALiBi, T5, KERPLE, FIRE, Shaw, NEZHA, Transformer-XL",
    "These methods leave the token vectors alone and add a number to each attention logit that depends on how far "
    "the key is from the query. The size of that number decides what a head can still see far away.",
)


DISTANCE_TICKS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
LOG10_FLOOR = -24  # weights below 1e-24 are drawn on the bottom edge: they are zero for any purpose


def distance_axis(title: str, n_keys: int) -> alt.X:
    return alt.X("distance:Q", title=title, scale=alt.Scale(type="symlog"),
                 axis=alt.Axis(values=[t for t in DISTANCE_TICKS if t < n_keys], format=",d"))


def weight_chart(columns: dict, title: str, series_title: str, n_keys: int, sort=None) -> tuple[alt.Chart, pd.DataFrame]:
    """Largest-weight curves (log10 on the y axis, symlog distance); the title is drawn above as text."""
    st.markdown(f"**{title}**")
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


# -- what "largest weight" means -------------------------------------------------------------------
st.header("Can a far but relevant token still get attention?")
st.markdown(
    "For one query with **n** visible keys, suppose the relevant key's content score q·k/√d beats every other key "
    "by at most a **margin** Δ (in logits). The largest softmax weight it can then get is reached when all other "
    "keys score exactly Δ lower, and equals **1 / (1 + e^(−Δ) · Σ_{j≠d} e^(b_j − b_d))**, with b the position "
    "bias. With no bias this is 1 / (1 + e^(−Δ)(n − 1)): a far key is only diluted, never suppressed."
)
c1, c2, c3 = st.columns(3)
n_keys = c1.select_slider("visible keys n (context length)", CONTEXTS,
                          value=int(qp_choice("ctx", "4096", [str(c) for c in CONTEXTS])), key="ctx",
                          format_func=lambda c: f"{c:,}")
margin = c2.slider("content margin Δ (logits)", 0.0, 30.0, qp_float("margin", 5.0, 0.0, 30.0), step=0.5, key="margin",
                   help="How much more the relevant key matches the query than any other key does.")
far = c3.slider("distance of the relevant key (positions)", 0, n_keys - 1,
                min(qp_int("far", n_keys // 2, 0, max(CONTEXTS) - 1), n_keys - 1), key=f"far-{n_keys}")
grid = attention_biases.distance_grid(n_keys)
no_bias = attention_biases.no_bias_log_max_weight(n_keys, margin)
summary: dict[str, np.ndarray] = {"no bias (NoPE)": no_bias}

# -- ALiBi -----------------------------------------------------------------------------------------------
st.header("ALiBi: a fixed slope per head")
c1, c2, c3 = st.columns(3)
alibi_config = (shipped_checkpoint_json().get("alibi") or (None, None, None))[0] or {}
shipped_heads = int(alibi_config.get("model", {}).get("n_head", 8))  # default: what the shipped model uses
heads = c1.number_input("heads", 1, 64, qp_int("heads", shipped_heads, 1, 64), key="heads",
                        help="Any count works; for non-powers of two ALiBi interleaves the slopes of the next power of two.")
alibi_head = c2.slider("head shown", 0, heads - 1, min(qp_int("ahead", 0, 0, 63), heads - 1), key=f"ahead-{heads}")
alibi_len = c3.slider("positions in the bias matrix", 8, 128, qp_int("alen", 32, 8, 128), step=8, key="alen")
slopes = pd.DataFrame(attention_biases.alibi_slope_table(heads))
left, right = st.columns(2)
with left:
    slope_chart = alt.Chart(slopes).mark_line(point=alt.OverlayMarkDef(size=70)).encode(
        x=alt.X("head:O", title="head"), y=alt.Y("slope:Q", title=["slope m (logits per", "position, log scale)"],
                                                 # no round domain end at 1: its label stuck out of the chart
                                                 scale=alt.Scale(type="log", nice=False, domain=[
                                                     float(slopes["slope"].min()) / 1.5, float(slopes["slope"].max()) * 1.5])),
        tooltip=[alt.Tooltip("head:O"), alt.Tooltip("slope:Q", format=".4g"),
                 alt.Tooltip("half_weight_distance:Q", title="distance that halves the weight", format=",.1f")],
    ).properties(height=300)
    show_chart(slope_chart, slopes, f"alibi_slopes_{heads}")
    st.dataframe(slopes.rename(columns={"slope": "slope m", "one_logit_distance": "−1 logit at",
                                        "half_weight_distance": "weight halves every"}),
                 hide_index=True, height="content")
with right:
    st.markdown(f"**Bias of head {alibi_head}** (slope {slopes['slope'][alibi_head]:.4g}); blank = future keys, masked")
    show_matrix(attention_biases.alibi_bias_matrices(heads, alibi_len)[alibi_head], f"alibi_bias_head{alibi_head}",
                x_title="key position", y_title="query position", value_title="bias (logits)")


@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
def alibi_bounds(heads: int, n_keys: int, margin: float) -> np.ndarray:
    return attention_biases.log_max_attention_weight(attention_biases.alibi_bias_by_distance(heads, n_keys), margin)  # (H, n)


alibi_lw = alibi_bounds(heads, n_keys, margin)
summary[f"ALiBi, most lenient of {heads} heads"] = attention_biases.strongest_head(alibi_lw)
series = {f"head {h}": alibi_lw[h] for h in range(heads)}
series["no bias"] = no_bias
chart, df = weight_chart(attention_biases.max_weight_columns(series, grid),
                         f"Largest weight per head: ALiBi, {heads} heads, n = {n_keys:,} keys, margin Δ = {margin:g}",
                         "head", n_keys, sort=list(series))
show_chart(chart, df, f"alibi_max_weight_{heads}h_n{n_keys}",
           "The penalty grows linearly with distance, so every head's ceiling falls exponentially: past a few "
           "“half-weight distances” no content margin can rescue a key. Curves below 1e-24 run along the bottom edge.")

# -- published ALiBi models ($POSVIZ_MODELS) ------------------------------------------------------------
published = published_section(
    "alibi", "ALiBi in published models",
    "BLOOM, Falcon-RW and MPT use ALiBi. Their slopes as each model adds them to its attention logits, read from "
    "its own bias builder, next to the paper's geometric slopes for the same number of heads.")
if published is not None:
    try:
        facts = analysed(published, "alibi-slopes", lambda: attention_biases.published_alibi(published))
    except PosvizError as exc:
        section_failed(published, exc)
    else:
        lo, hi = facts["ratio_range"]
        metric_rows([
            dict(label="heads", value=f"{facts['n_head']}"),
            dict(label="head dimension", value=f"{facts['head_dim']}"),
            dict(label="slope / the paper's", value=f"{lo:.3g}" if abs(hi - lo) <= 1e-3 * hi else f"{lo:.3g} to {hi:.3g}",
                 help="Each head's slope as the model adds it, over the paper's slope for that head."),
        ], per_row=3)
        for note in facts["notes"]:
            st.info(note, icon="ℹ️")
        slope_table = pd.DataFrame(facts["columns"])
        own, paper = f"{facts['name']} (as it adds them)", f"ALiBi paper, {facts['n_head']} heads"
        bars = pd.concat([slope_table.assign(series=own),
                          slope_table.assign(series=paper, slope=slope_table["paper_slope"],
                                             half_weight_distance=slope_table["paper_half_weight_distance"])],
                         ignore_index=True)[["series", "head", "slope", "half_weight_distance", "ratio"]]
        low, high = float(bars["slope"].min()), float(bars["slope"].max())
        st.markdown(f"**{facts['name']}: ALiBi slope of each head, as the model adds it and in the paper**")
        published_slopes = alt.Chart(bars).mark_bar().encode(
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
        show_chart(published_slopes, bars, f"published_{facts['name']}_alibi_slopes",
                   "A head's bias falls by its slope for every token of distance: a steeper head stays local. "
                   "Equal bars: the model adds the paper's slopes; the notes above say where it does not.")

# -- T5 ---------------------------------------------------------------------------------------------------
st.header("T5: learned biases per distance bucket")
t5_model, t5_problem = shipped_model("t5")
t5 = None
if t5_model is not None:
    folder = shipped_checkpoints()["t5"]

    @st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
    def t5_params(folder: str, stamp: tuple, _model) -> dict:
        return attention_biases.t5_learned(_model)

    t5 = t5_params(str(folder), folder_stamp(folder), t5_model)
defaults = T5Options() if t5 is None else T5Options(t5["num_buckets"], t5["max_distance"])
c1, c2, c3, c4 = st.columns(4)
num_buckets = c1.select_slider("buckets", BUCKETS, value=int(qp_choice(
    "nb", str(defaults.num_buckets) if defaults.num_buckets in BUCKETS else "32", [str(b) for b in BUCKETS])), key="nb")
max_distance = c2.select_slider("max_distance (positions)", T5_MAX_DISTANCES, value=int(qp_choice(
    "md", str(defaults.max_distance) if defaults.max_distance in T5_MAX_DISTANCES else "128",
    [str(d) for d in T5_MAX_DISTANCES])), key="md")
bidirectional = c3.toggle("bidirectional (encoder)", qp_bool("bidir", False), key="bidir",
                          help="An encoder gives half the buckets to keys after the query; a causal decoder uses all for keys before.")
t5_len = c4.slider("positions in the matrix", 8, 128, qp_int("tlen", 48, 8, 128), step=8, key="tlen")
if max_distance <= num_buckets // 2:
    st.warning(f"max_distance must exceed half the buckets ({num_buckets // 2}); showing max_distance = "
               f"{num_buckets} instead.", icon="⚠️")
    max_distance = num_buckets
buckets = pd.DataFrame(attention_biases.t5_bucket_table(4 * max_distance, num_buckets, max_distance))
bucket_long = buckets.melt(id_vars="distance", var_name="direction", value_name="bucket")
left, right = st.columns(2)
with left:
    bucket_chart = alt.Chart(bucket_long).mark_line(interpolate="step-after").encode(
        x=alt.X("distance:Q", title="distance between query and key (positions)"),
        y=alt.Y("bucket:Q", title="bucket index"),
        color=alt.Color("direction:N", title="bucketing"),
        tooltip=[alt.Tooltip("direction:N"), alt.Tooltip("distance:Q"), alt.Tooltip("bucket:Q")],
    ).properties(height=300)
    show_chart(bucket_chart, buckets, f"t5_buckets_{num_buckets}_{max_distance}",
               "Small distances get a bucket each (causal: the first half of the buckets; bidirectional: the first "
               f"quarter on each side), then buckets widen log-spaced; every distance from {max_distance} on shares "
               "the last bucket.")
with right:
    st.markdown(f"**Bucket of each (query, key)**, {'bidirectional' if bidirectional else 'causal; blank = masked'}")
    show_matrix(attention_biases.t5_bucket_matrix(t5_len, bidirectional, num_buckets, max_distance),
                f"t5_bucket_matrix_{'bi' if bidirectional else 'causal'}", x_title="key position",
                y_title="query position", value_title="bucket")

st.subheader("What the `t5` checkpoint learned")
if t5 is None:
    st.warning(t5_problem, icon="⚠️")
else:
    H = t5["weights"].shape[1]
    st.markdown(f"{t5['num_buckets']} buckets × {H} heads, max_distance {t5['max_distance']} (the checkpoint's own "
                "settings; the controls above do not change them). Causal model: all buckets are for keys before the query.")
    t5_head = st.slider("head shown", 0, H - 1, min(qp_int("thead", 0, 0, 63), H - 1), key="thead")
    bias_by_distance = attention_biases.t5_bias_by_distance(t5["weights"], n_keys, t5["max_distance"])  # (H, n)
    per_head = pd.DataFrame({"distance": np.tile(grid, H), "head": np.repeat(np.arange(H), grid.size),
                             "bias": bias_by_distance[:, grid].ravel()})
    left, right = st.columns(2)
    with left:
        bias_chart = alt.Chart(per_head).mark_line(interpolate="step-after").encode(
            x=distance_axis("distance (positions, symlog scale)", n_keys),
            y=alt.Y("bias:Q", title="learned bias (logits)"), color=alt.Color("head:N"),
            tooltip=[alt.Tooltip("head:N"), alt.Tooltip("distance:Q"), alt.Tooltip("bias:Q", format=".3f")],
        ).properties(height=300)
        show_chart(bias_chart, per_head, "t5_learned_bias")
    with right:
        st.markdown(f"**Learned bias of head {t5_head}**; blank = masked")
        show_matrix(attention_biases.t5_bias_matrix(t5["weights"], t5_head, t5_len, t5["max_distance"]), f"t5_bias_head{t5_head}",
                    x_title="key position", y_title="query position", value_title="T5 bias (logits)", scheme="redblue")

    @st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
    def t5_bounds(folder: str, stamp: tuple, n_keys: int, margin: float, _weights) -> np.ndarray:
        return attention_biases.log_max_attention_weight(attention_biases.t5_bias_by_distance(_weights, n_keys, t5["max_distance"]), margin)

    t5_lw = t5_bounds(str(folder), folder_stamp(folder), n_keys, margin, t5["weights"])
    summary[f"T5, most lenient of {H} heads"] = attention_biases.strongest_head(t5_lw)
    series = {f"head {h}": t5_lw[h] for h in range(H)}
    series["no bias"] = no_bias
    chart, df = weight_chart(attention_biases.max_weight_columns(series, grid),
                             f"Largest weight per head: T5 checkpoint, n = {n_keys:,} keys, margin Δ = {margin:g}",
                             "head", n_keys, sort=list(series))
    show_chart(chart, df, f"t5_max_weight_n{n_keys}",
               f"Past {t5['max_distance']} positions every key shares one bias, so the ceiling stops falling: far keys "
               "are diluted by their many equals, not pushed down further.")

# -- Shaw ---------------------------------------------------------------------------------------------------
st.header("Shaw: relative keys, clipped at distance k")
shaw_model, shaw_problem = shipped_model("shaw")
shaw = None
if shaw_model is not None:
    shaw_folder = shipped_checkpoints()["shaw"]

    @st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
    def shaw_params(folder: str, stamp: tuple, _model) -> dict:
        return attention_biases.shaw_learned(_model)

    shaw = shaw_params(str(shaw_folder), folder_stamp(shaw_folder), shaw_model)
default_k = ShawOptions().max_distance if shaw is None else shaw["max_distance"]
c1, c2, c3 = st.columns(3)
clip_k = c1.slider("clip distance k", 1, 128, qp_int("sk", min(default_k, 128), 1, 128), key="sk")
shaw_len = c2.slider("positions in the matrix", 8, 128, qp_int("slen", 48, 8, 128), step=8, key="slen")
causal = c3.toggle("causal (decoder)", qp_bool("scausal", True), key="scausal")
st.markdown(f"**Which relative embedding each (query, key) uses** — {'0…k: distance, clipped at k; blank = masked' if causal else '0…2k: k + clip(key − query, −k, k)'}")
show_matrix(attention_biases.shaw_clip(shaw_len, clip_k, causal), f"shaw_clip_k{clip_k}", x_title="key position",
            y_title="query position", value_title="embedding index")
st.caption(f"Every distance ≥ {clip_k} uses the same embedding: the model cannot tell {clip_k} bytes back from "
           f"{10 * clip_k:,}.")

st.subheader("What the `shaw` checkpoint allows")
if shaw is None:
    st.warning(shaw_problem, icon="⚠️")
else:
    rel = shaw["rel_keys"]
    c1, c2, c3 = st.columns(3)
    layer = c1.slider("layer", 0, rel.shape[0] - 1, min(qp_int("layer", 0, 0, 63), rel.shape[0] - 1), key="layer")
    any_query = c2.toggle("any query (no bound on ‖q‖)", qp_bool("anyq", False), key="anyq")
    q_norm = c3.slider("query norm bound ‖q‖", 0.0, 50.0, qp_float("qnorm", 10.0, 0.0, 50.0), step=0.5, key="qnorm",
                       disabled=any_query)
    st.markdown(
        "Shaw's bias q·a_clip(d)/√d depends on the query, so the bound is over every query with ‖q‖ ≤ the chosen "
        "norm (by Cauchy–Schwarz, b_j − b_d ≥ −‖q‖·‖a_j − a_d‖/√d). With no bound on ‖q‖ only the keys that share "
        "the relevant key's embedding are sure to compete: nothing for d < k, every other far key beyond."
    )

    @st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
    def shaw_bound(folder: str, stamp: tuple, layer: int, n_keys: int, margin: float, q_norm, _rel) -> np.ndarray:
        return attention_biases.shaw_log_max_attention_weight(_rel[layer], n_keys, margin, q_norm)

    stamp = folder_stamp(shaw_folder)
    bound_q = shaw_bound(str(shaw_folder), stamp, layer, n_keys, margin, None if any_query else q_norm, rel)
    label = "any query" if any_query else f"‖q‖ ≤ {q_norm:g}"
    summary[f"Shaw, layer {layer}, {label}"] = bound_q
    series = {label: bound_q, "no bias": no_bias}
    chart, df = weight_chart(attention_biases.max_weight_columns(series, grid),
                             f"Largest weight: Shaw checkpoint, layer {layer} (k = {shaw['max_distance']}), "
                             f"n = {n_keys:,} keys, margin Δ = {margin:g}", "bound", n_keys)
    show_chart(chart, df, f"shaw_max_weight_layer{layer}_n{n_keys}")

# -- learned curves of distance: T5, KERPLE, FIRE next to ALiBi ----------------------------------------------
st.header("Learned curves of distance: KERPLE and FIRE next to ALiBi and T5")
st.markdown(
    "**KERPLE** (log variant) learns −r1·log(1 + r2·d) per head and layer: a penalty that grows like a logarithm, "
    "so far keys are pushed down much less than by ALiBi's straight line. **FIRE** learns any curve, per head and layer: "
    "a small MLP of ψ(d)/ψ(max(L, i)) with ψ(x) = log(c·x + 1), so every distance a query can see is squeezed into [0, 1] "
    "whatever the length. Below, each checkpoint's own bias for the last query of a context, up to 16× the "
    "training length: distances the models never saw in training."
)
curve_methods = attention_biases.distance_only_bias_methods()
train_length = int(((shipped_checkpoint_json().get("alibi") or (None,))[0] or {}).get("model", {}).get(
    "train_length", TrainConfig().train_length))
multiples = [1, 4, 16]
c1, c2 = st.columns(2)
multiple = c1.select_slider("context (× training length)", multiples, value=int(qp_choice("cmult", "16", [str(m) for m in multiples])),
                            key="cmult", format_func=lambda m: f"{m}× = {m * train_length:,} bytes")
shipped_layers = int(alibi_config.get("model", {}).get("n_layer", 4))
curve_layer = c2.slider("layer", 0, shipped_layers - 1, min(qp_int("clayer", 0, 0, 63), shipped_layers - 1), key="clayer",
                        help="KERPLE and FIRE learn one curve per head and layer; ALiBi and T5 use the same in every layer.")


@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
def learned_curves(name: str, folder: str, stamp: tuple, layer: int, n: int, _position) -> pd.DataFrame:
    layer = min(layer, _position.shape.n_layer - 1)
    return pd.DataFrame(attention_biases.bias_curves(_position, [layer], [n])).assign(method=name)


frames, missing_curves = [], []
for name in curve_methods:
    model, problem = shipped_model(name)
    if model is not None:
        folder = str(shipped_checkpoints()[name])
        frames.append(learned_curves(name, folder, folder_stamp(folder), curve_layer, multiple * train_length, model.position))
    elif not POSITION_METHODS[name].learned:  # nothing to learn: the formula is the method
        position = attention_biases.fixed_method(name, 4, shipped_heads, 32, train_length)
        frames.append(learned_curves(name, "", (), curve_layer, multiple * train_length, position))
    else:
        missing_curves.append(name)
if missing_curves:
    st.info(f"No checkpoint yet for {', '.join(missing_curves)}: its learned curve is not drawn. "
            "Train one with `python -m posviz.train --method NAME`, or run `make checkpoints`.", icon="ℹ️")
if frames:
    curves = pd.concat(frames, ignore_index=True)
    curves["series"] = curves["method"] + " · head " + curves["head"].astype(str)
    n_curve = multiple * train_length
    curve_chart = alt.Chart(curves).mark_line().encode(
        x=distance_axis("distance from the query (positions, symlog scale)", n_curve),
        y=alt.Y("bias:Q", title="bias added to the logit (symlog scale)", scale=alt.Scale(type="symlog")),
        color=alt.Color("method:N", title="method", scale=method_scales(curve_methods)[0]),
        detail="head:N",
        tooltip=["method", alt.Tooltip("head:N"), alt.Tooltip("distance:Q", format=","), alt.Tooltip("bias:Q", format=".3f")],
    ).properties(height=340)
    train_rule = alt.Chart(pd.DataFrame({"distance": [train_length - 1]})).mark_rule(strokeDash=[4, 3], color="gray").encode(x="distance:Q")
    show_chart(curve_chart + train_rule, curves, f"bias_curves_layer{curve_layer}_n{n_curve}",
               f"One line per head. Dashed: the farthest distance seen in training ({train_length - 1:,}); to its right "
               "the learned functions extrapolate. ALiBi keeps falling in a straight line (on a log axis: a steep "
               "curve), T5 goes flat after its last bucket, KERPLE bends over like a logarithm, FIRE stays inside "
               "what it learned because its input never leaves [0, 1].")
    for name in ("kerple", "fire"):  # their bounds join the side-by-side comparison below
        model, _ = shipped_model(name)
        if model is not None:
            layer = min(curve_layer, model.config.n_layer - 1)
            lw = attention_biases.log_max_attention_weight(attention_biases.bias_by_distance(model.position, layer, n_keys), margin)
            summary[f"{name.upper()}, most lenient head of layer {layer}"] = attention_biases.strongest_head(lw)

st.subheader("KERPLE's formula, by hand")
c1, c2 = st.columns(2)
r1 = c1.slider("r1 (strength)", 0.01, 4.0, qp_float("r1", 1.0, 0.01, 4.0), step=0.01, key="r1")
r2 = c2.slider("r2 (bend)", 0.01, 4.0, qp_float("r2", 0.5, 0.01, 4.0), step=0.01, key="r2")
kgrid = attention_biases.distance_grid(n_keys)
kerple_df = pd.DataFrame({"distance": np.tile(kgrid, 2),
                          "bias": np.concatenate([attention_biases.kerple_formula(r1, r2, kgrid),
                                                  -slopes["slope"][alibi_head] * kgrid]),
                          "curve": [f"KERPLE −{r1:g}·log(1 + {r2:g}·d)"] * kgrid.size + [f"ALiBi head {alibi_head}: −{slopes['slope'][alibi_head]:.3g}·d"] * kgrid.size})
kerple_chart = alt.Chart(kerple_df).mark_line().encode(
    x=distance_axis("distance (positions, symlog scale)", n_keys), y=alt.Y("bias:Q", title="bias (logits)"),
    color=alt.Color("curve:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=400)),
    tooltip=["curve", alt.Tooltip("distance:Q", format=","), alt.Tooltip("bias:Q", format=".3f")]).properties(height=260)
show_chart(kerple_chart, kerple_df, f"kerple_formula_r1_{r1:g}_r2_{r2:g}",
           f"At distance {n_keys - 1:,} KERPLE costs {-attention_biases.kerple_formula(r1, r2, [n_keys - 1])[0]:.2f} logits, "
           f"ALiBi head {alibi_head} {slopes['slope'][alibi_head] * (n_keys - 1):,.1f}: a logarithm lets far keys compete.")
kerple_model, kerple_problem = shipped_model("kerple")
if kerple_model is not None:
    learned = attention_biases.kerple_learned(kerple_model)
    table = pd.DataFrame([{"layer": l, "head": h, "r1": learned["r1"][l, h], "r2": learned["r2"][l, h]}
                          for l in range(learned["r1"].shape[0]) for h in range(learned["r1"].shape[1])])
    st.markdown("**What the `kerple` checkpoint learned** (per layer and head)")
    st.dataframe(table, hide_index=True, height="content")

st.subheader("FIRE's input: every context squeezed into [0, 1]")
fire_model, fire_problem = shipped_model("fire")
fire_layer = min(curve_layer, fire_model.config.n_layer - 1) if fire_model is not None else curve_layer
fire_facts = pd.DataFrame(attention_biases.fire_learned(fire_model)) if fire_model is not None else None
if fire_facts is not None:
    c_value, threshold = fire_facts["c"][fire_layer], fire_facts["threshold"][fire_layer]
else:  # the paper's c, and L at a quarter of the training length (FIRE's own defaults)
    c_value, threshold = FireOptions().c_init, THRESHOLD_FRACTION * train_length
norm_df = pd.DataFrame(attention_biases.fire_normalised_distance([m * train_length for m in multiples], c_value, threshold))
norm_df["context"] = norm_df["context"].map(lambda n: f"{n:,} bytes ({n // train_length}×)")
norm_chart = alt.Chart(norm_df).mark_line().encode(
    x=distance_axis("distance from the last query (positions, symlog scale)", multiples[-1] * train_length),
    y=alt.Y("normalised:Q", title="ψ(d) / ψ(max(L, i))", scale=alt.Scale(domain=[0, 1])),
    color=alt.Color("context:N", title="context", sort=None),
    tooltip=["context", alt.Tooltip("distance:Q", format=","), alt.Tooltip("normalised:Q", format=".3f")]).properties(height=260)
show_chart(norm_chart, norm_df, "fire_normalised_distance",
           f"c = {c_value:.3g}, L = {threshold:,.0f} ({f'layer {fire_layer} of the `fire` checkpoint' if fire_facts is not None else 'FIRE’s initial values: no `fire` checkpoint'}). "
           "Queries before L all use ψ(L); past it the farthest key always maps to 1, so a long context never asks the MLP "
           "about an input it has not seen: it reads far keys as 'about as far as anything I saw'.")
if fire_model is None:
    st.warning(fire_problem, icon="⚠️")
else:
    st.markdown(f"**What the `fire` checkpoint learned in layer {fire_layer}**: one curve per head (the layer slider above "
                "picks the layer). Heads that differ are what lets one head look far while another stays local.")
    fire_curves = pd.DataFrame(attention_biases.bias_curves(fire_model.position, [fire_layer],
                                                            [train_length, multiple * train_length]))
    fire_curves["context"] = fire_curves["context"].map(lambda n: f"{n:,} bytes ({n // train_length}×)")
    fire_curves["head"] = "head " + fire_curves["head"].astype(str)
    fire_chart = alt.Chart(fire_curves).mark_line().encode(
        x=distance_axis("distance from the query (positions, symlog scale)", multiple * train_length),
        y=alt.Y("bias:Q", title="bias added to the logit"),
        color=alt.Color("head:N", title="head"),
        strokeDash=alt.StrokeDash("context:N", title="context", sort=None),
        tooltip=["head", "context", alt.Tooltip("distance:Q", format=","), alt.Tooltip("bias:Q", format=".3f")],
    ).properties(height=300)
    at_train = attention_biases.bias_by_distance(fire_model.position, fire_layer, train_length)  # (H, n)
    least, most = attention_biases.far_bias_by_head(at_train)
    show_chart(fire_chart, fire_curves, f"fire_heads_layer{fire_layer}",
               f"At {train_length - 1:,} bytes, the farthest distance seen in training, the heads of layer {fire_layer} add "
               f"from {least:.1f} to {most:.1f} logits: a gentle head lets a far copy through, a steep one stays local. "
               "Solid and dashed: the same last query at two context lengths, its distances normalised by ψ of its position.")
    st.dataframe(fire_facts.rename(columns={"threshold": "L (learned)", "threshold_init": "L at start"}),
                 hide_index=True)

# -- NEZHA vs Shaw ------------------------------------------------------------------------------------------------
st.header("NEZHA: Shaw's relative keys, as fixed sinusoids")
nezha_k = shaw["max_distance"] if shaw is not None else NezhaOptions().max_distance
head_dim = shaw["rel_keys"].shape[-1] if shaw is not None else 32
st.markdown(
    f"NEZHA keeps Shaw's form, a relative key a_d per clipped distance d ≤ k added to the query's dot product, but "
    f"a_d is a sinusoid of d (as the absolute sinusoidal table is of a position), the same in every head and layer. "
    f"Left: NEZHA's table for k = {nezha_k} and head size {head_dim}; right: what Shaw learned in its place."
)
left, right = st.columns(2)
with left:
    st.markdown("**NEZHA: fixed relative keys** (row = distance d, column = feature)")
    show_matrix(attention_biases.nezha_table(nezha_k, head_dim), f"nezha_table_k{nezha_k}", x_title="feature",
                y_title="distance d", value_title="a_d", scheme="redblue")
with right:
    if shaw is None:
        st.warning(shaw_problem, icon="⚠️")
    else:
        shaw_layer = st.slider("Shaw layer", 0, shaw["rel_keys"].shape[0] - 1,
                               min(qp_int("nlayer", 0, 0, 63), shaw["rel_keys"].shape[0] - 1), key="nlayer")
        st.markdown(f"**Shaw: learned relative keys**, layer {shaw_layer}")
        show_matrix(shaw["rel_keys"][shaw_layer], f"shaw_table_layer{shaw_layer}", x_title="feature",
                    y_title="distance d", value_title="a_d", scheme="redblue")
st.caption("Smooth stripes: neighbouring distances get similar keys by construction (NEZHA). Shaw has to learn any "
           "such structure from data, one distance at a time, and rarely-seen distances stay near their random start.")

# -- Transformer-XL ----------------------------------------------------------------------------------------------
st.header("Transformer-XL: four terms decide where a query looks")
st.markdown(
    "Transformer-XL splits each logit into **content–content** q_i·k_j, **content–position** q_i·W_R R_(i−j), a "
    "**global content bias** u·k_j and a **global position bias** v·W_R R_(i−j) (R: sinusoids of the distance, "
    "W_R learned per layer, u and v learned per head). Below: one query of a real sentence, every key it can see, "
    "and how much each term adds to that key's logit."
)
txl_model, txl_problem = shipped_model("transformer_xl")
if txl_model is None:
    st.warning(txl_problem, icon="⚠️")
else:
    SENTENCE = "def area(radius):\n    return 3.14159 * radius * radius\n"
    c1, c2, c3 = st.columns(3)
    txl_layer = c1.slider("layer", 0, txl_model.config.n_layer - 1,
                          min(qp_int("xlayer", 0, 0, 63), txl_model.config.n_layer - 1), key="xlayer")
    txl_head = c2.slider("head", 0, txl_model.config.n_head - 1,
                         min(qp_int("xhead", 0, 0, 63), txl_model.config.n_head - 1), key="xhead")
    txl_query = c3.slider("query position", 1, len(SENTENCE) - 1,
                          min(qp_int("xquery", len(SENTENCE) - 8, 1, len(SENTENCE) - 1), len(SENTENCE) - 1), key="xquery")
    txl_folder = str(shipped_checkpoints()["transformer_xl"])

    @st.cache_data(max_entries=CACHE_ENTRIES, show_spinner=False)
    def txl_terms(folder: str, stamp: tuple, layer: int, _model) -> dict:
        return attention_biases.transformer_xl_terms(_model, list(SENTENCE.encode()), layer)

    terms = txl_terms(txl_folder, folder_stamp(txl_folder), txl_layer, txl_model)
    chars = [repr(c)[1:-1] for c in SENTENCE]
    rows = pd.DataFrame(attention_biases.transformer_xl_query_rows(terms, txl_head, txl_query, chars))
    rows["label"] = rows["key"].astype(str) + " " + rows["byte"]
    shares = attention_biases.deciding_term(terms, txl_head, txl_query)
    decider = max(shares, key=lambda t: abs(shares[t]))
    top_key = int(np.nanargmax(terms["weight"][txl_head, txl_query, : txl_query + 1]))
    st.markdown(f"Query **{txl_query}** (`{chars[txl_query]}`), layer {txl_layer}, head {txl_head}: it looks most at key "
                f"**{top_key}** (`{chars[top_key]}`, weight {terms['weight'][txl_head, txl_query, top_key]:.2f}). "
                f"The term that lifts that key most above the average key: **{decider}** ({shares[decider]:+.2f} logits).")
    order = list(attention_biases.TXL_TERMS)
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
    show_chart(stacked + total, rows, f"transformer_xl_terms_l{txl_layer}_h{txl_head}_q{txl_query}",
               "Bars: the four terms stacked (positive up, negative down); black tick: their sum, the logit the softmax "
               "sees. Keys whose bars reach highest get the attention.")
    weights = rows[rows["term"] == order[0]][["label", "weight"]]
    txl_weight_chart = alt.Chart(weights).mark_bar(color="#555").encode(
        x=alt.X("label:N", title="key (position and byte)", sort=None), y=alt.Y("weight:Q", title="attention weight"),
        tooltip=["label", alt.Tooltip("weight:Q", format=".3f")]).properties(height=220)
    show_chart(txl_weight_chart, weights, f"transformer_xl_weights_l{txl_layer}_h{txl_head}_q{txl_query}")
    sync_url(xlayer=txl_layer, xhead=txl_head, xquery=txl_query)

# -- side by side -----------------------------------------------------------------------------------------------
st.header(f"Side by side: a relevant key at distance {far:,}")
metric_rows([dict(label=name, value=f"{np.exp(lw[far]):.3g}",
                  help=f"Largest weight at distance {far:,} with n = {n_keys:,} and Δ = {margin:g}.")
             for name, lw in summary.items()], per_row=3)
chart, df = weight_chart(attention_biases.max_weight_columns(summary, grid),
                         f"Most lenient head of each method, n = {n_keys:,} keys, margin Δ = {margin:g}",
                         "method", n_keys, sort=list(summary))
rule = alt.Chart(pd.DataFrame({"distance": [far]})).mark_rule(strokeDash=[5, 4], color="gray").encode(x=alt.X("distance:Q"))
show_chart(chart + rule, df, f"max_weight_comparison_n{n_keys}",
           "Exponential fall = the method forgets; flat = the method dilutes but can still find a far key when its "
           "content stands out. Missing lines: that checkpoint is not available.")

sync_url(ctx=n_keys, margin=margin, far=far, heads=heads, ahead=alibi_head, alen=alibi_len, nb=num_buckets,
         md=max_distance, bidir=bidirectional, tlen=t5_len, sk=clip_k, slen=shaw_len, scausal=causal, cmult=multiple,
         clayer=curve_layer, r1=r1, r2=r2)
if shaw is not None:
    sync_url(nlayer=shaw_layer)
if t5 is not None:
    sync_url(thead=t5_head)
if shaw is not None:
    sync_url(layer=layer, anyq=any_query, qnorm=q_norm)
