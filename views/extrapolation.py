"""Extrapolation lab: run the shipped checkpoints on a text at any length, live."""
from __future__ import annotations

import hashlib
import time

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from views import _extrapolation_charts as charts
from posviz.slides import extremes_sentence, length_words, multiple_words
from views._charts import RedrawClock, cached_spec, draw_spec, method_scales, metric_cells, show_cached_chart
from views._matrices import recurrent_layer_notes, show_matrix, show_pooled_matrix
from views._models import usable_models
from views._page import error_box, page_header, plain
from views._serving import compute_once, shared
from views._text import choose_text, coloured_html
from views._url import qp_choice, qp_int, qp_multi, sync_url
from posviz.labs import attention_maps, extrapolation, inputs as lab_inputs
from posviz.models.interface import open_model
from posviz.positions import POSITION_METHODS
from posviz.errors import PositionLimitError, PosvizError
from posviz.limits import device_label, max_eval_length
from posviz.display import display_name

page_header(
    "Extrapolation lab",
    "Every shipped checkpoint was trained on 256-byte windows. Drag the evaluation length past that and watch "
    "which position methods keep predicting well, which degrade, and which cannot run at all. Everything below "
    "the shipped curves is computed live on this machine.",
)


# ------------------------------------------------------------------------------------------------
# Live computations, once per server for every visitor (keyed on the weights' file stamp so a retrained
# checkpoint reloads), in the server's work queue
# ------------------------------------------------------------------------------------------------
def run_job(job: extrapolation.LiveJob, label: str):
    return compute_once(job.name, job.key, lambda progress: job.compute(), label)


def live_score(name: str, length: int, inspected: bool = False, layer: int = 0, log_scale: bool = True,
               stride: int | None = None) -> dict:
    """One model's score at this length; for the inspected model, from its map's forward pass
    where the text holds one window (see ``extrapolation.scoring_job``). With a ``stride``: sliding windows."""
    model = models[name]
    if stride is not None:
        return run_job(extrapolation.stride_job(model, text_bytes, length, stride),
                       f"Running {plain(display_name(name))} at {length:,} {model.unit}s, stride {stride:,}…")
    job = extrapolation.scoring_job(model, text_bytes, length, inspected, layer, log_scale)
    label = f"Running {plain(display_name(name))} at {length:,} {model.unit}s…"  # a progress bar's text is Markdown
    try:
        result = run_job(job, label)
    except PositionLimitError:
        raise
    except PosvizError:  # the map's pass is refused (a published model's map past the memory cap): score alone
        if job.name != "extrapolation-inspect":
            raise
        job = extrapolation.score_job(model, text_bytes, length)
        result = run_job(job, label)
    return result[0] if job.name == "extrapolation-inspect" else result


def live_view(name: str, length: int, layer: int, log_scale: bool) -> attention_maps.AttentionView:
    """The attention view of one layer: from the scoring pass when the text holds one window."""
    one_window = extrapolation.single_window(length, n_ids[name], models[name].length_cap)
    job = (extrapolation.inspect_job if one_window else extrapolation.attention_job)(
        models[name], text_bytes, length, layer, log_scale)
    result = run_job(job, f"Extracting layer {layer} attention of {plain(display_name(name))} at {length:,} {models[name].unit}s…")
    return result[1] if job.name == "extrapolation-inspect" else result


catalog = usable_models(open_model)  # each resolved once for this run; weights load when run
models, names = catalog.models, catalog.names

# ------------------------------------------------------------------------------------------------
# Controls
# ------------------------------------------------------------------------------------------------
left, right = st.columns([1, 1])
with left:
    catalog.add_input()
    shipped_names = catalog.shipped  # published models and fine-tuned variants: on request
    pretrained = [n for n in shipped_names if n in POSITION_METHODS] or shipped_names
    first_view = [n for n in extrapolation.FIRST_VIEW if n in pretrained] or pretrained
    chosen = st.multiselect(catalog.say("Checkpoints", "Models"), names, format_func=catalog.label,
                            default=qp_multi("models", first_view, names), key="w_models",
                            help="One checkpoint of each kind of position method by default; every shipped checkpoint "
                                 "is in the list. Each one picked is scored live at the length below.", wrap=True)
    catalog.caption()
    sync_url(models=chosen)
# the legend names only what is drawn, by display name (posviz.display): the charts' "model" column holds names
COLOURS, DASHES = method_scales([display_name(n) for n in chosen or names])
with right:
    text = choose_text()
if not chosen:
    st.info("Pick at least one checkpoint above.")
    st.stop()
if text is None:
    st.stop()
chosen = catalog.ready(chosen)  # a published model's weights load now, under a progress bar
if not chosen:
    st.info("Pick at least one other model above.")
    st.stop()

text_bytes = text.as_bytes()
text_digest = hashlib.blake2b(text_bytes, digest_size=16).hexdigest()
# the text's length in each model's ids (its bytes for a byte-level checkpoint)
n_ids = {n: models[n].count_ids(text_bytes) for n in chosen}
# Models of different units or trained contexts share one slider in multiples of each one's own context.
mixed = extrapolation.mixed_contexts([models[n] for n in chosen])
train_length = models[chosen[0]].train_length
unit = models[chosen[0]].unit
if mixed:
    multiples = extrapolation.multiple_options([models[n] for n in chosen], [n_ids[n] for n in chosen])
    if len(multiples) < 2:
        error_box(PosvizError(f"The text has only {len(text):,} bytes."), "Paste a longer text (a few thousand bytes at least).")
        st.stop()
else:
    cap = min(models[n].length_cap for n in chosen)
    text_ids = min(n_ids.values())
    usable = min(cap, text_ids)
    options = extrapolation.length_options(train_length, usable)
    if len(options) < 2:
        error_box(PosvizError(f"The text has only {len(text):,} bytes."), "Paste a longer text (a few hundred bytes at least).")
        st.stop()
    default_length = min(train_length, usable)
# ------------------------------------------------------------------------------------------------
# Everything below depends on the length: a fragment, so that moving the slider reruns and resends this
# part alone (the header, the checkpoint and text pickers above stay as they are)
# ------------------------------------------------------------------------------------------------
@st.fragment
def at_this_length() -> None:
    if mixed:
        stops = [f"{m:g}" for m in multiples]
        multiple = float(st.select_slider(
            "Evaluation length (multiple of each model's trained context)", stops,
            value=qp_choice("M", "1" if "1" in stops else stops[-1], stops), key="w_M",
            format_func=lambda m: f"{float(m):g}×",
            help="The chosen models count in different units (bytes, tokens) or were trained on different contexts: "
                 "each runs at this multiple of its own trained context, in its own ids, scoring non-overlapping "
                 "windows over the first ids of the text up to its own cap on this device."))
        sync_url(M=f"{multiple:g}")
        length = None
        lengths = {n: extrapolation.length_at_multiple(models[n], multiple) for n in chosen}
        blocked = {n: problem for n in chosen
                   if (problem := extrapolation.cannot_run_at(models[n], lengths[n], n_ids[n]))}
        st.caption(" · ".join(f"{plain(n)}: {lengths[n]:,} {models[n].unit}s (trained on {models[n].train_length:,})"
                              for n in chosen) + f". Caps on this device ({device_label()}): "
                   + ", ".join(f"{plain(n)} {models[n].length_cap:,}" for n in chosen) + ".")
    else:
        length = st.select_slider(
            f"Evaluation length ({unit}s)", options, value=int(qp_choice("L", str(default_length), [str(o) for o in options])),
            key="w_L",
            format_func=lambda n: f"{n:,} ({multiple_words(n / train_length)} train)",
            help=f"Each model scores non-overlapping windows of this many {unit}s over the first "
                 f"{cap:,} {unit}s of the text (fewer if the text is shorter).",
        )
        sync_url(L=length)
        multiple, lengths, blocked = None, {n: length for n in chosen}, {}
        # a published model's cap can be set by the time one pass takes: then say so
        reason = (models[chosen[0]].length_cap_reason
                  if cap != max_eval_length(train_length, models[chosen[0]].device) else None)
        st.caption(f"Cap on this device ({device_label()}): {cap:,} {unit}s = {cap // train_length} × the training length of "
                   f"{train_length:,}" + (f" ({reason})" if reason else "") + ". "
                   + (f"This text has {text_ids:,} {unit}s, so the slider stops at {usable:,}." if text_ids < cap else ""))
    STRIDES = {"none": None, "1/2": 2, "1/4": 4, "1/8": 8}
    stride_choice = st.radio(
        "Scoring", list(STRIDES), index=list(STRIDES).index(qp_choice("stride", "none", list(STRIDES))), key="w_stride",
        horizontal=True, format_func=lambda k: "non-overlapping windows" if k == "none" else f"sliding, stride {k}",
        help="Non-overlapping windows, as the shipped curves: the id after a window boundary is predicted from one id "
             "of context. Sliding windows, as YaRN's evaluation: windows advance by the stride (a fraction of the "
             "window) and only their last stride predictions count, so every id past the first window has at least "
             "window − stride ids of context. It costs window ÷ stride times as much.")
    sync_url(stride=stride_choice)
    strides = {n: None if STRIDES[stride_choice] is None else max(1, lengths[n] // STRIDES[stride_choice]) for n in chosen}

    # ------------------------------------------------------------------------------------------------
    # 1. Bits per byte at this length, on each model's shipped curve
    # ------------------------------------------------------------------------------------------------
    st.subheader(f"Bits per byte at {multiple:g}× each model's trained context" if mixed else
                 f"Bits per byte at {length:,} {unit}s")
    shipped_rows = []
    for name in chosen:
        noise = extrapolation.shipped_bpb_intervals(models[name])
        for n, bpb in extrapolation.shipped_bpb_curve(models[name]):
            if bpb is not None:
                row = {"model": display_name(name), "length": n, "bits/byte": bpb, "source": "shipped (131 kB of validation text)",
                       "interval": noise.get(n, "not stored")}
                shipped_rows.append({**row, "multiple": n / models[name].train_length} if mixed else row)
    COLUMNS = ["model", "length", "bits/byte", "source", "interval"] + (["multiple"] if mixed else [])
    shipped = pd.DataFrame(shipped_rows, columns=COLUMNS)
    # one training run per curve; where other seeds of a recipe were trained, their lowest-to-highest as a band
    bands = {} if mixed else {n: extrapolation.seed_band(models[n]) for n in chosen}
    band = pd.DataFrame([{"model": display_name(n), "length": L, "lowest": lo, "highest": hi, "seeds": k}
                         for n, rows in bands.items() for L, lo, hi, k in rows],
                        columns=["model", "length", "lowest", "highest", "seeds"])
    if not band.empty:
        show_band = st.toggle("Each curve's range over its training seeds", key="w_seeds",
                              value=qp_choice("seeds", "on", ["on", "off"]) == "on",
                              help="Shaded: the lowest to the highest stored bits per byte over the runs of the same "
                                   "recipe with other initial weights and data order. A gap between two curves inside "
                                   "their bands may be one training's luck.")
        sync_url(seeds="on" if show_band else "off")
        band = band if show_band else band.iloc[0:0]
        st.caption("Training seeds: " + "; ".join(f"{plain(display_name(n))} {max(r[3] for r in rows)}"
                                                  for n, rows in bands.items() if rows)
                   + ". The others: one run each.")

    def bpb_chart(live: pd.DataFrame) -> alt.LayerChart:
        return charts.bpb_chart(shipped, live, COLOURS, unit, train_length, length, multiple if mixed else None,
                                band=band)

    # Everything the charts below depend on: visitors with the same choices share them (see show_cached_chart).
    view_key = (("extrapolation-multiple", tuple(chosen), multiple) if mixed else ("extrapolation", tuple(chosen), length)) \
        + (len(band),) + (text_digest, tuple(models[n].key for n in chosen)) + ((("stride", stride_choice),) if stride_choice != "none" else ())
    curve_slot = st.empty()
    with curve_slot.container():
        if shipped.empty and any(models[n].stored_metrics() for n in chosen):  # evaluated checkpoints store a curve
            st.info("The shipped checkpoints have no stored bpb-vs-length curve yet (run `python -m posviz.evaluate_all`). "
                    "Live numbers follow.")
        elif shipped.empty:
            st.caption("Live numbers are being computed…")
        else:
            draw_spec(cached_spec(view_key + ("shipped",), lambda: bpb_chart(pd.DataFrame())))
            st.caption("Shipped curves shown; live numbers are being computed…")

    def planned(widget_key: str, link_key: str, options: list, default):
        """The value a widget further down will hold on this run (its state, else its link), read silently."""
        value = st.session_state.get(widget_key, st.query_params.get(link_key, default))
        return value if value in options else default


    # The checkpoint, layer and colour scale the "Inside one model" section will show, so that model's
    # score and attention map come from one forward pass where they can.
    planned_inspect = planned("w_inspect", "inspect", chosen, chosen[0])
    planned_layers = list(range(models[planned_inspect].n_layer))
    planned_layer = int(planned("w_layer", "layer", planned_layers + [str(x) for x in planned_layers], planned_layers[-1]))
    planned_log = planned("w_scale", "scale", ["log", "prob"], "log") == "log"

    def metric_of(name: str) -> dict:
        """The st.metric arguments of one model's live result (or of its failure); a metric's label is Markdown,
        and a model's name may be a visitor's (a Workshop label, a folder): quoted."""
        if name not in scores:
            return dict(label=plain(display_name(name)), value="—", help="Cannot run at this length: see the message below.")
        # No delta: the stored score at the training length is of other text (the long held-out documents), so a
        # difference from it moved every checkpoint by about +0.3 at the training length itself, this text's own
        # difficulty, not the length's. The chart puts this text's dot beside that stored curve, each labelled.
        where = (f" ({lengths[name]:,} {models[name].unit}s, {multiple:g}× its trained context)" if mixed else "")
        return dict(label=plain(display_name(name)), value=f"{scores[name]['bpb']:.3f}",
                    help=f"Bits per byte on this text at this length{where}.")


    def live_frame() -> pd.DataFrame:
        if mixed:
            return pd.DataFrame([{"model": display_name(n), "length": lengths[n], "bits/byte": s["bpb"], "multiple": multiple,
                                  "source": f"live: this text, {s['n_windows']} window(s) of {lengths[n]:,} {models[n].unit}s"
                                            + (f", stride {strides[n]:,}" if strides[n] else "")}
                                 for n, s in scores.items()], columns=[c for c in COLUMNS if c != "interval"])
        return pd.DataFrame([{"model": display_name(n), "length": length, "bits/byte": s["bpb"],
                              "source": f"live: this text, {s['n_windows']} window(s) of {length:,}"
                                        + (f", stride {strides[n]:,}" if strides[n] else "")} for n, s in scores.items()],
                            columns=["model", "length", "bits/byte", "source"])


    # Each checkpoint's number appears as soon as it is computed (its metric, and its dot on the chart);
    # results another visitor already asked for come from the server's store at once.
    scores, errors = {}, {}
    # which text and which length, where the numbers stand (the chart's dashed curves are the held-out set's)
    st.markdown(f"**Bits per byte on this document, live**, at {'each model’s ' + format(multiple, 'g') + '× its trained context' if mixed else format(length, ',') + ' ' + unit + 's'} "
                "(the dashed curves below: the held-out validation set, stored)")
    cells = metric_cells(len(chosen), per_row=5)
    # The chart is redrawn with the dots so far at most once a REDRAW_S: each redraw builds the whole chart (about
    # 0.15 s on 2 cores), which drawn after every checkpoint was a third of a first visit's wait.
    redraw = RedrawClock()
    for i, (name, cell) in enumerate(zip(chosen, cells)):
        started = time.perf_counter()
        try:
            if name in blocked:  # past its table, its cap or the text at this multiple: said without running it
                raise PosvizError(blocked[name])
            scores[name] = live_score(name, lengths[name], name == planned_inspect, planned_layer, planned_log,
                                      strides[name])
        except PosvizError as exc:  # PositionLimitError included: learned past its table
            errors[name] = str(exc)
        cell.metric(**metric_of(name))
        computed = time.perf_counter() - started > 0.05  # not a lookup in the store: the visitor waited for it
        if computed and i + 1 < len(chosen) and not shipped.empty and redraw.due():
            with curve_slot.container():
                st.altair_chart(bpb_chart(live_frame()), width="stretch")
                st.caption(f"Live: {i + 1} of {len(chosen)} checkpoints done; the rest are being computed…")

    live = live_frame()
    with curve_slot.container():
        if shipped.empty and live.empty:
            st.info("Nothing to draw yet.")
        else:
            show_cached_chart(view_key + ("bpb",), lambda: (bpb_chart(live), pd.concat([shipped, live], ignore_index=True)),
                              f"bpb-vs-multiple-M{multiple:g}" if mixed else f"bpb-vs-length-L{length}",
                       "Dashed: the shipped curves (131 kB of validation text). Big dots: live, on this text at this length. "
                       "A different text gives a different level, so compare a dot with its own curve's shape."
                       + (" Each model at the same multiple of its own trained context, in its own units; bits per byte "
                          "compare across byte-level and tokenized models." if mixed else ""),
                       says=lambda: None if mixed else extremes_sentence(live, "model", "length", "bits/byte",
                                                                "bits per byte on this text", length_words(train_length, unit)))
    for name, message in errors.items():
        st.error(f"**{plain(display_name(name))}** — {message}", icon="🚫")
        table = models[name].max_positions
        if table is not None and lengths[name] > table:
            st.caption(f"Why {plain(display_name(name))} stops: its positions are rows of a trained table, and the table has "
                       f"{table:,} rows. A sinusoidal model can *compute* position {lengths[name] - 1:,} (it has just "
                       "never seen it); a learned table has nothing to look up. The other checkpoints keep going.")

    if not scores:
        st.stop()

    # ------------------------------------------------------------------------------------------------
    # 2. Mean loss at each position in the window
    # ------------------------------------------------------------------------------------------------
    st.subheader("Loss at each position in the window")
    smooth = max(1, (length or 0) // 64)
    n_windows = max(s["n_windows"] for s in scores.values())

    if mixed:
        show_cached_chart(view_key + ("loss",), lambda: charts.multiple_loss_chart(scores, lengths, models, COLOURS, multiple),
                          f"loss-by-position-M{multiple:g}",
                          "Mean over each model's windows, smoothed over 1/64 of its window. Bits per id: per byte for a "
                          "byte-level checkpoint, per token for a tokenized model, so compare each curve's shape, not "
                          "their levels. Past the dashed line the model predicts from more context than it ever had "
                          "in training.")
    else:
        show_cached_chart(view_key + ("loss",), lambda: charts.loss_chart(scores, length, smooth, train_length, unit, COLOURS),
                          f"loss-by-position-L{length}",
                          f"Mean over {n_windows} window(s)" + (f", smoothed over {smooth} positions" if smooth > 1 else "") +
                          (f"; sliding windows: each position's mean over the windows where it counts (the first "
                           "window's every position, the others' last stride)" if stride_choice != "none" else "") +
                          ". Past the dashed line the model predicts from more context than it ever had in training: relative "
                          "methods stay flat or improve, absolute ones often rise.")

    # ------------------------------------------------------------------------------------------------
    # 3. The text coloured by loss, and attention for one model
    # ------------------------------------------------------------------------------------------------
    @st.fragment
    def inside_one_model() -> None:
        """Sections 3 and 4: a change of checkpoint, layer, head or colour reruns only this part of the page."""
        st.subheader("Inside one model")
        live_names = list(scores)
        c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
        inspect = c1.selectbox("Checkpoint to inspect", live_names, format_func=display_name,
                               index=live_names.index(qp_choice("inspect", live_names[0], live_names)), key="w_inspect")
        n_layer, n_head = models[inspect].n_layer, models[inspect].n_head
        layer = c2.selectbox("Layer", range(n_layer), index=qp_int("layer", n_layer - 1, 0, n_layer - 1), key="w_layer")
        head_options = ["all"] + [str(h) for h in range(n_head)]
        head = c3.selectbox("Head", head_options, index=head_options.index(qp_choice("head", "all", head_options)),
                            format_func=lambda h: "all (grid)" if h == "all" else f"head {h}", key="w_head")
        scales = ["log", "prob"]
        scale = c4.radio("Colour", scales, index=scales.index(qp_choice("scale", "log", scales)), key="w_scale",
                         format_func={"log": "log₁₀ probability", "prob": "probability"}.get, horizontal=True)
        sync_url(inspect=inspect, layer=layer, head=head, scale=scale)
        model = models[inspect]
        # the inspected model's own length, unit and trained context (they differ between models only when mixed)
        L, u, T = lengths[inspect], model.unit, model.train_length
        short = lab_inputs.UNIT_SHORT.get(u, u)

        with st.expander(f"The text, coloured by {plain(display_name(inspect))}'s loss at length {L:,}", expanded=True):
            s = scores[inspect]
            encoded = model.tokenize(text_bytes)
            # the ids covering the first 4,096 bytes (a byte model's first 4,096 bytes)
            shown = min(s["n_ids"], int(np.searchsorted(np.cumsum(encoded.id_bytes), 4096, side="right")))
            st.html(shared("coloured-text", view_key + (inspect,), lambda: coloured_html(lab_inputs.id_characters_with_bits(
                model, encoded.ids[:shown], s["id_bits"][:shown]), top=8.0)))
            shared_out = lab_inputs.when_not_bytes(u, f" (each {u}'s bits shared equally among its bytes)")
            st.caption(f"The first {shown:,} {u}s of the text; hover a character for its loss{shared_out}. " + (
                f"A new window starts every {L:,} {u}s: the {u} after a boundary is predicted from one {u} of context."
                if not strides[inspect] else f"Windows of {L:,} {u}s advance by {strides[inspect]:,}: past the first "
                f"window every {u} is predicted from at least {L - strides[inspect]:,} {u}s of context."))

        try:
            view = live_view(inspect, L, layer, scale == "log")
        except PosvizError as exc:  # a published model's map past this server's memory cap
            error_box(exc, "Choose a shorter length to see its attention; the scores above stand.")
            return
        value = "attention probability" if view.kind == "attention" else "share of the row's |implied weight|"
        value_title = f"log₁₀ {value}" if scale == "log" else value
        marks = [T] if T < L else []
        what = "Attention" if view.kind == "attention" else f"Implied matrix ({view.kind})"
        st.markdown(f"**{what} of {plain(display_name(inspect))}, layer {layer}, at {L:,} {u}s** "
                    f"(computed in {view.seconds:.2f} s)")
        recurrent_layer_notes([(plain(display_name(inspect)), view.kind)], layer,
                              "; distance and entropy read from those shares")

        def show_heads(view, tag: str, value_title: str) -> None:
            """``view``'s maps, every head in a grid or the one picked; ``tag`` tells its charts apart."""
            if head == "all":
                cols = st.columns(min(n_head, 4))
                for h in range(n_head):
                    with cols[h % len(cols)]:
                        show_pooled_matrix(view.maps[h], view.block, (L, L), f"{tag}-{inspect}-l{layer}-h{h}-L{L}",
                                           f"key {u}", f"query {u}", value_title, marks=marks, mark_label="the training length",
                                           side=256, compact=True, title=f"head {h}", key=view_key + (tag, inspect, layer, scale, h))
                        st.caption(f"distance {view.distance[h]:,.1f} {short} · entropy {view.entropy[h]:.2f} bits")
                lo, hi = shared("map-range", view_key + (tag, inspect, layer, scale), lambda: (
                    min(float(np.nanmin(m)) for m in view.maps), max(float(np.nanmax(m)) for m in view.maps)))
                st.caption(f"Rows: query {u} 0–{L - 1:,} (top to bottom); columns: key {u} 0–{L - 1:,} (left to right); "
                           f"colour (each map scaled to its own range): {value_title}, {lo:.3g} to {hi:.3g} overall; grey: future keys (masked)"
                           + (f"; each pixel averages {view.block}×{view.block} entries" if view.block > 1 else "")
                           + (f"; white lines: the training length ({T:,})" if marks else "")
                           + ". Distance: Σⱼ p·(i−j) averaged over queries; entropy: −Σⱼ p log₂ p.")
            else:
                h = int(head)
                col, _ = st.columns([3, 2])
                with col:
                    if view.block == 1 and L <= 256:
                        show_matrix(view.maps[h], f"{tag}-{inspect}-l{layer}-h{h}-L{L}", f"key {u}", f"query {u}",
                                    value_title, marks=marks, mark_label="the training length")
                    else:
                        show_pooled_matrix(view.maps[h], view.block, (L, L), f"{tag}-{inspect}-l{layer}-h{h}-L{L}",
                                           f"key {u}", f"query {u}", value_title, marks=marks, mark_label="the training length",
                                           key=view_key + (tag, inspect, layer, scale, h))
                st.caption(f"Head {h}: mean {'attention ' if tag == 'attention' else ''}distance {view.distance[h]:,.1f} {u}s, entropy {view.entropy[h]:.2f} bits.")

        show_heads(view, "attention", value_title)
        beside = model.beside_kind(layer)
        if beside:  # Falcon-H1: a Mamba-2 mixer beside the attention of every layer, on the same input
            try:
                other = run_job(extrapolation.beside_job(model, text_bytes, L, layer, scale == "log"),
                                f"Drawing the {beside} beside layer {layer} of {plain(display_name(inspect))}…")
            except PosvizError as exc:
                error_box(exc, "Choose a shorter length to see it; the attention above stands.")
            else:
                st.markdown(f"**Implied matrix ({beside}) beside the attention of {plain(display_name(inspect))}, "
                            f"layer {layer}, at {L:,} {u}s** (computed in {other.seconds:.2f} s)")
                st.caption(f"Layer {layer} runs a {beside} mixer beside its attention on the same input and adds the "
                           "two outputs. The mixer has no softmax, but its output is still a weighted sum of its values, "
                           "o_t = Σ_s w_ts v_s (its implied matrix), here grouped to the attention's heads. Drawn: each "
                           "weight's share of its row's Σ|w| (signs dropped).")
                show_heads(other, "beside", "log₁₀ share of the row's |implied weight|" if scale == "log"
                           else "share of the row's |implied weight|")

        # ------------------------------------------------------------------------------------------------
        # 4. Attention distance and entropy per head as the length grows
        # ------------------------------------------------------------------------------------------------
        st.subheader("How far each head looks as the window grows")
        growth_at = attention_maps.growth_lengths(L, T, model.max_positions)

        growth_key = view_key + (inspect, layer, scale)
        g1, g2 = st.columns(2)
        with g1:
            show_cached_chart(growth_key + ("distance",), lambda: charts.growth_chart(view, growth_at, u, T, "distance", f"mean attention distance ({u}s)", ".1f"),
                              f"attention-distance-{inspect}-l{layer}", "Σⱼ p(i→j)·(i−j), averaged over queries.")
        with g2:
            show_cached_chart(growth_key + ("entropy",), lambda: charts.growth_chart(view, growth_at, u, T, "entropy", "mean attention entropy (bits)", ".2f"),
                              f"attention-entropy-{inspect}-l{layer}",
                              "−Σⱼ p log₂ p: 0 = one key; log₂(i+1) = uniform over all keys so far.")
        if model.max_positions is not None and model.max_positions < L:
            st.caption(f"{plain(display_name(inspect))} stops at {model.max_positions:,} {u}s (its table has no later positions).")


    inside_one_model()


at_this_length()
