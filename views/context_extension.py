"""Context extension: the RoPE checkpoint under every registered inference-time scaling."""
from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

from views._charts import DASHED_LEGEND, RedrawClock, legend_for, method_scales, metric_rows, named, show_cached_chart
from views._models import ModelList, add_published
from views._page import error_box, page_header, plain
from views._serving import compute_once, stored_result
from views._text import choose_text
from views._url import qp_choice, qp_multi, sync_url
from posviz.labs import context_extension, extrapolation
from posviz.models.checkpoint_files import shipped_checkpoints
from posviz.models.interface import open_model
from posviz.errors import PosvizError
from posviz.limits import device_label
from posviz.palette import colour, rope_series
from posviz.positions.rope_remaps import ROPE_REMAPS
from posviz.positions.rope_scaling import ROPE_SCALINGS
from posviz.display import display_name

page_header(
    "Context extension",
    "RoPE models can be run past their training length at inference, without retraining, by changing the "
    "rotation speeds (position interpolation, NTK-aware and dynamic NTK, YaRN, Llama 3, LongRoPE) or the positions "
    "each query-key pair is seen at (Self-Extend, ReRoPE, Leaky ReRoPE, dual chunk attention, STRING). Here the "
    "shipped RoPE checkpoint runs under each of them; methods that need no stretching (ALiBi, T5, ...) are drawn "
    "beside its fine-tuned versions, and can join the live curves below.",
)

models = {}  # each resolved once for this run; weights load when run
for name, folder in shipped_checkpoints().items():
    try:
        models[name] = open_model(folder)
    except (PosvizError, KeyError) as exc:
        error_box(PosvizError(f"Checkpoint {name!r} cannot be read: {exc}"), "Rebuild it with `make checkpoints`.")
# the published models of $POSVIZ_MODELS join the list: a RoPE one can take the scalings, any can be a reference
catalog = add_published(ModelList({n: str(shipped_checkpoints()[n]) for n in models}, dict(models), [], open_model))
tuned = context_extension.finetuned_models(models)  # rope fine-tuned at a longer length: a section of their own
rope_names = [n for n, m in models.items() if m.method == "rope" and n not in tuned]
# a published model listed by its hub id alone is described once picked: offered here, checked when chosen
bases = rope_names + [n for n in catalog.listed if n not in catalog.models or catalog.models[n].method == "rope"]
if not bases:
    st.warning("No RoPE checkpoint found in models/. Run `make checkpoints` (or `python -m posviz.train --method rope`).")
    st.stop()
# The curves are named by scaling ("linear"), remap ("self_extend") or checkpoint ("alibi"); colours are the app's,
# per method, and each chart's legend lists only the series it draws (all eleven methods would not fit beside a chart).
# The charts show display names (posviz.display); each scaling's and remap's colour is its rope variant's
ALIASES = {display_name(s): rope_series(s) for s in list(ROPE_SCALINGS) + list(ROPE_REMAPS)}

# ------------------------------------------------------------------------------------------------
# Controls
# ------------------------------------------------------------------------------------------------
left, right = st.columns(2)
with left:
    catalog.add_input()
    rope_name = bases[0]
    if len(bases) > 1:  # the shipped rope checkpoint by default; a published RoPE model on request
        rope_name = st.selectbox("RoPE model the scalings apply to", bases, format_func=catalog.label,
                                 index=bases.index(qp_choice("base", bases[0], bases)), key="w_base",
                                 help="Published models' scalings are transformers' own (rope_parameters), keeping "
                                      "the model's θ.")
        sync_url(base=rope_name)
    if not catalog.ready([rope_name]):  # a published model loads now, under a progress bar
        st.stop()
    rope = catalog.models[rope_name]
    if rope.method != "rope":
        error_box(PosvizError(f"{plain(display_name(rope_name))} uses {display_name(rope.method)} positions: the scalings apply to RoPE models only."),
                  "Choose another model.")
        st.stop()
    train_length, unit = rope.train_length, rope.unit
    others = [n for n in catalog.names if n != rope_name and n not in tuned]
    # By default the model as trained and YaRN, the scaling its fine-tunes and most published long-context
    # models use, and no live reference (ALiBi, T5, KERPLE and FIRE are drawn from their stored curves beside the
    # fine-tunes, as is position interpolation fine-tuned): each live curve is five lengths of forward passes,
    # about 0.6 s on 2 cores. With linear as a third live curve a new server's first visit took 5.2-6.1 s
    # (python -m posviz_tools.bench --first-request); all seven scalings and two references, 12 s.
    SCALINGS = context_extension.extensions(rope)  # the frequency scalings, then the remaps this model takes
    first_view = [s for s in ("none", "yarn") if s in SCALINGS]
    scalings = st.multiselect("Scalings and remaps", SCALINGS, format_func=display_name, default=qp_multi("scalings", first_view, SCALINGS),
                              key="w_scalings",
                              help="Position interpolation (linear), NTK, dynamic NTK, Llama 3 and LongRoPE change how fast "
                                   "each pair turns. The training-free remaps (Self-Extend, ReRoPE, Leaky ReRoPE, "
                                   "dual chunk attention, STRING; checkpoints only) keep the speeds and change which relative position each pair "
                                   "is seen at, so none sees a distance it never trained on. Each adds a live curve.", wrap=True)
    references = st.multiselect("Compare with", others, default=qp_multi("refs", [], others), key="w_refs",
                                format_func=catalog.label,
                                placeholder="e.g. ALiBi: a method that needs no scaling",
                                help="Models that need no scaling, drawn solid in their own colours beside the "
                                     "scalings, stored and live.", wrap=True)
    catalog.caption()
with right:
    text = choose_text()
sync_url(scalings=scalings, refs=references)
references = catalog.ready(references)  # a published reference loads now
# Models of other units or trained contexts than the scaled one: lengths as multiples of each one's context.
mixed = extrapolation.mixed_contexts([rope] + [catalog.models[n] for n in references])

def with_multiples(df: pd.DataFrame, contexts: dict[str, int] | None) -> pd.DataFrame:
    """Mixed units or contexts (``contexts``: each curve's model's trained context): each row's length as a
    multiple of its own model's context; the scalings' rows are the scaled model's. None: as it is."""
    if contexts is None:
        return df
    scaled = next(iter(contexts.values()))  # the scaled model's, first
    lengths = [scaled if kind == "rope + scaling" else contexts[curve] for curve, kind in zip(df["curve"], df["kind"])]
    return df.assign(multiple=df["length"] / pd.Series(lengths, index=df.index, dtype=float))


def live_frame(scaling_rows: list[dict], reference_frames: list[pd.DataFrame],
               contexts: dict[str, int] | None) -> pd.DataFrame:
    live = pd.DataFrame(scaling_rows, columns=["scaling", "factor", "length", "bpb"]).rename(columns={"scaling": "curve"})
    live["kind"] = "rope + scaling"
    return with_multiples(pd.concat([live, *reference_frames], ignore_index=True), contexts)


def live_chart(df: pd.DataFrame, title: str, unit: str, train_length: int, mixed: bool) -> alt.LayerChart:
    """Bits per byte against the length, the scalings dashed and the references solid; ``mixed``: against the
    multiple of each model's trained context (bytes and tokens on one axis)."""
    if mixed:
        return multiple_chart(df, title)
    df = named(df, "curve")
    x = alt.X("length:Q", scale=alt.Scale(type="log", base=2), title=f"evaluation length ({unit}s, log scale)")
    y = alt.Y("bpb:Q", title="bits per byte", scale=alt.Scale(zero=False))
    colours, dash_scale = method_scales(list(dict.fromkeys(df["curve"])), ALIASES)
    colour = alt.Color("curve:N", scale=colours, title=None)
    tip = ["curve", "length", alt.Tooltip("bpb:Q", format=".3f"), alt.Tooltip("factor:Q", format="g")]
    dashes = alt.StrokeDash("curve:N", scale=dash_scale, title=None)  # rope's scalings dashed, other methods solid
    rope = alt.Chart(df[df["kind"] == "rope + scaling"]).mark_line(point=True).encode(x, y, colour, dashes, tooltip=tip)
    refs = alt.Chart(df[df["kind"] != "rope + scaling"]).mark_line(point=True).encode(x, y, colour, dashes, tooltip=tip)
    rule = alt.Chart(pd.DataFrame({"length": [train_length]})).mark_rule(color="grey", strokeDash=[2, 2]).encode(x="length:Q")
    return alt.layer(rope, refs, rule).properties(height=340, title=title)


def multiple_chart(df: pd.DataFrame, title: str) -> alt.LayerChart:
    """``live_chart`` against the multiple of each model's trained context (bytes and tokens on one axis)."""
    df = named(df, "curve")
    x = alt.X("multiple:Q", scale=alt.Scale(type="log", base=2), title="multiple of trained context (log scale)")
    y = alt.Y("bpb:Q", title="bits per byte", scale=alt.Scale(zero=False))
    colours, dash_scale = method_scales(list(dict.fromkeys(df["curve"])), ALIASES)
    colour = alt.Color("curve:N", scale=colours, title=None)
    tip = ["curve", "length", alt.Tooltip("multiple:Q", format="g"), alt.Tooltip("bpb:Q", format=".3f"),
           alt.Tooltip("factor:Q", format="g")]
    dashes = alt.StrokeDash("curve:N", scale=dash_scale, title=None)
    parts = [df[df["kind"] == "rope + scaling"], df[df["kind"] != "rope + scaling"]]  # scalings dashed, references solid
    lines = [alt.Chart(part).mark_line(point=True).encode(x, y, colour, dashes, tooltip=tip) for part in parts if len(part)]
    rule = alt.Chart(pd.DataFrame({"multiple": [1.0]})).mark_rule(color="grey", strokeDash=[2, 2]).encode(x="multiple:Q")
    return alt.layer(*lines, rule).properties(height=340, title=title)


def wavelength_chart(waves: pd.DataFrame, scalings: list[str], train_length: int, factor: float) -> alt.LayerChart:
    """Each rotary pair's wavelength under each scaling, with the training and target lengths marked."""
    waves = named(waves, "scaling")
    wave_colours, wave_dashes = method_scales([display_name(s) for s in scalings], ALIASES)
    marks = pd.DataFrame({"wavelength": [train_length, factor * train_length],
                          "what": [f"training length ({train_length:,})", f"target length ({factor * train_length:,.0f})"]})
    y = alt.Y("wavelength:Q", scale=alt.Scale(type="log"), title="wavelength (positions per full turn, log scale)")
    lines = alt.Chart(waves).mark_line(point=True).encode(
        x=alt.X("pair:Q", title="rotary pair i (fast → slow)", axis=alt.Axis(tickMinStep=1, format="d")), y=y,
        color=alt.Color("scaling:N", scale=wave_colours, title="scaling", legend=DASHED_LEGEND),
        strokeDash=alt.StrokeDash("scaling:N", scale=wave_dashes, title="scaling", legend=DASHED_LEGEND),
        tooltip=["scaling", "pair", alt.Tooltip("wavelength:Q", format=",.1f"), alt.Tooltip("attention_factor:Q", format=".3f")])
    rules = alt.Chart(marks).mark_rule(color="grey", strokeDash=[4, 3]).encode(y="wavelength:Q")
    notes = alt.Chart(marks).mark_text(align="left", x=4, dy=-7, color="grey").encode(y="wavelength:Q", text="what:N")
    return alt.layer(lines, rules, notes).properties(height=340)


def finetuned_chart(ft_all: pd.DataFrame, ft_length: int) -> alt.LayerChart:
    """The fine-tuned RoPE checkpoints before and after fine-tuning, beside methods that need none."""
    ft_all = named(ft_all, "curve", "of")
    ft_colours, _ = method_scales(list(dict.fromkeys(ft_all["curve"])))
    x = alt.X("length:Q", scale=alt.Scale(type="log", base=2), title="evaluation length (bytes, log scale)")
    y = alt.Y("bpb:Q", title="bits per byte", scale=alt.Scale(zero=False))
    colour = alt.Color("curve:N", scale=ft_colours, title=None, legend=legend_for(ft_all["curve"].nunique()))
    tip = ["curve", "stage", "length", alt.Tooltip("bpb:Q", format=".3f")]
    # Each stage its own dash on the lines and its own point shape in the key: Vega-Lite draws a strokeDash legend's
    # symbols with a transparent stroke when colour is another field's (the key's three lines were invisible; it
    # ignores symbolStrokeColor), and a point per stage in one shape drew three identical black dots.
    stages = ["after fine-tuning", "before fine-tuning", "no fine-tuning needed"]
    stage_dash = alt.StrokeDash("stage:N", legend=None, scale=alt.Scale(domain=stages, range=[[1, 0], [6, 4], [1, 3]]))
    # Its own field and values, naming each line's dash: Vega-Lite merges a shape legend into a dash legend of the
    # same values (and the dash's has none, so both went).
    keyed = {stage: f"{stage} ({line})" for stage, line in zip(stages, ["solid line", "dashed", "dotted"])}
    ft_all = ft_all.assign(key_of_stage=ft_all["stage"].map(keyed))
    stage_shape = alt.Shape("key_of_stage:N", title="stage", legend=alt.Legend(orient="bottom", symbolSize=90, symbolFillColor="#333"),
                            scale=alt.Scale(domain=list(keyed.values()), range=["circle", "triangle-up", "square"]))
    ft_lines = alt.Chart(ft_all).mark_line().encode(x, y, colour, stage_dash, detail="of:N", tooltip=tip)
    ft_points = alt.Chart(ft_all).mark_point(filled=True, opacity=1).encode(x, y, colour, stage_shape, tooltip=tip)
    ft_rules = alt.Chart(pd.DataFrame({"length": [ft_length, 4 * ft_length]})).mark_rule(color="grey", strokeDash=[2, 2]).encode(x="length:Q")
    return alt.layer(ft_lines, ft_points, ft_rules).properties(height=340)


def finetuning_chart(curves: pd.DataFrame) -> alt.Chart:
    """The training loss while each RoPE checkpoint was fine-tuned."""
    curves = named(curves, "checkpoint")
    return alt.Chart(curves).mark_line().encode(
        x=alt.X("tokens:Q", title="fine-tuning bytes"), y=alt.Y("train_bpb:Q", title="training loss (bits/byte)",
                                                                scale=alt.Scale(zero=False)),
        # the legend names the fine-tuning runs drawn, not every curve above, in full ("RoPE + linear, fine-tuned …")
        color=alt.Color("checkpoint:N", scale=method_scales(list(dict.fromkeys(curves["checkpoint"])))[0],
                        title=None, legend=legend_for(curves["checkpoint"].nunique())),
        tooltip=["checkpoint", "tokens", alt.Tooltip("train_bpb:Q", format=".3f")]).properties(height=200)


FACTORS = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]


# ------------------------------------------------------------------------------------------------
# Everything below depends on the factor: a fragment, so that moving its slider reruns and resends this
# part alone (the header, the model pickers and the text above stay as they are)
# ------------------------------------------------------------------------------------------------
@st.fragment
def at_this_factor() -> None:
    factor = st.select_slider("Scaling factor s", FACTORS, value=float(qp_choice(
                                  "factor", "4.0", [str(f) for f in FACTORS] + [f"{f:g}" for f in FACTORS])),
                              key="w_factor", format_func=lambda f: f"{f:g}×",
                              help=f"Stretch the {train_length:,}-{unit} training context to s × {train_length:,} {unit}s.")
    sync_url(factor=factor)
    # Everything the charts depend on: visitors with the same choices share them (see show_cached_chart)
    view_key = ("context-extension", rope.key, factor, tuple(scalings), tuple(references), mixed,
                tuple(catalog.models[n].key for n in references), tuple(m.key for m in models.values()))
    # ------------------------------------------------------------------------------------------------
    # Wavelengths: what each scaling does to the rotation of every pair (no text needed)
    # ------------------------------------------------------------------------------------------------
    st.subheader(f"Wavelength of each rotary pair at s = {factor:g}")
    turning = [s for s in scalings if s in ROPE_SCALINGS] or list(ROPE_SCALINGS)  # the remaps keep the wavelengths
    waves = pd.DataFrame(context_extension.rope_wavelengths(rope, factor, scalings=turning))
    show_cached_chart(view_key + ("wavelengths",), lambda: (wavelength_chart(waves, turning, train_length,
                                                                              factor), waves),
                      f"rope-wavelengths-s{factor:g}",
                      "Pairs whose wavelength is longer than the training length never completed a turn in training: the model only "
                      "saw part of their circle. Linear interpolation slows every pair by s; NTK raises the base so fast pairs barely "
                      "change and slow ones stretch about s×; YaRN and Llama 3 leave fast pairs alone and interpolate only the slow "
                      "ones (YaRN also sharpens attention by its attention factor).",
                      says=lambda: context_extension.wavelength_sentence(waves.to_dict("records"), train_length, factor))
    remaps = pd.DataFrame(context_extension.remap_settings(rope, factor, scalings))
    if not remaps.empty:
        st.markdown(f"**The remaps at s = {factor:g}** keep every pair's wavelength; each pair is seen at a remapped "
                    f"relative position instead (drawn on the RoPE page). Their parameters, chosen to cover "
                    f"{factor:g} × {train_length:,} {unit}s (`python -m posviz.evaluate --scaling NAME --option KEY=VALUE` "
                    "sets them by hand):")
        st.dataframe(named(remaps, "remap"), hide_index=True, height="content")
    touched = context_extension.layers_touched(rope)
    if touched:  # a hybrid's recurrent layers, or NoPE layers between rotary ones, keep what they compute
        st.caption(f"{plain(display_name(rope_name))}: {touched}")
    af = waves.groupby("scaling", sort=False)["attention_factor"].first()
    if (af != 1).any():
        st.caption("Attention factor (multiplies cos and sin, so the logits scale by its square): "
                   + ", ".join(f"{display_name(k)} {v:.3f}" for k, v in af.items()))

    # ------------------------------------------------------------------------------------------------
    # Fine-tuned at a longer length: the same scaling before and after (shipped, drawn at once)
    # ------------------------------------------------------------------------------------------------
    st.subheader("With fine-tuning: position interpolation and YaRN as their papers use them")
    st.markdown(
        "Position interpolation (Chen et al. 2023) and YaRN (Peng et al. 2023) are meant to be followed by a short "
        "fine-tuning at the new length. The shipped RoPE checkpoint was fine-tuned at 4× its training length three "
        "ways, with the same small budget each: no scaling, linear interpolation, YaRN. Dashed: the same scaling "
        "before fine-tuning; solid: after. The methods that need no stretching are drawn for reference."
    )
    # the shipped rope checkpoint's training length, whichever model the scalings below apply to
    ft_length = models[rope_names[0]].train_length if rope_names else train_length
    ft_rows = pd.DataFrame(context_extension.finetuning_rows(models), columns=["curve", "length", "bpb", "stage", "of"])
    if ft_rows.empty:
        st.info("No fine-tuned RoPE checkpoints in models/ yet. `scripts/finetune_rope.sh` makes them "
                "(part of `make checkpoints`); then `python -m posviz.evaluate_all` stores their curves.", icon="ℹ️")
    else:
        ft_refs = [n for n in ("alibi", "t5", "kerple", "fire") if n in others and n in models]
        refs = pd.DataFrame([{"curve": n, "length": L, "bpb": v, "stage": "no fine-tuning needed", "of": n}
                             for n in ft_refs for L, v in extrapolation.shipped_bpb_curve(models[n]) if v is not None],
                            columns=ft_rows.columns)
        ft_all = pd.concat([ft_rows, refs], ignore_index=True)
        target = 4 * ft_length
        # One above the other: beside the chart, the tables' columns were cut at 1366 px.
        left, right = st.container(), st.container()
        with left:
            show_cached_chart(view_key + ("finetuned",), lambda: (finetuned_chart(ft_all, ft_length), ft_all),
                              "context-extension-finetuned",
                              f"Dotted: the training length ({ft_length:,}) and the fine-tuning length ({target:,}).")
        with right:
            facts = pd.DataFrame(context_extension.finetuning_facts(models))
            st.dataframe(named(facts, "checkpoint", "from", "scaling"), hide_index=True, height="content")
            at_target = ft_all[ft_all["length"] == target]
            if not at_target.empty:
                value = lambda of, stage: next((f"{v:.3f}" for v in at_target[(at_target["of"] == of)  # noqa: E731
                                                                           & (at_target["stage"] == stage)]["bpb"]), "—")
                table = pd.DataFrame([{"checkpoint": display_name(of), "before fine-tuning": value(of, "before fine-tuning"),
                                       "after fine-tuning": value(of, "after fine-tuning"),
                                       "no fine-tuning needed": value(of, "no fine-tuning needed"),
                                       # how far the checkpoint's own score (after, or needing none) moves with the
                                       # evaluation windows; the "before" scores stored no windows
                                       "its own score, 95 % interval": extrapolation.shipped_bpb_intervals(
                                           models[of]).get(target, "—")}
                                      for of in dict.fromkeys(at_target["of"])])
                st.markdown(f"**Bits per byte at {target:,} bytes (the fine-tuning length):**")
                st.dataframe(table, hide_index=True, width="stretch", height="content")
            curves = pd.DataFrame(context_extension.finetuning_curves(models))
            if not curves.empty:
                show_cached_chart(view_key + ("finetuning-curves",), lambda: (finetuning_chart(curves), curves), "finetuning-curves",
                                  "The loss during fine-tuning: a scaling that starts closer to what the model knows needs fewer bytes.")

    drope_section()  # stored, as the fine-tunes above: drawn before anything that needs a text or a scaling
    if text is None:
        st.stop()
    if not scalings:
        st.info("Pick at least one scaling.")
        st.stop()

    # ------------------------------------------------------------------------------------------------
    # bits per byte vs length: shipped (stored factors) and live (the chosen factor)
    # ------------------------------------------------------------------------------------------------
    st.subheader("Bits per byte vs evaluation length")
    shipped = pd.DataFrame(context_extension.shipped_scaling_curves(rope), columns=["scaling", "length", "bpb", "factor"])
    shipped = shipped[shipped["scaling"].isin(scalings)].rename(columns={"scaling": "curve"})
    shipped["kind"] = "rope + scaling"
    ref_rows = [{"curve": n, "length": L, "bpb": v, "factor": None, "kind": "no scaling needed"}
                for n in references for L, v in extrapolation.shipped_bpb_curve(catalog.models[n]) if v is not None]
    shipped = pd.concat([shipped, pd.DataFrame(ref_rows, columns=shipped.columns)], ignore_index=True)


    contexts = {rope_name: train_length, **{n: catalog.models[n].train_length for n in references}} if mixed else None
    shipped = with_multiples(shipped, contexts)

    def curve_chart(df: pd.DataFrame, title: str) -> alt.LayerChart:
        return live_chart(df, title, unit, train_length, contexts is not None)



    c1, c2 = st.columns(2)
    with c1:
        if shipped.empty and not rope.stored_metrics():
            st.info(f"{plain(display_name(rope_name))} is a published model: it has no stored curves; its live curves are on the right.")
        elif shipped.empty:
            st.info("No stored curves yet (run `python -m posviz.evaluate_all`).")
        else:
            show_cached_chart(view_key + ("shipped",), lambda: (curve_chart(shipped, "Stored, held-out set: each length at the factor that fits it"),
                                                               shipped), "context-extension-shipped",
                              "Stored in metrics.json (131 kB of validation text). Static scalings were evaluated at the factor that "
                              "exactly fits each length; dynamic NTK adapts by itself (factor 2). Every window is one full forward pass, so "
                              "dynamic NTK rotates all its positions with the frequencies of the window's length; a cached decoder "
                              "keeps each key's frequencies from the step that wrote it, and scores differently past the training length.")
    with c2:
        live_slot = st.empty()
        live_slot.info("Live curves are being computed…")
        working = st.container()  # progress bars, under the chart they fill

    try:
        rope.load()
    except PosvizError as exc:  # a missing or damaged rope checkpoint: say which file, keep the app serving
        with c2:
            live_slot.empty()
            error_box(exc, f"Choose another model above; {plain(display_name(rope_name))}'s scalings cannot run." if rope_name in catalog.listed
                      else "Restore the rope checkpoint (git checkout models/rope) or retrain it with "
                           "`python -m posviz.train --method rope`.")
        st.stop()
    text_bytes = text.as_bytes()


    lengths = context_extension.extension_lengths(train_length, rope.length_cap, rope.count_ids(text_bytes))
    if not lengths:
        with c2:
            live_slot.empty()
            if rope.length_cap < train_length:  # a published model whose one pass is capped below its context
                error_box(PosvizError(f"{plain(display_name(rope_name))} cannot run its training length ({train_length:,} {unit}s) here: "
                                      f"its cap is {rope.length_cap:,} ({rope.length_cap_reason})."),
                          "Choose another model above.")
            else:
                error_box(PosvizError(f"The text has {rope.count_ids(text_bytes):,} {unit}s, fewer than the training "
                                      f"length ({train_length:,})."), "Pick a validation document or paste a longer text.")
        st.stop()
    LIVE_TITLE = f"Live on this document: every scaling at s = {factor:g} for every length"
    # each reference's own lengths: the same as the scaled model's, or the same multiples of its own context
    ref_lengths = {n: context_extension.reference_lengths(rope, lengths, catalog.models[n], catalog.models[n].count_ids(text_bytes))
                   for n in references}


    def scaling_key(scaling: str) -> tuple:
        # "none" is the checkpoint as trained whatever the factor: one result for every s
        return rope.key + (text_bytes, scaling, 1.0 if scaling == "none" else factor, tuple(lengths))

    def reference_key(model, name: str) -> tuple:
        return model.key + (text_bytes, tuple(ref_lengths[name]))

    # A first visitor sees each curve join the chart as it is computed; one whose curves are all stored gets it whole.
    streaming = not (all(stored_result("rope_scaling", scaling_key(s))[0] for s in scalings)
                     and all(stored_result("reference_curve", reference_key(catalog.models[n], n))[0] for n in references))
    live_rows, reference_frames = [], []
    jobs = [("scaling", s) for s in scalings] + [("reference", n) for n in references]
    redraw = RedrawClock()  # a redraw builds the whole chart
    for i, (kind, name) in enumerate(jobs):
        with working:
            if kind == "scaling":
                live_rows += compute_once(
                    "rope_scaling", scaling_key(name),
                    lambda progress, scaling=name: context_extension.rope_scaling_curves(
                        rope, factor, rope.tokenize(text_bytes).ids, lengths, [scaling], progress),
                    f"{plain(display_name(rope_name))} + {display_name(name)} at s = {factor:g}: {len(lengths)} lengths…")
            else:
                model = catalog.models[name]
                rows = compute_once("reference_curve", reference_key(model, name),
                                    lambda progress, model=model, name=name: context_extension.reference_curve(
                                        model, model.tokenize(text_bytes).ids, ref_lengths[name], progress),
                                    f"{plain(display_name(name))}: {len(ref_lengths[name])} lengths…")
                reference_frames.append(pd.DataFrame(rows, columns=["length", "bpb"]).assign(
                    curve=name, kind="no scaling needed", factor=None))
        if streaming and i < len(jobs) - 1 and redraw.due():  # the last one is drawn below, with its download
            live_slot.altair_chart(curve_chart(live_frame(live_rows, reference_frames, contexts), LIVE_TITLE), width="stretch")
    live = live_frame(live_rows, reference_frames, contexts)
    with live_slot.container():
        show_cached_chart(view_key + ("live", text_bytes), lambda: (curve_chart(live, LIVE_TITLE), live),
                          f"context-extension-live-s{factor:g}",
                          f"Computed now on {device_label()}. A single factor for every length: below s × {train_length:,} the "
                          "scalings give up some short-range precision; past it they run out of stretch.")

    best = (live[live["multiple"] == max(lengths) / train_length] if mixed else live[live["length"] == max(lengths)]).sort_values("bpb")
    if not best.empty:
        # which text and which setting, where the number stands: the stored curve beside it reads the held-out set at
        # the factor that fits each length, this one this document at one factor for every length
        setting = f"live on this document, every scaling at s = {factor:g}"
        st.markdown(f"**At {max(lengths) // train_length}× each model's trained context ({setting}):**" if mixed else
                    f"**At {max(lengths):,} {unit}s ({max(lengths) // train_length}× the training length; {setting}):**")
        metric_rows([dict(label=plain(display_name(r["curve"])), value=f"{r['bpb']:.3f}", help="bits per byte") for _, r in best.iterrows()],
                    per_row=4)


# ------------------------------------------------------------------------------------------------
# DroPE: RoPE with its rotation dropped after training, before and after recalibration (stored, drawn at once)
# ------------------------------------------------------------------------------------------------
def drope_chart(rows: pd.DataFrame, train_length: int) -> alt.LayerChart:
    stages = list(context_extension.RECALIBRATION_STAGES) + ["NoPE, trained without positions"]
    x = alt.X("length:Q", scale=alt.Scale(type="log", base=2), title="evaluation length (bytes, log scale)")
    y = alt.Y("bpb:Q", title="bits per byte", scale=alt.Scale(zero=False))
    by_stage = alt.Color("stage:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=360, symbolStrokeWidth=3),
                       # RoPE and NoPE in their colours on every page; the two stages between them apart from both
                       scale=alt.Scale(domain=stages, range=[colour("rope"), "#E45756", "#54A24B", colour("nope")]))
    tip = ["stage", "length", alt.Tooltip("bpb:Q", format=".3f")]
    lines = alt.Chart(rows).mark_line(point=True).encode(x, y, by_stage, tooltip=tip)
    rule = alt.Chart(pd.DataFrame({"length": [train_length]})).mark_rule(color="grey", strokeDash=[2, 2]).encode(x="length:Q")
    return alt.layer(lines, rule).properties(height=320)


def drope_section() -> None:
    rows = pd.DataFrame(context_extension.recalibration_rows(models), columns=["of", "stage", "length", "bpb"])
    if rows.empty:
        return
    name = rows["of"].iloc[0]  # the shipped set has one recalibration: DroPE from rope
    model = models[name]
    st.subheader("DroPE: RoPE's rotation dropped after training, then recalibrated")
    tuned = model.finetuned_from()
    st.markdown(
        f"DroPE (Gelberg et al. 2025) takes a model trained with RoPE, removes the rotation, and trains on a little "
        f"at the same length so that the model recalibrates without positions: {plain(display_name(name))} from "
        f"{plain(display_name(Path(tuned['checkpoint']).name))} with {tuned['tokens']:,} bytes. Its paper's claim: a "
        "model that merely drops RoPE breaks, one recalibrated keeps its quality within the context and extends "
        "past it. Stored scores of the held-out set, the same bytes for every curve.")
    nope = [{"of": "nope", "stage": "NoPE, trained without positions", "length": n, "bpb": v}
            for n, v in extrapolation.shipped_bpb_curve(models["nope"]) if v is not None] if "nope" in models else []
    drawn = pd.concat([rows[rows["of"] == name], pd.DataFrame(nope, columns=rows.columns)], ignore_index=True)
    L = model.train_length
    at = lambda stage, n: next((f"{v:.3f}" for v in drawn[(drawn["stage"] == stage) & (drawn["length"] == n)]["bpb"]), "—")  # noqa: E731
    ours = drawn[drawn["of"] == name]["length"]
    far = int(ours[ours <= 16 * L].max())  # the longest length every stage stores, up to 16x
    show_cached_chart(("drope", model.key, tuple(m.key for n, m in models.items() if n == "nope")),
                      lambda: (drope_chart(drawn, L), drawn), "context-extension-drope",
                      f"Dotted: the training length ({L:,} bytes). At {L:,} and {far:,} bytes: as trained "
                      f"{at('as trained', L)} and {at('as trained', far)}; dropped, not recalibrated "
                      f"{at('positions dropped, not recalibrated', L)} and {at('positions dropped, not recalibrated', far)}; "
                      f"recalibrated {at('recalibrated', L)} and {at('recalibrated', far)} bits per byte.")


at_this_factor()
