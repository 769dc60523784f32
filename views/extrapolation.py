"""Extrapolation lab: run the shipped checkpoints on a text at any length, live."""
from __future__ import annotations

import hashlib
import time

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from views._charts import cached_spec, draw_spec, method_scales, metric_cells, show_cached_chart
from views._matrices import show_matrix, show_pooled_matrix
from views._page import error_box, page_header, usable_checkpoints
from views._serving import compute_once, shared
from views._text import choose_text, coloured_html
from views._url import qp_choice, qp_int, qp_multi, sync_url
from posviz import attention_maps, extrapolation, lab_inputs
from posviz.lab_model import open_model
from posviz.positions import POSITION_METHODS
from posviz.errors import PosvizError
from posviz.limits import device_label

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


def live_score(name: str, length: int, inspected: bool = False, layer: int = 0, log_scale: bool = True) -> dict:
    """One checkpoint's score at this length; for the inspected checkpoint, from its map's forward pass
    where the text holds one window (see ``extrapolation.scoring_job``)."""
    job = extrapolation.scoring_job(models[name], text_bytes, length, inspected, layer, log_scale)
    result = run_job(job, f"Running {name} at {length:,} bytes…")
    return result[0] if job.name == "extrapolation-inspect" else result


def live_view(name: str, length: int, layer: int, log_scale: bool) -> attention_maps.AttentionView:
    """The attention view of one layer: from the scoring pass when the text holds one window."""
    one_window = extrapolation.single_window(length, len(text_bytes), models[name].length_cap)
    job = (extrapolation.inspect_job if one_window else extrapolation.attention_job)(
        models[name], text_bytes, length, layer, log_scale)
    result = run_job(job, f"Extracting layer {layer} attention of {name} at {length:,} bytes…")
    return result[1] if job.name == "extrapolation-inspect" else result


checkpoints, models = usable_checkpoints(open_model)  # each resolved once for this run; weights load when run
names = list(models)

# ------------------------------------------------------------------------------------------------
# Controls
# ------------------------------------------------------------------------------------------------
left, right = st.columns([1, 1])
with left:
    pretrained = [n for n in names if n in POSITION_METHODS] or names  # fine-tuned variants: on request
    chosen = st.multiselect("Checkpoints", names, default=qp_multi("models", pretrained, names), key="w_models")
    sync_url(models=chosen)
COLOURS, DASHES = method_scales(chosen or names)  # the legend names only what is drawn
with right:
    text = choose_text()
if not chosen:
    st.info("Pick at least one checkpoint above.")
    st.stop()
if text is None:
    st.stop()

train_length = models[chosen[0]].train_length
cap = min(models[n].length_cap for n in chosen)
usable = min(cap, len(text))
options = extrapolation.length_options(train_length, usable)
if len(options) < 2:
    error_box(PosvizError(f"The text has only {len(text):,} bytes."), "Paste a longer text (a few hundred bytes at least).")
    st.stop()
text_bytes = text.as_bytes()
default_length = min(train_length, usable)
# ------------------------------------------------------------------------------------------------
# Everything below depends on the length: a fragment, so that moving the slider reruns and resends this
# part alone (the header, the checkpoint and text pickers above stay as they are)
# ------------------------------------------------------------------------------------------------
@st.fragment
def at_this_length() -> None:
    length = st.select_slider(
        "Evaluation length (bytes)", options, value=int(qp_choice("L", str(default_length), [str(o) for o in options])),
        key="w_L",
        format_func=lambda n: f"{n:,} ({n / train_length:g}× train)",
        help="Each model scores non-overlapping windows of this many bytes over the first "
             f"{cap:,} bytes of the text (fewer if the text is shorter).",
    )
    sync_url(L=length)
    st.caption(f"Cap on this device ({device_label()}): {cap:,} bytes = {cap // train_length} × the training length of "
               f"{train_length:,}. " + (f"This text has {len(text):,} bytes, so the slider stops at {usable:,}." if
                                        len(text) < cap else ""))

    # ------------------------------------------------------------------------------------------------
    # 1. Bits per byte at this length, on each model's shipped curve
    # ------------------------------------------------------------------------------------------------
    st.subheader(f"Bits per byte at {length:,} bytes")
    shipped_rows = []
    for name in chosen:
        for n, bpb in extrapolation.shipped_bpb_curve(models[name]):
            if bpb is not None:
                shipped_rows.append({"model": name, "length": n, "bits/byte": bpb, "source": "shipped (131 kB of validation text)"})
    shipped = pd.DataFrame(shipped_rows, columns=["model", "length", "bits/byte", "source"])


    def bpb_chart(live: pd.DataFrame) -> alt.LayerChart:
        x = alt.X("length:Q", scale=alt.Scale(type="log", base=2), title="evaluation length (bytes, log scale)")
        y = alt.Y("bits/byte:Q", title="bits per byte (lower is better)", scale=alt.Scale(zero=False))
        colour = alt.Color("model:N", scale=COLOURS, title="checkpoint")
        layers = [alt.Chart(shipped).mark_line(point=alt.OverlayMarkDef(size=30), strokeDash=[4, 3], opacity=0.7)
                  .encode(x, y, colour, tooltip=["model", "length", alt.Tooltip("bits/byte:Q", format=".3f"), "source"])]
        if not live.empty:
            layers.append(alt.Chart(live).mark_point(size=220, filled=True, stroke="black", strokeWidth=1.2)
                          .encode(x, y, colour, tooltip=["model", "length", alt.Tooltip("bits/byte:Q", format=".3f"),
                                                         "source"]))
        rules = pd.DataFrame({"length": [train_length], "what": ["training length = this length"]}) if length == train_length \
            else pd.DataFrame({"length": [train_length, length], "what": ["training length", "this length"]})
        layers.append(alt.Chart(rules).mark_rule(strokeDash=[2, 2], color="grey").encode(
            x="length:Q", tooltip=["what", "length"]))
        layers.append(alt.Chart(rules).mark_text(align="left", dx=4, dy=-6, color="grey", baseline="top").encode(
            x="length:Q", y=alt.value(0), text="what"))
        return alt.layer(*layers).properties(height=360)


    # Everything the charts below depend on: visitors with the same choices share them (see show_cached_chart).
    view_key = ("extrapolation", tuple(chosen), length, hashlib.blake2b(text_bytes, digest_size=16).hexdigest(),
                tuple(models[n].key for n in chosen))
    curve_slot = st.empty()
    with curve_slot.container():
        if shipped.empty:
            st.info("The shipped checkpoints have no stored bpb-vs-length curve yet (run `python -m posviz.evaluate_all`). "
                    "Live numbers follow.")
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
        """The st.metric arguments of one checkpoint's live result (or of its failure)."""
        if name not in scores:
            return dict(label=name, value="—", help="Cannot run at this length: see the message below.")
        ref = dict(extrapolation.shipped_bpb_curve(models[name])).get(train_length)
        return dict(label=name, value=f"{scores[name]['bpb']:.3f}", delta=None if ref is None else f"{scores[name]['bpb'] - ref:+.3f}",
                    delta_color="inverse", help="Bits per byte on this text at this length. The small number: the "
                    f"difference from the shipped bits per byte at the training length ({train_length:,}).")


    def live_frame() -> pd.DataFrame:
        return pd.DataFrame([{"model": n, "length": length, "bits/byte": s["bpb"],
                              "source": f"live: this text, {s['n_windows']} window(s) of {length:,}"} for n, s in scores.items()],
                            columns=["model", "length", "bits/byte", "source"])


    # Each checkpoint's number appears as soon as it is computed (its metric, and its dot on the chart);
    # results another visitor already asked for come from the server's store at once.
    scores, errors = {}, {}
    cells = metric_cells(len(chosen), per_row=5)
    for i, (name, cell) in enumerate(zip(chosen, cells)):
        started = time.perf_counter()
        try:
            scores[name] = live_score(name, length, name == planned_inspect, planned_layer, planned_log)
        except PosvizError as exc:  # PositionLimitError included: learned past its table
            errors[name] = str(exc)
        cell.metric(**metric_of(name))
        computed = time.perf_counter() - started > 0.05  # not a lookup in the store: the visitor waited for it
        if computed and i + 1 < len(chosen) and not shipped.empty:
            with curve_slot.container():
                st.altair_chart(bpb_chart(live_frame()), width="stretch")
                st.caption(f"Live: {i + 1} of {len(chosen)} checkpoints done; the rest are being computed…")

    live = live_frame()
    with curve_slot.container():
        if shipped.empty and live.empty:
            st.info("Nothing to draw yet.")
        else:
            show_cached_chart(view_key + ("bpb",), lambda: (bpb_chart(live), pd.concat([shipped, live], ignore_index=True)),
                              f"bpb-vs-length-L{length}",
                       "Dashed: the shipped curves (131 kB of validation text). Big dots: live, on this text at this length. "
                       "A different text gives a different level, so compare a dot with its own curve's shape.")
    for name, message in errors.items():
        st.error(f"**{name}** — {message}", icon="🚫")
        if models[name].max_positions is not None:
            st.caption(f"Why {name} stops: its positions are rows of a trained table, and the table has "
                       f"{models[name].max_positions:,} rows. A sinusoidal model can *compute* position {length - 1:,} (it has just "
                       "never seen it); a learned table has nothing to look up. The other checkpoints keep going.")

    if not scores:
        st.stop()

    # ------------------------------------------------------------------------------------------------
    # 2. Mean loss at each position in the window
    # ------------------------------------------------------------------------------------------------
    st.subheader("Loss at each position in the window")
    smooth = max(1, length // 64)
    n_windows = max(s["n_windows"] for s in scores.values())


    def loss_chart() -> tuple[alt.LayerChart, pd.DataFrame]:
        # Draw at most ~512 points a line (the smoothing window is wider than the gap between them); the CSV
        # keeps every position. Thousands of points per line made the browser, not the model, the slow part.
        drawn_every = max(1, length // 512)
        frames = []
        for name, s in scores.items():
            raw = np.asarray(s["position_bits"], dtype=float)
            smoothed = lab_inputs.moving_average(raw, smooth)
            keep = np.isfinite(smoothed)
            frames.append(pd.DataFrame({"model": name, "position": np.arange(raw.size)[keep], "bits": smoothed[keep],
                                        "raw bits": raw[keep]}))
        pos_df = pd.concat(frames, ignore_index=True)
        drawn = pos_df[(pos_df["position"] % drawn_every == 0) | (pos_df["position"] == length - 1)]
        x = alt.X("position:Q", title="position in the window (the prediction made there sees position + 1 bytes)")
        lines = alt.Chart(drawn).mark_line().encode(
            x, alt.Y("bits:Q", title="mean loss (bits)", scale=alt.Scale(zero=False)),
            alt.Color("model:N", scale=COLOURS, title="checkpoint"),
            tooltip=["model", "position", alt.Tooltip("bits:Q", format=".3f"), alt.Tooltip("raw bits:Q", format=".3f")])
        layers = [lines]
        if train_length < length:
            mark = pd.DataFrame({"position": [train_length], "what": ["training length"]})
            layers += [alt.Chart(mark).mark_rule(strokeDash=[4, 3], color="grey").encode(x="position:Q"),
                       alt.Chart(mark).mark_text(align="left", dx=4, color="grey", baseline="top").encode(
                           x="position:Q", y=alt.value(0), text="what")]
        return alt.layer(*layers).properties(height=320), pos_df


    show_cached_chart(view_key + ("loss",), loss_chart, f"loss-by-position-L{length}",
                      f"Mean over {n_windows} window(s)" + (f", smoothed over {smooth} positions" if smooth > 1 else "") +
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
        inspect = c1.selectbox("Checkpoint to inspect", live_names,
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

        with st.expander(f"The text, coloured by {inspect}'s loss at length {length:,}", expanded=True):
            s = scores[inspect]
            shown = min(s["n_bytes"], 4096)
            st.html(shared("coloured-text", view_key + (inspect,), lambda: coloured_html(lab_inputs.characters_with_bits(
                list(text_bytes[:shown]), s["byte_bits"][:shown]), top=8.0)))
            st.caption(f"The first {shown:,} bytes of the text; hover a character for its loss. A new window starts every "
                       f"{length:,} bytes: the byte after a boundary is predicted from one byte of context.")

        view = live_view(inspect, length, layer, scale == "log")
        value_title = "log₁₀ attention probability" if scale == "log" else "attention probability"
        marks = [train_length] if train_length < length else []
        st.markdown(f"**Attention of {inspect}, layer {layer}, at {length:,} bytes** "
                    f"(computed in {view.seconds:.2f} s)")
        if head == "all":
            cols = st.columns(min(n_head, 4))
            for h in range(n_head):
                with cols[h % len(cols)]:
                    show_pooled_matrix(view.maps[h], view.block, (length, length), f"attention-{inspect}-l{layer}-h{h}-L{length}",
                                       "key byte", "query byte", value_title, marks=marks, mark_label="the training length",
                                       side=256, compact=True, title=f"head {h}", key=view_key + (inspect, layer, scale, h))
                    st.caption(f"distance {view.distance[h]:,.1f} B · entropy {view.entropy[h]:.2f} bits")
            lo, hi = shared("map-range", view_key + (inspect, layer, scale), lambda: (
                min(float(np.nanmin(m)) for m in view.maps), max(float(np.nanmax(m)) for m in view.maps)))
            st.caption(f"Rows: query byte 0–{length - 1:,} (top to bottom); columns: key byte 0–{length - 1:,} (left to right); "
                       f"colour (each map scaled to its own range): {value_title}, {lo:.3g} to {hi:.3g} overall; grey: future keys (masked)"
                       + (f"; each pixel averages {view.block}×{view.block} entries" if view.block > 1 else "")
                       + (f"; white lines: the training length ({train_length:,})" if marks else "")
                       + ". Distance: Σⱼ p·(i−j) averaged over queries; entropy: −Σⱼ p log₂ p.")
        else:
            h = int(head)
            col, _ = st.columns([3, 2])
            with col:
                if view.block == 1 and length <= 256:
                    show_matrix(view.maps[h], f"attention-{inspect}-l{layer}-h{h}-L{length}", "key byte", "query byte",
                                value_title, marks=marks, mark_label="the training length")
                else:
                    show_pooled_matrix(view.maps[h], view.block, (length, length), f"attention-{inspect}-l{layer}-h{h}-L{length}",
                                       "key byte", "query byte", value_title, marks=marks, mark_label="the training length",
                                       key=view_key + (inspect, layer, scale, h))
            st.caption(f"Head {h}: mean attention distance {view.distance[h]:,.1f} bytes, entropy {view.entropy[h]:.2f} bits.")

        # ------------------------------------------------------------------------------------------------
        # 4. Attention distance and entropy per head as the length grows
        # ------------------------------------------------------------------------------------------------
        st.subheader("How far each head looks as the window grows")
        lengths = attention_maps.growth_lengths(length, train_length, models[inspect].max_positions)

        def growth_chart(value: str, title: str, fmt: str):
            # Read off the map's own forward pass: the first n queries of a causal model attend as a window of n would.
            growth = pd.DataFrame(attention_maps.prefix_growth(view, lengths))
            growth["head"] = growth["head"].map(lambda h: f"head {h}")
            x = alt.X("length:Q", scale=alt.Scale(type="log", base=2), title="window length (bytes, log scale)")
            rule = alt.Chart(pd.DataFrame({"length": [train_length]})).mark_rule(strokeDash=[4, 3], color="grey").encode(
                x="length:Q")
            return alt.layer(alt.Chart(growth).mark_line(point=True).encode(
                x, alt.Y(f"{value}:Q", title=title), alt.Color("head:N", title=None),
                tooltip=["head", "length", alt.Tooltip(f"{value}:Q", format=fmt)]), rule).properties(height=280), growth

        growth_key = view_key + (inspect, layer, scale)
        g1, g2 = st.columns(2)
        with g1:
            show_cached_chart(growth_key + ("distance",), lambda: growth_chart("distance", "mean attention distance (bytes)", ".1f"),
                              f"attention-distance-{inspect}-l{layer}", "Σⱼ p(i→j)·(i−j), averaged over queries.")
        with g2:
            show_cached_chart(growth_key + ("entropy",), lambda: growth_chart("entropy", "mean attention entropy (bits)", ".2f"),
                              f"attention-entropy-{inspect}-l{layer}",
                              "−Σⱼ p log₂ p: 0 = one key; log₂(i+1) = uniform over all keys so far.")
        if models[inspect].max_positions is not None and models[inspect].max_positions < length:
            st.caption(f"{inspect} stops at {models[inspect].max_positions:,} bytes (its table has no later positions).")


    inside_one_model()


at_this_length()
