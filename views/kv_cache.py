"""KV cache & sliding window: why you cannot just shift a cache, and which methods do not need to."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from views._charts import metric_rows, show_cached_chart, show_chart, split_title
from views._models import usable_models
from views._page import error_box, page_header, plain
from views._serving import compute_once, stored_result
from views._text import choose_text
from views._url import qp_choice, qp_int, qp_multi, sync_url
from posviz.labs import kv_cache
from posviz.models.interface import open_model

from posviz.errors import PosvizError
from posviz.limits import MAX_KV_CACHE_POSITIONS, MAX_SLIDING_BYTES, device_label
from posviz.display import display_name

page_header(
    "KV cache & sliding window",
    "A text generator predicts one byte at a time and cannot afford to re-read its whole window for every byte, "
    "so it keeps the keys and values it already computed (the KV cache). Once the window is full, the oldest byte "
    "has to go. What happens to the positions then depends on the position method.",
)

TITLES = kv_cache.STRATEGY_TITLES  # each strategy's one name, here and in the Generation lab
# the legend says the strategies' names (the "how" column), in the strategies' order
COLOURS = alt.Scale(domain=[TITLES[s] for s in kv_cache.STRATEGIES], range=["#4e79a7", "#e15759", "#59a14f", "#b07aa1"])

with st.expander(f"The {len(kv_cache.STRATEGIES)} strategies", expanded=True):
    for strategy in kv_cache.STRATEGIES:
        st.markdown(f"**{TITLES[strategy][:1].upper() + TITLES[strategy][1:]}** — {kv_cache.STRATEGY_HOW[strategy]}")


catalog = usable_models(open_model)  # each resolved once; weights load when one is scored
models, names = catalog.models, catalog.names
train_length = models[names[0]].train_length

# ------------------------------------------------------------------------------------------------
# Controls
# ------------------------------------------------------------------------------------------------
left, right = st.columns(2)
with left:
    catalog.add_input()
    # One of each kind by default (absolute, attention-time bias, rotary): every byte is a forward pass,
    # so every shipped checkpoint at once takes several times longer; the others are one click away.
    default_models = [n for n in ("sinusoidal", "alibi", "rope") if n in catalog.shipped] or catalog.shipped[:3]
    chosen = st.multiselect(catalog.say("Checkpoints", "Models"), names, format_func=catalog.label,
                            default=qp_multi("models", default_models, names), key="w_models",
                            help="Each model scores the text three times, one byte (or token) at a time.", wrap=True)
    catalog.caption()
    # The window and the bytes scored count each model's own ids: bytes for a checkpoint, tokens for a published model.
    one, many = kv_cache.unit_words({models[n].unit for n in chosen if n in models} or {"byte"})
with right:
    text = choose_text()
sync_url(models=chosen)
if not chosen:
    st.info("Pick at least one checkpoint.")
    st.stop()
if text is None:
    st.stop()
text_bytes = text.as_bytes()
chosen = catalog.ready(chosen)  # a published model's weights load now, under a progress bar
if not chosen:
    st.stop()


def cache_contents_section() -> None:
    """What each chosen model's cache keeps, layer by layer (LabModel.cache_rows): a hybrid's recurrent layers keep a
    state of one size, its attention layers keys that grow with the text."""
    rows = [{"model": display_name(name), "layers": kv_cache.layer_span(r["layers"]), "layer kind": r["kind"],
             "its cache keeps": r["holds"], "grows with the text": "yes" if r["grows"] else "no"}
            for name in chosen for r in models[name].cache_rows()]
    if any(r["grows with the text"] == "no" for r in rows):
        st.markdown("**What each model's cache keeps**: only attention layers keep a key per cached "
                    f"{one}; a recurrent layer keeps a state of one size, which a window does not evict.")
        st.dataframe(pd.DataFrame(rows), hide_index=True)


cache_contents_section()

# ------------------------------------------------------------------------------------------------
# The two-pass diagram (no model needed: shown at once; its slider reruns only this section)
# ------------------------------------------------------------------------------------------------
@st.fragment
def two_pass_section() -> None:
    st.subheader("Which position each byte gets, pass t and pass t + 1")
    diagram_window = st.slider("Window drawn in the diagram", 4, 16, value=qp_int("dw", 8, 4, 16), key="w_dw",
                               help="A small window keeps the numbers readable; the pattern is the same for any W.")
    sync_url(dw=diagram_window)
    diagram = pd.DataFrame(kv_cache.two_pass_diagram(diagram_window))
    diagram["row"] = diagram["strategy"].map(TITLES) + " · pass " + diagram["pass"]
    diagram["key"] = diagram.apply(lambda r: "recomputed now" if r["recomputed"] else
                                   ("cached, position unchanged" if r["consistent"] else "cached, computed at another position"),
                                   axis=1)
    diagram["computed at"] = diagram.apply(lambda r: "" if r["recomputed"] else f"@{r['baked']}", axis=1)
    order = [f"{TITLES[s]} · pass {p}" for s in kv_cache.STRATEGIES for p in ("t", "t+1")]
    base = alt.Chart(diagram).encode(
        x=alt.X("byte:O", title="byte of the document"), y=alt.Y("row:N", sort=order, title=None, axis=alt.Axis(labelLimit=320)))
    cells = base.mark_rect(stroke="white", strokeWidth=2).encode(
        color=alt.Color("key:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=400), scale=alt.Scale(
            domain=["recomputed now", "cached, position unchanged", "cached, computed at another position"],
            range=["#59a14f", "#a0cbe8", "#e15759"])),
        tooltip=["row", "byte", alt.Tooltip("position:Q", title="position used in this pass"),
                 alt.Tooltip("baked:Q", title="position its cached key was computed at"), "key"])
    labels = base.mark_text(fontSize=15, fontWeight="bold", dy=-5).encode(text="position:Q")
    baked = base.mark_text(fontSize=10, dy=10, color="#333").encode(text="computed at:N")
    t = 2 * diagram_window
    show_chart(alt.layer(cells, labels, baked).properties(height=330), diagram, f"two-pass-diagram-W{diagram_window}",
               f"Window of {diagram_window} bytes, passes t = {t} and t + 1 = {t + 1}. Big number: the position attention "
               "uses for that byte in that pass. Small @p: the position the byte's cached key and value were computed at. "
               "Red cells are where the shifted cache lies: fine for methods that add position only at attention time "
               "(ALiBi, T5, Shaw, NoPE), wrong for methods that bake it into the keys (learned, sinusoidal, RoPE).",
               says=lambda: kv_cache.diagram_sentence(kv_cache.two_pass_diagram(diagram_window)))


two_pass_section()

# ------------------------------------------------------------------------------------------------
# Attention sinks: where StreamingLLM's first ids matter
# ------------------------------------------------------------------------------------------------
def sink_section() -> None:
    st.subheader(f"Attention on the first {one}: is there a sink to keep?")
    st.markdown(
        f"Trained models often pour attention onto the first {one} of a text, whatever it is (StreamingLLM's "
        f"*attention sink*); a window that evicts it then breaks them. Each cell is one head's mean attention on the "
        f"first {one}, from the queries at {kv_cache.SINK_QUERIES_FROM} and beyond of the text's first "
        f"{kv_cache.SINK_IDS} {many}; spread evenly, a head would put the share in the caption there.")
    rows = []
    for name in chosen:
        model = models[name]
        try:
            shares = compute_once("first_id_share", model.key + (text_bytes,),
                                  lambda progress, model=model: kv_cache.first_id_share(
                                      model, model.tokenize(text_bytes).ids, progress=progress),
                                  f"{plain(display_name(name))}: attention on the first {model.unit}, layer by layer…")
        except PosvizError as exc:
            st.warning(f"**{plain(display_name(name))}**: {exc}", icon="⚠️")
            continue
        rows += [{"model": display_name(name), **r} for r in shares]
        recurrent = [layer for layer in range(model.n_layer) if model.layer_kind(layer) != "attention"]
        if recurrent:  # first_id_share reads attention layers only
            st.caption(f"{plain(display_name(name))}: layer{'s' if len(recurrent) > 1 else ''} "
                       f"{', '.join(map(str, recurrent))} {'are' if len(recurrent) > 1 else 'is'} "
                       f"{model.layer_kind(recurrent[0])}, with no softmax weight to pour onto the first {one}: "
                       "only its attention layers are drawn.")
    if not rows:
        return
    verdict = kv_cache.sink_sentence(rows, one)
    st.markdown(f"**{plain(verdict)}**")  # the chart's answer in words (names may be a visitor's: quoted)
    shares = pd.DataFrame(rows)
    shares["share %"] = 100 * shares["share"]
    uniform = 100 * shares["uniform"].max()
    chart = alt.Chart(shares).mark_rect(stroke="white").encode(
        x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"),
        color=alt.Color("share %:Q", title="% on the first", scale=alt.Scale(scheme="purples", domain=[0, 100])),
        tooltip=["model", "layer", "head", alt.Tooltip("share %:Q", format=".1f")],
    ).properties(width=150, height=120).facet(facet=alt.Facet("model:N", sort=[display_name(n) for n in chosen],
                                                              title=None), columns=4)
    show_chart(chart, shares.drop(columns=["share"]), "first-id-share",
               f"Spread evenly over the keys it sees, a head would put {uniform:.1f} % on the first {one} (for a full layer).",
               says=verdict)


sink_section()

# ------------------------------------------------------------------------------------------------
# Score the document under each strategy
# ------------------------------------------------------------------------------------------------
# The scoring section's columns and what it draws them with (they depend on the unit only)
BPB = "bits/byte after the window fills"
STEP = one if " " not in one else "step"  # what one step scores: "byte" for the checkpoints
MS, SCORED, TIMED_COLUMN = f"ms/{STEP}", f"{STEP}s scored", f"{STEP}s timed"
COLUMNS = [TITLES[s] for s in kv_cache.STRATEGIES]


def results_frame(rows: list[dict]) -> pd.DataFrame:
    results = pd.DataFrame(rows, columns=["id", "checkpoint", "strategy", "how", BPB, "bits/byte, all bytes", MS,
                                          SCORED, TIMED_COLUMN, "note"])
    for column in (BPB, "bits/byte, all bytes", MS):
        results[column] = pd.to_numeric(results[column])
    return results


def show_tables(results: pd.DataFrame, done: bool, bpb_slot, speed_slot) -> None:
    """The two tables so far, into their slots; a cell not computed yet reads "…" (until ``done``: then "cannot run")."""
    def pivot(column: str) -> pd.DataFrame:
        table = results.pivot(index="id", columns="how", values=column) if len(results) else pd.DataFrame()
        return table.reindex(index=chosen, columns=COLUMNS)

    computed = {(r["id"], r["how"]) for _, r in results.iterrows()}

    def cell(table: pd.DataFrame, missing: str, fmt: str) -> pd.DataFrame:
        return pd.DataFrame([[f"{v:{fmt}}" if not pd.isna(v) else missing if (name, how) in computed or done else "…"
                              for how, v in zip(COLUMNS, table.loc[name])] for name in chosen],
                            index=pd.Index([display_name(n) for n in chosen], name="checkpoint"),
                            columns=pd.Index(COLUMNS, name="strategy"))

    # Shown as text so a missing value reads "cannot run" (the grid would print None); the CSV keeps numbers.
    bpb_slot.dataframe(cell(pivot(BPB), "cannot run", ".3f"), width="stretch", height="content")
    speed_slot.dataframe(cell(pivot(MS), "—", ".2f"), width="stretch", height="content")


def bar_charts(results: pd.DataFrame) -> tuple[alt.Chart, alt.Chart]:
    bpb = alt.Chart(results.dropna(subset=[BPB])).mark_bar().encode(
        x=alt.X("checkpoint:N", sort=[display_name(n) for n in chosen], title=None),
        xOffset=alt.XOffset("strategy:N", sort=list(kv_cache.STRATEGIES)),
        y=alt.Y(f"{BPB}:Q", title=split_title("bits per byte (lower is better)", 20)),  # the legend below takes height
        color=alt.Color("how:N", scale=COLOURS, title=None, legend=alt.Legend(orient="bottom", columns=1, labelLimit=300)),  # one a row: four in a row spilled at 1366
        tooltip=["checkpoint", "how", alt.Tooltip(f"{BPB}:Q", format=".3f"), "note"],
    ).properties(height=320)
    speed = alt.Chart(results.dropna(subset=[MS])).mark_bar().encode(
        x=alt.X("checkpoint:N", sort=[display_name(n) for n in chosen], title=None),
        xOffset=alt.XOffset("strategy:N", sort=list(kv_cache.STRATEGIES)),
        y=alt.Y(f"{MS}:Q", title=f"milliseconds per {STEP} (lower is faster)"),
        color=alt.Color("how:N", scale=COLOURS, title=None, legend=None),
        tooltip=["checkpoint", "how", alt.Tooltip(f"{MS}:Q", format=".2f"), TIMED_COLUMN],
    ).properties(height=320)
    return bpb, speed


@st.fragment
def scoring_section() -> None:
    """The window, the length scored and the three strategies' scores: moving either slider reruns this alone."""
    # within every chosen model's length cap: re-encoding runs a forward pass over the whole window per step
    top = min([MAX_KV_CACHE_POSITIONS, 1024] + [models[n].length_cap for n in chosen])
    windows = sorted({w for w in (16, 32, 64, 128, 256, 512, 1024, train_length) if w <= top}) or [16]
    window = st.select_slider(f"Window W ({many} of context, including the current {one})", windows,
                              value=int(qp_choice("W", str(train_length), [str(w) for w in windows])), key="w_W",
                              format_func=lambda w: f"{w:,}" + (" (train length)" if w == train_length else ""))
    sync_url(W=window)
    most = min(MAX_SLIDING_BYTES, len(text))
    if most < window + 2:
        error_box(PosvizError(f"The text has {len(text):,} bytes; scoring with a window of {window:,} needs at least "
                              f"{window + 2:,}."), "Choose a smaller window or a longer text.")
        st.stop()
    low = min(window + 2, most)
    # 32 bytes past the window by default (was 128, then 64): each re-encoded byte is a forward pass of W bytes and
    # each streaming one runs the sinks again, most of a new server's first visit (3.5 s of its 6.7 at 64, 2.1 at 32,
    # on 2 cores). 32 still tell the story on the default document at W = 256: past the first eviction the shifted
    # cache makes sinusoidal and RoPE worse than re-encoding by whole bits per byte, ALiBi by nothing.
    n_scored = st.slider(f"{many.capitalize()} to score, one at a time", low, most, value=qp_int("n", min(window + 32, most), low, most),
                        step=1, key="w_n", help="The first W predictions come from one forward pass (nothing is evicted yet, "
                        f"so the strategies agree); every {one} after that is a step of its own. "
                        f"Capped at {MAX_SLIDING_BYTES:,} {many}.")
    sync_url(n=n_scored)
    st.subheader(f"Scoring {n_scored:,} {many} with a {window:,}-{one} window")
    expected = pd.DataFrame([{"checkpoint": display_name(n), **{TITLES[s]: kv_cache.strategy_verdict(models[n], s) for s in kv_cache.STRATEGIES}}
                             for n in chosen])
    with st.expander(catalog.say("What to expect for each checkpoint", "What to expect for each model"),
                     expanded=False):
        st.dataframe(expected, hide_index=True, height="content")

    st.markdown(f"**Bits per byte on {many} {window + 1:,}–{n_scored - 1:,}** (after the first eviction, where the strategies "
                "can differ; blank = cannot run)")
    bpb_slot = st.empty()
    st.markdown(f"**Milliseconds per {one}**, measured on this page ({device_label()})")
    speed_slot = st.empty()
    speed_note = st.empty()
    working = st.container()  # progress bars of the computations, under the tables they fill
    c1, c2 = st.columns(2)
    bpb_chart_slot, speed_chart_slot = c1.empty(), c2.empty()
    notes = st.container()


    def sliding_key(model, strategy: str) -> tuple:
        return model.key + (text_bytes, window, strategy, n_scored)


    # A first visitor sees each number as it is computed (the tables at once, the bars checkpoint by checkpoint);
    # a visitor whose results are all stored gets the finished page in one go.
    streaming = not all(stored_result("sliding", sliding_key(models[n], s))[0]
                        for n in chosen for s in kv_cache.STRATEGIES)
    rows = []
    if streaming:
        show_tables(results_frame(rows), False, bpb_slot, speed_slot)
    for i, name in enumerate(chosen):
        model = models[name]
        for strategy in kv_cache.STRATEGIES:
            def compute(progress, model=model, strategy=strategy):
                r = kv_cache.sliding_score(model, model.tokenize(text_bytes).ids, window, strategy, n_scored, progress)
                return {"bpb": r.bpb, "bpb_full": r.bpb_full, "ms": r.ms_per_byte, "n": r.n_scored, "error": r.error,
                        "timed": r.timed_steps}

            try:
                with working:
                    r = compute_once("sliding", sliding_key(model, strategy), compute,
                                     f"{plain(display_name(name))}: {TITLES[strategy]} over {n_scored:,} {model.unit}s…")
            except PosvizError as exc:
                r = {"bpb": None, "bpb_full": None, "ms": None, "n": 0, "error": str(exc), "timed": 0}
            rows.append({"id": name, "checkpoint": display_name(name), "strategy": strategy, "how": TITLES[strategy],
                         BPB: r["bpb_full"], "bits/byte, all bytes": r["bpb"],
                         MS: r["ms"], SCORED: r["n"], TIMED_COLUMN: r.get("timed"),
                         "note": r["error"] or kv_cache.strategy_verdict(models[name], strategy)})
            if streaming:
                show_tables(results_frame(rows), False, bpb_slot, speed_slot)
        if streaming and i < len(chosen) - 1:  # the last checkpoint's bars are drawn with their downloads below
            bpb_chart, speed_chart = bar_charts(results_frame(rows))
            bpb_chart_slot.altair_chart(bpb_chart, width="stretch")
            speed_chart_slot.altair_chart(speed_chart, width="stretch")
    results = results_frame(rows)
    show_tables(results, True, bpb_slot, speed_slot)
    reencoded = results[results["strategy"] == "reencode"][TIMED_COLUMN].dropna()
    speed_note.caption(
        f"Shifted and cached strategies: every {one} after the window filled, each a step of its own. Re-encode: "
        + (f"the mean of {int(reencoded.max()):,} of those {many}, evenly spread, each re-encoded alone as a generator "
           f"does; its other {many} were re-encoded as batches of windows (the same bits, in fewer calls), whose time per "
           f"{one} is not what one {one} costs a generator. " if len(reencoded) and reencoded.max() > 0 else "")
        + "Measured on the first run; later views reuse it.")
    view_key = ("sliding-charts", text_bytes, window, n_scored) + tuple(models[n].key for n in chosen)
    with bpb_chart_slot.container():  # the charts are built only when their specs are not kept yet
        show_cached_chart(view_key + ("bpb",), lambda: (bar_charts(results)[0], results),
                          f"sliding-bpb-W{window}-n{n_scored}", "Missing bars: the strategy cannot run (see notes).")
    with speed_chart_slot.container():
        show_cached_chart(view_key + ("speed",), lambda: (bar_charts(results)[1], results),
                          f"sliding-speed-W{window}-n{n_scored}",
                          f"Wall-clock milliseconds per {one} of the steps after the window filled, one {one} at a time, as a "
                          "generator runs (first run; later views reuse it).")

    for _, r in results.iterrows():
        if pd.isna(r[BPB]):
            notes.warning(f"**{plain(r['checkpoint'])} · {r['how']}** — {r['note']}", icon="⚠️")


scoring_section()


# ------------------------------------------------------------------------------------------------
# T5 with a KV cache
# ------------------------------------------------------------------------------------------------
default_check = "t5" if "t5" in names else names[0]


@st.fragment  # its two widgets rerun only this section
def cache_check_section() -> None:
    st.subheader("A T5 relative bias works with a KV cache")
    st.markdown(
        "Some tutorials say T5's relative position bias rules out a KV cache, because the bias depends on the query. "
        "It depends on the query's *position* only: each cached key keeps the position it was written at, and the bias "
        "for a new query is looked up from the distances. Below, the same bytes are run once as a full forward pass and "
        "once byte by byte through a cache; the logits agree to float precision."
    )
    c1, c2 = st.columns(2)
    check_model = c1.selectbox(catalog.say("Checkpoint", "Model"), names, format_func=catalog.label,
                               index=names.index(qp_choice("check", default_check, names)), key="w_check")
    if not catalog.ready([check_model], c1):  # a published model loads now; one that cannot says why
        return
    model = models[check_model]
    u = model.unit
    n_text = model.count_ids(text_bytes)  # the text in the model's ids
    check_cap = min(MAX_KV_CACHE_POSITIONS, n_text, 1024)
    check_length = c2.slider(f"{u.capitalize()}s", 16, max(16, check_cap), value=qp_int("cl", min(64, check_cap), 16, max(16, check_cap)),
                             key="w_cl", help=f"Cached decoding of this many {u}s vs one forward pass over them.")
    sync_url(check=check_model, cl=check_length)
    try:
        check = compute_once(
            "cache_check", model.key + (text_bytes, check_length),
            lambda progress: kv_cache.cache_check(model, model.tokenize(text_bytes).ids, check_length, progress=progress),
            f"{plain(display_name(check_model))}: cached vs full forward over {check_length:,} {u}s…")
    except PosvizError as exc:
        error_box(exc, f"Choose fewer {u}s, or a model that can represent this many positions.")
    else:
        metric_rows([
            dict(label="max |cached − full| logit", value=f"{check['max_abs_diff']:.1e}",
                 help=f"Largest logit is {check['logit_scale']:.1f}; float32 rounding is about 1e-6 of that."),
            dict(label="full forward pass", value=f"{check['full_ms']:.1f} ms", help=f"all {check_length:,} {u}s at once"),
            dict(label=f"cached, per {u}", value=f"{check['cached_ms_per_byte']:.2f} ms"),
            dict(label=f"no cache (re-run the prefix), per {u}", value=f"{check['reencode_ms_per_byte']:.2f} ms",
                 help=f"Mean time of re-running {check['reencode_timed']:,} of the {check_length:,} prefixes, one in "
                      f"each of {check['reencode_timed']:,} equal stretches of 1–{check_length:,} {u}s."),
        ], per_row=2)  # long labels: four in a row were cut in presentation mode
        st.caption("Generation cannot use the full forward pass (it does not know the future bytes); the fair comparison is "
                   "the cached decoder against re-running the prefix for every new byte.")


cache_check_section()
