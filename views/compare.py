"""Compare: method A vs method B on the same bytes, or one method at length L vs 2L."""
from __future__ import annotations

from contextlib import nullcontext

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from posviz.slides import means_sentence
from views._charts import method_scales, show_cached_chart
from views._matrices import recurrent_layer_notes, show_matrix, show_pooled_matrix
from views._serving import compute_once, shared, stored_result
from views._models import usable_models
from views._page import error_box, page_header, plain
from views._text import choose_text
from views._url import qp_choice, qp_int, sync_url
from posviz.labs import compare, extrapolation, inputs as lab_inputs
from posviz.models.interface import LabModel, open_model
from posviz.errors import PosvizError
from posviz.display import display_name

page_header(
    "Compare",
    "Put two position methods side by side on the same bytes, or one method at length L against 2L, and look at "
    "the difference: per-position loss and attention maps.",
)


# Computed once per server for every visitor (keyed on the models' keys: identity and weights' stamp),
# in the server's work queue, as every lab computes.
def one_loss(model: LabModel, text: bytes, length: int) -> dict:
    def compute(progress):
        s = extrapolation.score_at_length(model, model.tokenize(text).ids, length)
        return {"position_bits": s.position_bits, "bpb": s.bpb}

    return compute_once("compare-loss", _loss_key(model, text, length), compute,
                        f"{plain(display_name(model.name))} at {length:,} {model.unit}s…")


def _loss_key(model: LabModel, text: bytes, length: int) -> tuple:
    return model.key + (text, length)


def methods_attention(model_a: LabModel, model_b: LabModel, text: bytes, length: int, layer: int, head: int,
                      log_scale: bool) -> dict:
    return compute_once("compare-methods-attention", model_a.key + model_b.key + (text, length, layer, head, log_scale),
                        lambda progress: compare.attention_difference(model_a, model_b, model_a.tokenize(text).ids, length,
                                                                      layer, head, log_scale=log_scale),
                        f"Attention of {plain(display_name(model_a.name))} and {plain(display_name(model_b.name))}…")


def methods_attention_apart(model_a: LabModel, length_a: int, model_b: LabModel, length_b: int, text: bytes, layer: int,
                            head: int, log_scale: bool) -> dict:
    """A's and B's maps each over its own ids (their ids do not line up: no difference map)."""
    return compute_once("compare-methods-attention-apart",
                        model_a.key + model_b.key + (text, length_a, length_b, layer, head, log_scale),
                        lambda progress: compare.attention_pair(model_a, model_a.tokenize(text).ids, length_a, model_b,
                                                                model_b.tokenize(text).ids, length_b, layer, head,
                                                                log_scale=log_scale),
                        f"Attention of {plain(display_name(model_a.name))} and {plain(display_name(model_b.name))}…")


def lengths_losses(model: LabModel, text: bytes, length: int) -> dict:
    return compute_once("compare-lengths", model.key + (text, length),
                        lambda progress: compare.compare_lengths(model, model.tokenize(text).ids, length),
                        f"{plain(display_name(model.name))} at {length:,} and {2 * length:,} {model.unit}s…")


def lengths_attention(model: LabModel, text: bytes, length: int, layer: int, head: int, log_scale: bool) -> dict:
    return compute_once("compare-lengths-attention", model.key + (text, length, layer, head, log_scale),
                        lambda progress: compare.length_attention_difference(model, model.tokenize(text).ids, length, layer,
                                                                             head, log_scale=log_scale),
                        f"Attention of {plain(display_name(model.name))} at {length:,} and {2 * length:,} {model.unit}s…")


SCALES = {"log": "log₁₀ probability", "prob": "probability"}


def colour_scale(where) -> bool:
    """The maps' colour: log10 probability by default (at 512 bytes most weights are tiny, and a linear
    scale drew near-black squares), as in the Extrapolation lab. True for log."""
    scale = where.radio("Colour", list(SCALES), index=list(SCALES).index(qp_choice("scale", "log", list(SCALES))),
                        key="w_scale", format_func=SCALES.get, horizontal=True)
    sync_url(scale=scale)
    return scale == "log"


def map_controls(drawn: dict) -> tuple[int, int, bool, str]:
    """The maps' layer, head and colour, drawn in the attention section they set (not above the loss chart, which
    they do not change: a slide of the loss lists only what set it). ``drawn``: {name: model} of the maps; where a
    model's layer is recurrent, a note says its map is the implied matrix, and the colour's title says both."""
    n_layer, n_head = min(m.n_layer for m in drawn.values()), min(m.n_head for m in drawn.values())
    c1, c2, c3 = st.columns(3)
    layer = c1.selectbox("Layer", range(n_layer), index=qp_int("layer", 0, 0, n_layer - 1), key="w_layer")
    head = c2.selectbox("Head", range(n_head), index=qp_int("head", 0, 0, n_head - 1), key="w_head")
    log_scale = colour_scale(c3)
    sync_url(layer=layer, head=head)
    kinds = [(plain(display_name(name)), model.layer_kind(layer)) for name, model in drawn.items()]
    recurrent_layer_notes(kinds, layer)
    value = ("attention probability" if all(kind == "attention" for _, kind in kinds)
             else "attention probability or share of |implied weight|")
    return layer, head, log_scale, f"log₁₀ {value}" if log_scale else value


catalog = usable_models(open_model)  # each resolved once for this run; weights load when run
models, names = catalog.models, catalog.names
shipped_names = catalog.shipped  # the defaults: published models are picked on request


def map_panel(matrix: np.ndarray, block: int, length: int, name: str, title: str, value_title: str, scheme: str,
              marks: list[int], unit: str = "byte", domain: tuple[float, float] | None = None) -> None:
    title = plain(title)  # shown as Markdown either way, and it names a model, maybe a visitor's: quoted
    if block == 1 and length <= 128:
        st.markdown(f"**{title}**")
        show_matrix(matrix, name, f"key {unit}", f"query {unit}", value_title, scheme=scheme, marks=marks,
                    mark_label="the training length")
    else:
        show_pooled_matrix(matrix, block, (length, length), name, f"key {unit}", f"query {unit}", value_title, scheme=scheme,
                           marks=marks, mark_label="the training length", side=384, title=title, domain=domain)


modes = ["methods", "lengths"]
left, right = st.columns(2)
with left:
    catalog.add_input()
    mode = st.radio("Compare", modes, index=modes.index(qp_choice("mode", "methods", modes)), horizontal=True,
                    format_func={"methods": "method A vs method B", "lengths": "length L vs 2L"}.get, key="w_mode")
    catalog.caption()
with right:
    text = choose_text()
sync_url(mode=mode)
if text is None:
    st.stop()
text_bytes = text.as_bytes()


def id_count(name: str) -> int:
    """The text's length in this model's ids (its bytes for a checkpoint)."""
    return models[name].count_ids(text_bytes)

def methods_apart(a: str, b: str, where) -> None:
    """Method A vs method B when their ids do not line up (a byte-level checkpoint and a published model, or
    two tokenizers): each runs at the same multiple of its own trained context; bits per byte compare, the
    losses are drawn against the fraction of each one's context, and the two maps side by side."""
    ma, mb = models[a], models[b]
    multiples = extrapolation.multiple_options([ma, mb], [id_count(a), id_count(b)])
    if len(multiples) < 2:
        error_box(PosvizError(f"The text has only {len(text):,} bytes."), "Paste a longer text.")
        st.stop()
    stops = [f"{m:g}" for m in multiples]
    multiple = float(where.select_slider("Length (multiple of each model's trained context)", stops,
                                         value=qp_choice("M", "2" if "2" in stops else stops[-1], stops), key="w_M",
                                         format_func=lambda m: f"{float(m):g}×"))
    sync_url(a=a, b=b, M=f"{multiple:g}")
    lengths = {n: extrapolation.length_at_multiple(models[n], multiple) for n in (a, b)}
    qa, qb = plain(display_name(a)), plain(display_name(b))  # the names as Markdown quotes them, for the words below
    st.caption(f"{qa} and {qb} read the text as different ids (bytes or tokens) or were trained on different contexts: "
               f"each runs at {multiple:g}× its own trained context ({qa}: {lengths[a]:,} {ma.unit}s of {ma.train_length:,}; "
               f"{qb}: {lengths[b]:,} {mb.unit}s of {mb.train_length:,}). Bits per byte compare; positions are drawn as "
               "fractions of each model's context, with no position-by-position difference.")

    st.subheader(f"Loss at each position: {qa} vs {qb} at {multiple:g}× their trained contexts")
    curves = {}
    for name in (a, b):
        problem = extrapolation.cannot_run_at(models[name], lengths[name], id_count(name))
        try:
            if problem:
                raise PosvizError(problem)
            curves[name] = one_loss(models[name], text_bytes, lengths[name])
        except PosvizError as exc:
            error_box(exc, f"{plain(display_name(name))} cannot run at {multiple:g}× its trained context; the other model is still shown.")
    if not curves:
        st.stop()
    metric_cols = st.columns(3)
    for col, name in zip(metric_cols, (a, b)):
        if name in curves:
            col.metric(f"{plain(display_name(name))}: bits/byte", f"{curves[name]['bpb']:.3f}")
    if len(curves) == 2:
        metric_cols[2].metric(f"{qb} − {qa}", f"{curves[b]['bpb'] - curves[a]['bpb']:+.3f}", help="bits/byte difference")
    rows = []
    for name, c in curves.items():
        smoothed = lab_inputs.moving_average(c["position_bits"], max(1, lengths[name] // 64))
        rows += [{"model": display_name(name), "position": p, "multiple": p / models[name].train_length, "bits": float(v),
                  "unit": models[name].unit} for p, v in enumerate(smoothed) if np.isfinite(v)]
    df = pd.DataFrame(rows)
    x = alt.X("multiple:Q", title="position in the window ÷ the model's trained context")
    layers = [alt.Chart(df).mark_line().encode(
        x, alt.Y("bits:Q", title="mean loss per id (bits)", scale=alt.Scale(zero=False)),
        alt.Color("model:N", title=None, scale=method_scales([display_name(n) for n in curves])[0], legend=alt.Legend(orient="top")),
        tooltip=["model", "position", "unit", alt.Tooltip("bits:Q", format=".3f")]).properties(height=360)]
    if multiple > 1:
        layers.append(alt.Chart(pd.DataFrame({"multiple": [1.0]})).mark_rule(color="grey", strokeDash=[4, 3]).encode(
            x="multiple:Q"))
    show_cached_chart(("compare", text_bytes) + ma.key + mb.key + (f"compare-loss-{a}-{b}-M{multiple:g}",),
                      lambda: (alt.layer(*layers), df), f"compare-loss-{a}-{b}-M{multiple:g}",
                      "Mean over each model's windows, smoothed over 1/64 of its window. Bits per id: per byte for a byte-level "
                      "checkpoint, per token for a tokenized model; the dashed line: the trained context.",
                      says=lambda: means_sentence(df, "model", "bits", "the mean loss per id (bits)"))
    if len(curves) < 2:
        return
    st.subheader(f"Attention maps: {qa} vs {qb}")
    layer, head, log_scale, map_title = map_controls({a: ma, b: mb})
    try:
        with st.spinner("Extracting attention maps…"):
            maps = methods_attention_apart(ma, lengths[a], mb, lengths[b], text_bytes, layer, head, log_scale)
    except PosvizError as exc:  # a published model's map past this server's memory cap
        error_box(exc, "Choose a shorter length to see the maps.")
        return
    cols = st.columns(2)
    domain = compare.shared_range(maps["a"], maps["b"])  # one colour scale: the two maps are read side by side
    for col, key, name in ((cols[0], "a", a), (cols[1], "b", b)):
        model, length = models[name], lengths[name]
        with col:
            map_panel(maps[key], maps[f"block_{key}"], length, f"attention-{name}-l{layer}-h{head}-M{multiple:g}",
                      f"{name} ({length:,} {model.unit}s)", map_title, "viridis",
                      [model.train_length] if model.train_length < length else [], model.unit, domain)
    st.caption("Each map over its own model's ids: rows are queries, columns keys; the line marks the trained context. "
               "Layers and heads are not aligned across separately trained models: compare patterns (how far, how "
               "sharp), not head numbers.")


# Each mode's section is a fragment: moving its widgets reruns and resends that section alone (the header,
# the mode and the text above stay as they are).
@st.fragment
def methods_section() -> None:
    c1, c2, c3 = st.columns(3)
    label_a, label_b = catalog.say("Method A", "Model A"), catalog.say("Method B", "Model B")
    # Opens on a pair worth comparing: rotary against a linear bias (the one fails past its training length where
    # the other goes on), where both are shipped.
    first_a, first_b = compare.opening_pair(shipped_names)
    a = c1.selectbox(label_a, names, index=names.index(qp_choice("a", first_a, names)), key="w_a",
                     format_func=catalog.label)
    b = c2.selectbox(label_b, names, index=names.index(qp_choice("b", first_b, names)), key="w_b",
                     format_func=catalog.label)
    if len(catalog.ready(list(dict.fromkeys((a, b))))) < len({a, b}):  # a published model loads now, under a bar
        st.stop()
    if not shared("compare-aligned", models[a].key + models[b].key + (text_bytes,),
                  lambda: compare.aligned(models[a], models[b], text_bytes)):
        methods_apart(a, b, c3)
        st.stop()
    train_length, unit = models[a].train_length, models[a].unit
    usable = min(models[a].length_cap, models[b].length_cap, id_count(a))
    options = extrapolation.length_options(train_length, usable)
    if len(options) < 2:
        error_box(PosvizError(f"The text has only {len(text):,} bytes."), "Paste a longer text.")
        st.stop()
    default = min(2 * train_length, usable)
    default = default if default in options else options[-1]
    length = c3.select_slider(f"Length L ({unit}s)", options, value=int(qp_choice("L", str(default), [str(o) for o in options])),
                              key="w_L", format_func=lambda n: f"{n:,}")
    sync_url(a=a, b=b, L=length)
    marks = [train_length] if train_length < length else []
    qa, qb = plain(display_name(a)), plain(display_name(b))  # the names as Markdown quotes them, for the words below

    st.subheader(f"Loss at each position: {qa} vs {qb} at {length:,} {unit}s")
    curves = {}
    smooth = max(1, length // 64)
    first_curve = st.empty()  # A's curve while B runs: the first chart does not wait for both models
    # the two-step bar only while a curve is still to compute: a stored pair is drawn at once, with no bar flashing
    to_run = [n for n in dict.fromkeys((a, b)) if not stored_result("compare-loss", _loss_key(models[n], text_bytes, length))[0]]
    with st.spinner(f"Running {qa} and {qb} at {length:,} {unit}s…") if to_run else nullcontext():
        bar = st.progress(0.0, text=f"{qa}…") if to_run else st.empty()
        for i, name in enumerate((a, b)):
            try:
                curves[name] = one_loss(models[name], text_bytes, length)
            except PosvizError as exc:
                error_box(exc, f"{plain(display_name(name))} cannot run at {length:,} bytes; the other model is still shown.")
            if i == 0 and name in curves and b != a:
                alone = pd.DataFrame({"model": display_name(a), "position": np.arange(length),
                                      "bits": lab_inputs.moving_average(curves[a]["position_bits"], smooth)}).dropna()
                first_curve.altair_chart(alt.Chart(alone).mark_line().encode(
                    alt.X("position:Q", title="position in the window"),
                    alt.Y("bits:Q", title="mean loss (bits)", scale=alt.Scale(zero=False)),
                    alt.Color("model:N", title=None, scale=method_scales([display_name(a)])[0]),
                    tooltip=["model", "position", alt.Tooltip("bits:Q", format=".3f")]).properties(height=260),
                    width="stretch")
            if to_run:
                bar.progress((i + 1) / 2, text=f"{qb}…")
        bar.empty()
    first_curve.empty()
    if not curves:
        st.stop()
    rows = [{"model": display_name(n), "position": p, "bits": float(v)} for n, c in curves.items()
            for p, v in enumerate(lab_inputs.moving_average(c["position_bits"], smooth)) if np.isfinite(v)]
    metric_cols = st.columns(3)
    for col, name in zip(metric_cols, (a, b)):
        if name in curves:
            col.metric(f"{plain(display_name(name))}: bits/byte", f"{curves[name]['bpb']:.3f}")
    if len(curves) == 2 and a != b:
        diff = lab_inputs.moving_average(curves[b]["position_bits"] - curves[a]["position_bits"], smooth)
        rows += [{"model": f"{display_name(b)} − {display_name(a)}", "position": p, "bits": float(v)} for p, v in enumerate(diff) if np.isfinite(v)]
        metric_cols[2].metric(f"{qb} − {qa}", f"{curves[b]['bpb'] - curves[a]['bpb']:+.3f}", help="bits/byte difference")
    df = pd.DataFrame(rows)
    # one x domain for both stacked charts, so a position sits at the same place in each
    x = alt.X("position:Q", title="position in the window", scale=alt.Scale(domain=[0, int(df["position"].max())], nice=False))
    layers = [alt.Chart(df[df["model"].isin([display_name(n) for n in curves])]).mark_line().encode(
        x, alt.Y("bits:Q", title="mean loss (bits)", scale=alt.Scale(zero=False)), alt.Color("model:N", title=None, scale=method_scales([display_name(n) for n in curves])[0], legend=alt.Legend(orient="top")),
        tooltip=["model", "position", alt.Tooltip("bits:Q", format=".3f")]).properties(height=260)]
    if marks:  # the training length, said on the chart (a dashed line alone said nothing on a slide)
        trained = pd.DataFrame({"position": marks, "label": [f"training length {m:,}" for m in marks]})
        layers.append(alt.Chart(pd.DataFrame({"position": marks})).mark_rule(color="grey", strokeDash=[4, 3]).encode(x="position:Q"))
        layers.append(alt.Chart(trained).mark_text(align="left", baseline="top", dx=4, y=2, color="grey").encode(
            x="position:Q", text="label:N"))
    # 360 px as the Extrapolation lab's: the chart a slide or a screenshot is taken of covers 40 % of a laptop's main area
    top = alt.layer(*layers).properties(height=360)
    if len(curves) == 2 and a != b:
        diff_df = df[df["model"] == f"{display_name(b)} − {display_name(a)}"]
        bottom = alt.layer(
            alt.Chart(diff_df).mark_area(opacity=0.5, color="#b07aa1").encode(
                x, alt.Y("bits:Q", title=f"{display_name(b)} − {display_name(a)} (bits)"),
                tooltip=["position", alt.Tooltip("bits:Q", format="+.3f")]),
            alt.Chart(pd.DataFrame({"bits": [0]})).mark_rule(color="black").encode(y="bits:Q"),
            *layers[1:]).properties(height=220)
        show_cached_chart(("compare", text_bytes) + models[a].key + models[b].key + (f"compare-loss-{a}-{b}-L{length}",),
                          lambda: (alt.vconcat(top, bottom), df), f"compare-loss-{a}-{b}-L{length}",
                          "Mean over the windows" + (f", smoothed over {smooth} positions" if smooth > 1 else "")
                   + f". Below: {qb} minus {qa}; below 0, {qb} predicts better.",
                          says=lambda: means_sentence(df[df["model"].isin([display_name(n) for n in curves])], "model", "bits",
                                              "the mean loss per byte of the window (bits)"))
    else:
        show_cached_chart(("compare", text_bytes) + models[a].key + models[b].key + (f"compare-loss-{a}-{b}-L{length}",),
                          lambda: (top, df), f"compare-loss-{a}-{b}-L{length}")
        if a == b:
            st.info("Pick two different methods to see a difference.")

    if len(curves) == 2 and a != b:
        st.subheader(f"Attention maps: {qa} vs {qb}")
        layer, head, log_scale, map_title = map_controls({a: models[a], b: models[b]})
        try:
            with st.spinner("Extracting attention maps…"):
                maps = methods_attention(models[a], models[b], text_bytes, length,
                                         layer, head, log_scale)
        except PosvizError as exc:  # a published model's map past this server's memory cap
            error_box(exc, "Choose a shorter L to see the maps.")
            st.stop()
        cols = st.columns(3)
        domain = compare.shared_range(maps["a"], maps["b"])  # one colour scale for the two maps read side by side
        with cols[0]:
            map_panel(maps["a"], maps["block"], length, f"attention-{a}-l{layer}-h{head}-L{length}", display_name(a),
                      map_title, "viridis", marks, unit, domain)
        with cols[1]:
            map_panel(maps["b"], maps["block"], length, f"attention-{b}-l{layer}-h{head}-L{length}", display_name(b),
                      map_title, "viridis", marks, unit, domain)
        with cols[2]:
            map_panel(maps["diff"], maps["block"], length, f"attention-diff-{a}-{b}-l{layer}-h{head}-L{length}",
                      f"{display_name(b)} − {display_name(a)}", "probability difference", "redblue", marks, unit)
        st.caption(f"Largest single difference: {maps['max_abs_diff']:.3f}. Red: {qb} attends more; blue: {qa} attends more. "
                   "Layers and heads are not aligned across separately trained models: compare patterns (how far, how "
                   "sharp), not head numbers.")


@st.fragment
def lengths_section() -> None:
    c1, c2 = st.columns(2)
    model_name = c1.selectbox(catalog.say("Method", "Model"), names, format_func=catalog.label,
                              index=names.index(qp_choice("model", shipped_names[-1], names)), key="w_model")
    if not catalog.ready([model_name]):  # a published model loads now, under a progress bar
        st.stop()
    model = models[model_name]
    train_length, unit = model.train_length, model.unit
    usable = min(model.length_cap, id_count(model_name)) // 2
    options = extrapolation.length_options(train_length, usable)
    if len(options) < 2:
        error_box(PosvizError(f"The text has only {len(text):,} bytes."), "Paste a longer text.")
        st.stop()
    default = min(train_length, usable)
    default = default if default in options else options[-1]
    length = c2.select_slider(f"Length L ({unit}s); compared with 2L", options,
                              value=int(qp_choice("L", str(default), [str(o) for o in options])), key="w_L2",
                              format_func=lambda n: f"L = {n:,}, 2L = {2 * n:,}")
    sync_url(model=model_name, L=length)

    st.subheader(f"{plain(display_name(model_name))}: the same {unit}s with L = {length:,} vs 2L = {2 * length:,} {unit}s of window")
    try:
        with st.spinner("Scoring at L and 2L…"):
            result = lengths_losses(model, text_bytes, length)
    except PosvizError as exc:
        error_box(exc, "Choose a shorter L, or another method.")
        st.stop()
    m = st.columns(3)
    m[0].metric(f"bits/byte at L = {length:,}", f"{result['bpb_short']:.3f}")
    m[1].metric(f"bits/byte at 2L = {2 * length:,}", f"{result['bpb_long']:.3f}")
    m[2].metric("2L − L", f"{result['bpb_long'] - result['bpb_short']:+.3f}", help="bits/byte; below 0: more context helped")
    smooth = max(1, length // 32)
    rows = []
    for key, label in (("short", f"windows of L = {length:,}"), ("long", f"windows of 2L = {2 * length:,}"),
                       ("diff", "2L − L")):
        rows += [{"curve": label, "position": p, "bits": float(v)}
                 for p, v in enumerate(lab_inputs.moving_average(result[key], smooth)) if np.isfinite(v)]
    df = pd.DataFrame(rows)
    x = alt.X("position:Q", title=f"position in the 2L window (0–{2 * length - 1:,}); the prediction there sees position + 1 {unit}s",
              scale=alt.Scale(domain=[0, 2 * length - 1], nice=False))  # one domain for both stacked charts
    marks_df = pd.DataFrame({"position": [length] + ([train_length] if train_length < 2 * length else []),
                             "what": ["L: second half starts"] + (["training length"] if train_length < 2 * length else [])})
    rules = alt.Chart(marks_df).mark_rule(color="grey", strokeDash=[4, 3]).encode(x="position:Q", tooltip=["what"])
    top = alt.layer(alt.Chart(df[df["curve"] != "2L − L"]).mark_line().encode(
        x, alt.Y("bits:Q", title="mean loss (bits)", scale=alt.Scale(zero=False)), alt.Color("curve:N", title=None, legend=alt.Legend(orient="top")),
        tooltip=["curve", "position", alt.Tooltip("bits:Q", format=".3f")]), rules).properties(height=360)
    bottom = alt.layer(
        alt.Chart(df[df["curve"] == "2L − L"]).mark_area(opacity=0.5, color="#b07aa1").encode(
            x, alt.Y("bits:Q", title="2L − L (bits)"),
            tooltip=["position", alt.Tooltip("bits:Q", format="+.3f")]),
        alt.Chart(pd.DataFrame({"bits": [0]})).mark_rule(color="black").encode(y="bits:Q"), rules).properties(height=180)
    show_cached_chart(("compare", text_bytes) + model.key + (f"compare-lengths-{model_name}-L{length}",),
                      lambda: (alt.vconcat(top, bottom), df), f"compare-lengths-{model_name}-L{length}",
                      f"Below: 2L − L; below 0, the extra context helped. Each {unit} is scored twice: in windows of 2L and in windows of L over the same {unit}s. In the first half "
                      f"the two agree exactly (same context). In the second half the 2L window gives {length:,} more {unit}s of "
                      f"context, at positions {length:,}–{2 * length - 1:,}" +
                      (f", past the training length of {train_length:,}" if 2 * length > train_length else "") + ".")

    st.subheader(f"Attention on the same {length:,} {unit}s, alone vs after {length:,} more")
    layer, head, log_scale, map_title = map_controls({model_name: model})
    try:
        with st.spinner("Extracting attention maps…"):
            maps = lengths_attention(model, text_bytes, length, layer, head, log_scale)
    except PosvizError as exc:
        error_box(exc, "Choose a shorter L, or another method.")
        st.stop()
    cols = st.columns(3)
    domain = compare.shared_range(maps["short"], maps["long"])  # one colour scale for the two maps read side by side
    with cols[0]:
        map_panel(maps["short"], maps["block"], length, f"attention-{model_name}-short-L{length}",
                  f"alone (positions 0–{length - 1:,})", map_title, "viridis", [], unit, domain)
    with cols[1]:
        map_panel(maps["long"], maps["block"], length, f"attention-{model_name}-long-L{length}",
                  f"after {length:,} {unit}s (positions {length:,}–{2 * length - 1:,})", map_title, "viridis", [], unit,
                  domain)
    with cols[2]:
        map_panel(maps["diff"], maps["block"], length, f"attention-{model_name}-lendiff-L{length}",
                  "after − alone", "probability difference", "redblue", [], unit)
    far = pd.DataFrame({"query": np.arange(length, 2 * length), f"mass on the first L {unit}s": maps["far_mass"]})
    chart = alt.Chart(far).mark_line(color="#4e79a7").encode(
        x=alt.X("query:Q", title=f"query {unit} in the 2L window"),
        y=alt.Y(f"mass on the first L {unit}s:Q", title=f"attention on the first L {unit}s", scale=alt.Scale(domain=[0, 1])),
        tooltip=["query", alt.Tooltip(f"mass on the first L {unit}s:Q", format=".3f")]).properties(height=240)
    show_cached_chart(("compare", text_bytes, log_scale) + model.key + (f"far-mass-{model_name}-l{layer}-h{head}-L{length}",),
                      lambda: (chart, far), f"far-mass-{model_name}-l{layer}-h{head}-L{length}",
                      "How much of each second-half query's attention goes to the extra context. A relative method's map of the "
                      "same bytes changes only because the extra keys take some of the mass; an absolute method's changes "
                      "because every position moved by L.")


if mode == "methods":
    methods_section()
else:
    lengths_section()
