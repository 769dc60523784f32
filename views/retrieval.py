"""Far-context retrieval: can a model still use a far token it needs? Repeat, key-value and induction probes."""
from __future__ import annotations

import hashlib

import altair as alt
import pandas as pd
import streamlit as st

from posviz.models.checkpoint_files import extends_context
from posviz.positions import opening_set
from posviz.slides import extremes_sentence
from views._charts import cached_spec, csv_file, draw_spec, legend_for, method_scales, named, show_cached_chart, show_chart, split_title
from views._models import usable_models
from views._page import error_box, page_header, plain
from views._serving import compute_once
from views._text import choose_text
from views._url import qp_bool, qp_choice, qp_float, qp_int, qp_multi, sync_url
from posviz.labs import key_value, probes, retrieval
from posviz.labs.inputs import shared_unit, unit_note, when_not_bytes
from posviz.models.interface import open_model
from posviz.errors import PosvizError
from posviz.limits import device_label, max_eval_length
from posviz.positions.alibi import alibi_slopes
from posviz.display import display_name

page_header(
    "Far-context retrieval",
    "A flat perplexity curve does not mean a model uses its whole window. These probes put something the model needs "
    "far back — a chunk of code it will see again, a value bound to a name — and measure whether it still gets used.",
)

catalog = usable_models(open_model)  # each resolved once for this run; weights load when run
models, names = catalog.models, catalog.names
metrics = {n: models[n].stored_metrics() for n in names}
tuned = {n for n in names if extends_context(models[n].finetuned_from())}  # fine-tuned for context from another
# The stored results, the induction heads and the ALiBi section are our checkpoints' (those that stored metrics).
byte_names = [n for n in names if metrics[n]] or names
train_length = models[byte_names[0]].train_length

st.markdown(
    "- **Repeat probe**: a 64-byte chunk of held-out code, a gap of other held-out code, the same chunk again. "
    "**Ratio** = loss on the second copy / loss on the first: 1 means the first copy did not help, 0 a perfect copy.\n"
    "- Past the training length a model may get worse at *every* byte, copy or not. So the probe also scores the same "
    "bytes at the same position with an unrelated chunk in front (**no-copy control**): **second / control** is the "
    "part of the gain that comes from retrieving the copy.\n"
    "- **Key–value probe**: `name = 40213` early in a file, a gap of code, then `name = ` again: bits per digit of the "
    f"value when it is recalled, against the model's own loss when it first saw it (a random digit costs {key_value.DIGIT_BITS:.2f})."
)

# ------------------------------------------------------------------------------------------------
# Shipped results (at once, from metrics.json)
# ------------------------------------------------------------------------------------------------
MEASURES = {  # the control first: past the training length the plain ratio mixes "lost" with "forgot"
    "gain": ("second copy / no-copy control", "loss ratio against the no-copy control (1 = no retrieval)"),
    "ratio": ("second copy / first copy", "loss ratio (1 = no help from the first copy)"),
    "bits": ("bits per byte: second (solid) and first (dashed)", "loss (bits per byte)"),
}


def probe_chart(df: pd.DataFrame, measure: str, probe: str, height: int = 320, unit: str = "byte",
                train_lengths: list[int] | None = None) -> alt.LayerChart:
    """``unit``: what the gaps are counted in; ``train_lengths``: where to draw the training lengths (in that unit)."""
    data = df[df["probe"] == probe].dropna(subset=["ratio"]).assign(gap1=lambda d: d["gap"].clip(lower=1))
    x = alt.X("gap1:Q", scale=alt.Scale(type="log", base=2),
              title=f"gap between the copies ({unit_note(unit)}, log scale; 0 drawn at 1)")
    order = [display_name(n) for n in names]  # the page's order; the data's "model" column holds display names
    drawn = [n for n in order if n in set(data["model"])] + sorted(set(data["model"]) - set(order))
    colours, dashes = method_scales(drawn)  # the legend lists what the chart draws, in the page's colours
    legend = legend_for(len(drawn))
    colour = alt.Color("model:N", scale=colours, title="checkpoint", legend=legend)
    tips = ["model", "gap", alt.Tooltip("first_bits:Q", format=".3f", title="first (bits)"),
            alt.Tooltip("second_bits:Q", format=".3f", title="second (bits)"),
            alt.Tooltip("control_bits:Q", format=".3f", title="no-copy control (bits)"),
            alt.Tooltip("ratio:Q", format=".3f"), alt.Tooltip("gain:Q", format=".3f", title="second / control")]
    title = MEASURES[measure][1]
    if measure == "bits":
        second = alt.Chart(data).mark_line(point=alt.OverlayMarkDef(size=40)).encode(
            x, alt.Y("second_bits:Q", title=split_title(title)), colour, tooltip=tips)
        first = alt.Chart(data).mark_line(strokeDash=[4, 3], opacity=0.7).encode(x, alt.Y("first_bits:Q"), colour, tooltip=tips)
        layers = [second, first]
    else:
        # The key-value probe's first sight of a random value is its own no-copy control: it has only the ratio.
        field = "gain" if measure == "gain" and probe == "repeat" else "ratio"
        band = alt.Chart(data).mark_area(opacity=0.12).encode(x, alt.Y("ratio_low:Q"), alt.Y2("ratio_high:Q"), colour) \
            if measure == "ratio" else None
        line = alt.Chart(data).mark_line(point=alt.OverlayMarkDef(size=40)).encode(
            x, alt.Y(f"{field}:Q", title=split_title(MEASURES["ratio" if field == "ratio" else "gain"][1]),
                     scale=alt.Scale(domainMin=0)),
            colour, alt.StrokeDash("model:N", scale=dashes, title="checkpoint", legend=legend), tooltip=tips)  # one merged legend
        one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="grey", strokeDash=[4, 3]).encode(y="y:Q")
        layers = [layer for layer in (band, line, one) if layer is not None]
    train = alt.Chart(pd.DataFrame({"gap1": train_lengths or [train_length]})).mark_rule(
        color="grey", strokeDash=[2, 2]).encode(x="gap1:Q")
    return alt.layer(*layers, train).properties(height=height)


st.header("Shipped results")
shipped = pd.DataFrame(retrieval.shipped_rows(metrics))
published = [n for n in names if not metrics[n]]  # no stored results (published models): they run live only
missing = [n for n in names if n not in published and (shipped.empty or n not in set(shipped["model"]))]
if missing:
    st.info(f"No stored probe results for {', '.join(plain(display_name(n)) for n in missing)}. Run `python -m posviz.evaluate_all --probes-only`.", icon="ℹ️")
if published:
    st.info(f"{', '.join(plain(display_name(n)) for n in published)}: published models come without stored probe results; run the probes on them "
            "live at the bottom of the page (in their own tokens).", icon="ℹ️")
measure = st.radio("Show", list(MEASURES), format_func=lambda m: MEASURES[m][0], horizontal=True,
                   index=list(MEASURES).index(qp_choice("measure", "gain", list(MEASURES))), key="w_measure")
if not shipped.empty:
    # Eight lines a room can tell apart (one method of each family); the others one click away in the picker.
    stored = [n for n in names if n in set(shipped["model"])]
    drawn = st.multiselect("Checkpoints drawn", stored, default=qp_multi("shown", opening_set(stored), stored),
                           format_func=display_name, key="w_shown",
                           help="The charts open on one method of each family; add any other here.", wrap=True)
    sync_url(shown=drawn)
    shipped = shipped[shipped["model"].isin(drawn)]
else:
    drawn = list(names)
shipped = named(shipped, "model")  # shown by name from here on
if not shipped.empty:
    st.markdown("**Repeat probe** (16 chunks per gap; band: 10th–90th percentile of the ratio)")
    show_chart(probe_chart(shipped, measure, "repeat"), shipped[shipped["probe"] == "repeat"], f"repeat-probe-shipped-{measure}",
               f"Dotted vertical line: the training length ({train_length:,} bytes). A missing point: the method "
               "cannot represent that many positions.",
               says=lambda: extremes_sentence(shipped[shipped["probe"] == "repeat"], "model", "gap",
                                      "gain" if measure == "gain" else "ratio" if measure == "ratio" else "second_bits",
                                      MEASURES[measure][1].split(" (")[0], lambda g: f"a gap of {int(g):,} bytes",
                                      at=train_length))
    st.markdown("**Key–value probe** (16 names per gap, 5-digit values)")
    show_chart(probe_chart(shipped, measure, "key_value"), shipped[shipped["probe"] == "key_value"],
               f"key-value-probe-shipped-{measure}", "Loss on the value's digits when the name comes back, over its loss "
               "at first sight (a random value: its own no-copy control).")
    at_zero = shipped[(shipped["probe"] == "repeat") & (shipped["gap"] == 0)].set_index("model")
    if len(at_zero) >= 2:  # a best and a worst need two checkpoints
        best = at_zero["ratio"].idxmin()
        worst = at_zero["ratio"].idxmax()
        st.markdown(f"Right after the chunk (gap 0), **{plain(best)}** copies best (ratio {at_zero.loc[best, 'ratio']:.2f}) and "
                    f"**{plain(worst)}** least ({at_zero.loc[worst, 'ratio']:.2f}): a ratio near 1 means the model does not copy "
                    "even what sits right before it, so no position method can show retrieval through it.")

st.subheader("When copying formed during training")
# Pre-training runs only: a fine-tuning run's curve covers its own 400 KB, not the set's budget.
curve = named(pd.DataFrame(retrieval.copy_curve_rows({n: m for n, m in metrics.items() if n not in tuned})), "model")
if curve.empty:
    st.info("These checkpoints were trained before training logged its copy check (`copy_curve` in metrics.json): "
            "retrain with `make checkpoints` to see when each model learned to copy.", icon="ℹ️")
else:
    st.markdown(
        "Every saved training state is probed with a chunk of held-out code repeated right after itself (gap 0, "
        f"16 chunks): the second copy's loss over the first's. Copying forms late and suddenly (Olsson et al. 2022 "
        f"call it a phase change); the dashed line is the set's goal, {retrieval.COPY_TARGET:g}.")
    curve_colours, curve_dashes = method_scales(list(curve["model"].unique()))  # the legend lists only drawn curves
    lines = alt.Chart(curve).mark_line(point=True).encode(
        x=alt.X("bytes:Q", title="bytes trained"), y=alt.Y("ratio:Q", title="second copy / first copy (gap 0)"),
        color=alt.Color("model:N", scale=curve_colours, title="checkpoint", legend=legend_for(curve["model"].nunique())),
        strokeDash=alt.StrokeDash("model:N", scale=curve_dashes, title="checkpoint",
                                  legend=legend_for(curve["model"].nunique())),
        tooltip=["model", "step", alt.Tooltip("bytes:Q", format=","), alt.Tooltip("ratio:Q", format=".3f"),
                 alt.Tooltip("gain:Q", format=".3f")])
    goal = alt.Chart(pd.DataFrame({"y": [retrieval.COPY_TARGET]})).mark_rule(color="grey", strokeDash=[4, 3]).encode(y="y:Q")
    show_chart(alt.layer(lines, goal).properties(height=300), curve, "copy-curve",
               "gain: the second copy over the same bytes after an unrelated chunk (the no-copy control).")

# ------------------------------------------------------------------------------------------------
# Induction heads
# ------------------------------------------------------------------------------------------------
st.header("Induction heads: looking up what came next last time")
st.markdown(
    "An induction head (Olsson et al. 2022) lets a byte on the second copy attend to the byte *after* its earlier "
    "occurrence, which is the byte about to be predicted. Score: the average attention weight on exactly that key "
    "(1 = all of it; a head that ignores the copy gives about 1 / the number of keys)."
)
table = retrieval.induction_table(metrics)
heads = named(pd.DataFrame(retrieval.induction_rows(table)), "model")
stored_key = tuple(m.key for m in models.values())  # what the stored results' charts depend on


# The gap picker and what hangs under it rerun alone (a fragment); the grid's spec is kept per gap.
@st.fragment
def induction_section() -> None:
    gaps_stored = sorted(set(heads["gap"]))
    c1, c2 = st.columns(2)
    head_gap = c1.select_slider("gap", gaps_stored, value=int(qp_choice("hgap", "0", [str(g) for g in gaps_stored])),
                                key="w_hgap", format_func=lambda g: f"{g:,} bytes")
    maps = heads[heads["gap"] == head_gap].assign(where=lambda d: "L" + d["layer"].astype(str) + " H" + d["head"].astype(str))
    grid = alt.Chart(maps).mark_rect().encode(
        x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"),
        color=alt.Color("score:Q", title="induction score", scale=alt.Scale(scheme="viridis", domain=[0, max(0.05, heads["score"].max())])),
        facet=alt.Facet("model:N", columns=6, title=None, sort=[display_name(n) for n in names if display_name(n) in set(maps["model"])]),
        tooltip=["model", "layer", "head", alt.Tooltip("score:Q", format=".3f")],
    ).properties(width=110, height=90)
    draw_spec(cached_spec(("induction-grid", head_gap, stored_key), lambda: grid), width="content")
    c2.caption(f"Each square: one layer and head of one checkpoint at gap {head_gap:,}. Bright: an induction head.")
    answered = set(maps["model"])  # only the models that answered: a damaged checkpoint is not opened again here
    for name, model in models.items():  # a recurrent layer has no attention weights: say what its score reads
        if display_name(name) not in answered:
            continue
        recurrent = [layer for layer in range(model.n_layer) if model.layer_kind(layer) != "attention"]
        if recurrent:
            kinds = sorted({model.layer_kind(layer) for layer in recurrent})
            which = (f"layer {recurrent[0]} is a" if len(recurrent) == 1 else
                     f"layers {', '.join(map(str, recurrent))} are")
            st.caption(f"{plain(display_name(name))}: {which} {' and '.join(kinds)} layer{'s' * (len(recurrent) > 1)}"
                       ": their score is the share of the query's |implied weight| (o_t = Σ_s w_ts v_s) on that "
                       "byte, from the layer's implied matrix.")
    st.download_button("Data (CSV)", csv_file(maps), file_name=f"induction-gap{head_gap}.csv",
                       mime="text/csv", key="csv-induction")
    # the checkpoints picked above: a line per checkpoint of 29 would be a legend taller and wider than the chart
    best = heads[heads["best"] & heads["model"].isin([display_name(n) for n in drawn])].assign(
        gap1=lambda d: d["gap"].clip(lower=1))
    falls = alt.Chart(best).mark_line(point=True).encode(
        x=alt.X("gap1:Q", scale=alt.Scale(type="log", base=2), title="gap (bytes, log scale; 0 drawn at 1)"),
        y=alt.Y("score:Q", title=split_title("induction score of the strongest head")),
        color=alt.Color("model:N", scale=method_scales(list(best["model"].unique()))[0], title="checkpoint",
                        legend=legend_for(best["model"].nunique())),  # a legend of what is drawn, not of every name
        tooltip=["model", "layer", "head", "gap", alt.Tooltip("score:Q", format=".3f")]).properties(height=280)
    if best.empty:
        st.info("None of the checkpoints picked under 'Checkpoints drawn' has stored induction scores: add one there.",
                icon="ℹ️")
    else:
        show_cached_chart(("induction-vs-gap", stored_key, tuple(drawn)), lambda: (falls, best), "induction-vs-gap",
                          "Each checkpoint's strongest head at gap 0, followed as the gap grows (the checkpoints "
                          "picked under 'Checkpoints drawn' above).")
    sync_url(hgap=head_gap)


if heads.empty:
    st.info("No stored induction scores. Run `python -m posviz.evaluate_all --probes-only`.", icon="ℹ️")
else:
    induction_section()

# ------------------------------------------------------------------------------------------------
# ALiBi: where each head's penalty overwhelms the match
# ------------------------------------------------------------------------------------------------
st.header("ALiBi: the distance at which each head's penalty beats the match")
n_head = models[byte_names[0]].n_head


@st.fragment
def alibi_reach_section() -> None:
    """The margin slider and the reach it gives each head: reruns alone."""
    margin = st.slider("how much better the copied key matches, in logits (Δ)", 1.0, 30.0,
                       qp_float("delta", 8.0, 1.0, 30.0), step=0.5, key="w_delta",
                       help="A match worth Δ logits loses to a non-matching neighbour once slope × distance exceeds Δ.")
    reach = pd.DataFrame(retrieval.alibi_reach(alibi_slopes(n_head).tolist(), margin))
    left, right = st.columns([2, 3])
    left.dataframe(reach.assign(head=reach["head"].map(lambda h: f"head {h}")).rename(
        columns={"slope": "slope m", "reach": "reach Δ/m (bytes)"}).style.format({"slope m": "{:.4g}", "reach Δ/m (bytes)": "{:,.0f}"}),
        hide_index=True, height="content")
    if "alibi" in table:
        alibi_heads = heads[(heads["model"] == display_name("alibi"))].assign(gap1=lambda d: d["gap"].clip(lower=1))
        alibi_heads = alibi_heads.assign(series=lambda d: "L" + d["layer"].astype(str) + " H" + d["head"].astype(str))
        with right:
            chart = alt.Chart(alibi_heads).mark_line().encode(
                x=alt.X("gap1:Q", scale=alt.Scale(type="log", base=2), title="gap (bytes, log scale)"),
                y=alt.Y("score:Q", title="induction score"), color=alt.Color("head:N", title="head"), detail="layer:N",
                tooltip=["series", "gap", alt.Tooltip("score:Q", format=".3f")]).properties(height=240)
            reach_rules = alt.Chart(reach).mark_rule(strokeDash=[4, 3]).encode(x="reach:Q", color="head:N")
            show_cached_chart(("alibi-induction-vs-reach", margin, stored_key), lambda: (chart + reach_rules, alibi_heads),
                              "alibi-induction-vs-reach",
                              f"Lines: the {display_name('alibi')} checkpoint's induction score per layer and head, by gap. Dashed: each head's reach "
                              "Δ/m. A head's score collapses around its reach: past it the penalty beats any match.")
    else:
        right.info("No stored induction scores for `alibi`.", icon="ℹ️")
    sync_url(delta=margin)


alibi_reach_section()
cap = max_eval_length(train_length)
st.subheader("Why ALiBi's perplexity stays flat while it forgets")
distances = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, cap})
att = pd.DataFrame(retrieval.alibi_attenuation(n_head, distances))
# int(): a row of mixed columns comes back as floats, which would read "head 0.0"
att["head"] = att.apply(lambda r: f"head {int(r['head'])} (slope {r['slope']:.4g})", axis=1)
lines = alt.Chart(att).mark_line(point=True).encode(
    x=alt.X("distance:Q", scale=alt.Scale(type="log", base=2), title="distance back to the key (bytes, log scale)"),
    y=alt.Y("penalty:Q", scale=alt.Scale(type="log"), title="logit penalty, slope × distance (log scale)"),
    color=alt.Color("head:N", title=None),
    tooltip=["head", "distance", alt.Tooltip("penalty:Q", format=".3g", title="penalty (logits)"),
             alt.Tooltip("factor:Q", format=".2e", title="weight multiplier")],
)
invisible = pd.DataFrame({"penalty": [10.0], "what": ["10 logits: weight × 4.5e-5, effectively invisible"]})
rule = alt.Chart(invisible).mark_rule(color="grey", strokeDash=[4, 3]).encode(y="penalty:Q")
note = alt.Chart(invisible).mark_text(align="left", x=4, dy=-7, color="grey").encode(y="penalty:Q", text="what:N")
show_chart(alt.layer(lines, rule, note).properties(height=320), att, f"alibi-penalty-h{n_head}",
           "ALiBi's fixed penalty per head: before the softmax normalises, a key's weight is multiplied by "
           "exp(−penalty), whatever its content.")
near, far = (max(retrieval.alibi_attenuation(n_head, [d]), key=lambda r: r["factor"]) for d in (4 * train_length, cap))
st.markdown(
    f"- ALiBi subtracts *slope × distance* from every attention logit. With {n_head} heads the gentlest slope is "
    f"{near['slope']:.4g}: a key {near['distance']:,} bytes back loses {near['penalty']:.1f} logits in that head "
    f"(weight × {near['factor']:.1e}), one {far['distance']:,} bytes back loses {far['penalty']:.0f} "
    f"(× {far['factor']:.1e}); the other heads lose far more. A far copy has to out-score that on content alone.\n"
    "- Predicting ordinary text needs mostly the last few dozen bytes, so the loss *per byte* hardly changes when the "
    "window grows: the far bytes were being ignored anyway. That is why ALiBi's bits-per-byte curve stays flat far past "
    "its training length (see the Extrapolation lab).\n"
    "- Copying needs one specific far byte. Once the first copy is further back than the gentlest head can reach, the "
    "second copy is as surprising as the no-copy control: the ratio against the control climbs to 1.\n"
    "- Flat perplexity is *graceful forgetting*, not long-context use: the repeat probe above tells the two apart."
)

sync_url(measure=measure)

# ------------------------------------------------------------------------------------------------
# Live probe on your text
# ------------------------------------------------------------------------------------------------
st.header("Run the probes live")
c1, c2, c3 = st.columns([3, 1, 1])
default_models = [n for n in ("shaw", "alibi", "rope") if n in names] or names[:3]
with c1:
    catalog.add_input()
    chosen = st.multiselect(catalog.say("Checkpoints", "Models"), names, format_func=catalog.label,
                            default=qp_multi("models", default_models, names), key="w_models", wrap=True)
    catalog.caption()
# Each model runs in its own ids (bytes for a checkpoint, tokens for a published model): the gaps are counted
# in them, from the first chosen model's training length, up to the smallest device cap among the chosen.
unit = shared_unit(models[n] for n in chosen)
live_train = models[chosen[0]].train_length if chosen else train_length
live_cap = min((models[n].length_cap for n in chosen), default=cap)
gap_options = [g for g in probes.default_gaps(live_train) if 2 * 64 + g <= live_cap]
if len(gap_options) < 2:
    st.info(f"The chosen models' device cap ({live_cap:,} {unit_note(unit)}) leaves no gap to probe.", icon="ℹ️")
    st.stop()
longest = c2.select_slider("Longest gap", gap_options[1:], key="w_gap", format_func=lambda g: f"{g:,}",
                           value=int(qp_choice("gap", str(max(g for g in gap_options if g <= 2 * live_train)),
                                               [str(g) for g in gap_options[1:]])),
                           help=f"In {unit_note(unit)}.")
chunks = c3.slider("Chunks per gap", 2, 16, value=qp_int("chunks", 4, 2, 16), key="w_chunks")
key_values = st.toggle("Also run the key–value probe", value=qp_bool("kv", False), key="w_kv",
                       help="Names bound to 5-digit values, recalled after each gap: bits per byte of the value, and "
                            "how often the model's most likely ids write it out whole.")
text = choose_text()
sync_url(models=chosen, gap=longest, chunks=chunks, kv=key_values)
st.caption(f"Lengths fit the device cap of {live_cap:,} {unit_note(unit)} ({device_label()}).")
if text is None:
    st.stop()
if not chosen:
    st.info("Pick at least one checkpoint.")
    st.stop()
chosen = catalog.ready(chosen)  # a published model's weights load now, under a progress bar
if not chosen:
    st.info("Pick at least one other model.")
    st.stop()
wanted = [g for g in gap_options if g <= longest]
text_bytes = text.as_bytes()
encoded = {name: models[name].tokenize(text_bytes).ids for name in chosen}  # each model's own ids of the text
gaps_for = {name: [g for g in wanted if 2 * (64 + g) + 2 <= encoded[name].numel()] for name in chosen}
# one notice per length of text: every checkpoint reads the same bytes, each tokenizer its own tokens
short: dict[tuple[str, int], list[str]] = {}
for name in chosen:
    short.setdefault((models[name].unit, encoded[name].numel()), []).append(name)
for (text_unit, n_ids), holders in short.items():
    gaps = gaps_for[holders[0]]
    the_text = "The text" if len(short) == 1 else f"For {', '.join(map(plain, holders))}, the text"
    if len(gaps) < len(wanted):
        st.info(f"{the_text} has {n_ids:,} {text_unit}s: gaps past {max(gaps, default=0):,} need more text, "
                "so they are left out.", icon="ℹ️")
    if not gaps:
        error_box(PosvizError(f"{the_text} has {n_ids:,} {text_unit}s; the probe needs at least {2 * 64 + 2:,}."),
                  "Pick a longer document or paste more text.")
runnable = [name for name in chosen if gaps_for[name]]
if not runnable:
    st.stop()
text_key = hashlib.sha256(text_bytes).hexdigest()
trained = sorted({models[n].train_length for n in runnable})  # each model's training length, in its ids


def live_probe(probe: str, what: str, run) -> tuple[pd.DataFrame, object]:
    """(rows of the probe on every runnable model, the slot its chart goes in): each model's curve is drawn as
    soon as it is done, not after the last."""
    rows, slot = [], st.empty()
    for name in runnable:
        model, gaps = models[name], gaps_for[name]
        try:
            found = compute_once(
                probe + "_probe", model.key + (tuple(gaps), chunks, text_key),
                lambda progress, model=model, gaps=gaps, name=name: retrieval.results_rows(
                    name, probe, run(model, encoded[name], gaps, progress), gaps),
                f"{plain(display_name(name))}: {what} at {len(gaps)} gaps…")
        except PosvizError as exc:
            error_box(exc, f"{plain(display_name(name))} is skipped; the others keep going.")
            continue
        rows += [{**r, "model": display_name(name)} for r in found]
        if rows and name != runnable[-1]:  # the chart alone for now: its download button (a keyed widget) is drawn once, below
            slot.altair_chart(probe_chart(pd.DataFrame(rows), measure, probe, unit=unit, train_lengths=trained),
                              width="stretch")
    if not rows:
        slot.empty()
    return pd.DataFrame(rows), slot


live, live_slot = live_probe("repeat", "repeat probe", lambda model, ids, gaps, progress: probes.repeat_probe(
    model, ids, gaps, chunks=chunks, progress=progress))
if not live.empty:
    in_tokens = when_not_bytes(unit, f" Chunks of 64 and gaps in {unit_note(unit)}; losses in bits per byte "
                                     "either way.")
    with live_slot.container():
        show_chart(probe_chart(live, measure, "repeat", unit=unit, train_lengths=trained), live,
                   f"repeat-probe-live-g{longest}",
                   f"Live: {chunks} chunks per gap from the text above. Missing points: the method cannot run that far."
                   + in_tokens)
    # one word for the column: "checkpoint" while only ours are listed (as the pickers say), else "model"
    shown = live.pivot(index="model", columns="gap", values="ratio" if measure != "gain" else "gain").rename_axis(
        catalog.say("checkpoint", "model"))
    st.dataframe(shown.style.format("{:.2f}", na_rep="cannot run"), width="stretch", height="content")

if key_values:
    st.subheader("Key–value probe, live")
    recalled, recalled_slot = live_probe("key_value", "key–value probe", lambda model, ids, gaps, progress:
                                         key_value.key_value_probe(model, ids, gaps, trials=chunks, progress=progress))
    if not recalled.empty:
        with recalled_slot.container():
            show_chart(probe_chart(recalled, measure, "key_value", unit=unit, train_lengths=trained), recalled,
                       f"key-value-probe-live-g{longest}",
                       f"Live: {chunks} names per gap. Loss on the value when the name comes back, over its loss at "
                       "first sight (bits per byte of the ids that write the value).")
        written = recalled.pivot(index="model", columns="gap", values="second_correct").rename_axis(
            catalog.say("checkpoint", "model"))
        st.markdown("**Values written out whole** when the name comes back (share of names whose value the model's "
                    "most likely next ids reproduce, every id of it):")
        st.dataframe(written.style.format("{:.0%}", na_rep="cannot run"), width="stretch", height="content")

# ------------------------------------------------------------------------------------------------
# The retired random-string probe
# ------------------------------------------------------------------------------------------------
with st.expander("The earlier probe (a random string), and why it shows nothing here"):
    old = pd.DataFrame([{"model": display_name(n), "gap": g, "bits/byte": v} for n in names
                        for g, v in retrieval.shipped_copy_probe(models[n])])
    st.markdown(
        f"It asked every checkpoint to copy a random 32-byte string of letters and digits. None of these small "
        f"byte models learned to copy text unlike their training data: the second copy costs more than a blind guess "
        f"(log₂ 36 = {retrieval.RANDOM_STRING_BITS:.2f} bits) at every gap, so the curves say nothing about position "
        "methods. The probes above use held-out code, the kind of text the models know."
    )
    if not old.empty:
        st.dataframe(old.pivot(index="model", columns="gap", values="bits/byte").rename_axis("checkpoint").style.format("{:.2f}", na_rep="cannot run"),
                     width="stretch", height="content")
