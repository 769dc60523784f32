"""Home: what position methods are for, how the shipped ones compare, and where to explore each."""
import altair as alt
import pandas as pd
import streamlit as st

from posviz.slides import extremes_sentence, length_words
from views._charts import legend_for, method_scales
from views._checkpoints import shipped_checkpoint_json
from views._explore import chart
from views._page import page_header, plain
from views._url import qp_bool, qp_choice, sync_url
from posviz.explore import home
from posviz.display import display_name
from posviz.positions import POSITION_METHODS, method_names, opening_set

# The text behind every "bits/byte @ N×" here, the Scoreboard's and the labs' stored curves (metrics.json's eval block)
EVAL_TEXT = "the long held-out documents (the evaluation text)"

page_header(
    "posviz — how a transformer knows where each token is",
    "Positional encodings, explained with numbers you can change and checkpoints you can run.",
)

st.markdown(
    """
**The problem.** Attention scores every key against the query with a dot product, then takes a weighted
average. Nothing in that sum depends on *where* a key sits: shuffle the keys and each query gets exactly
the same result. So without a position signal, *"the dog bit the man"* and *"the man bit the dog"* look
alike to every attention head, and only the causal mask says anything about order.

**The fixes.** A position method injects order at one of three places: it **adds** a vector per position
to the input (sinusoidal, learned), **rotates** queries and keys by their positions (RoPE), or **biases**
the attention logits by the distance between query and key (Shaw, T5, ALiBi). Where it acts decides
whether the model can read text longer than it was trained on, and whether a far token can still be found.
"""
)

# One checkpoint per method: fine-tuned variants (rope-ft4x, ...) belong to the context-extension lab.
entries = {name: entry for name, entry in shipped_checkpoint_json().items() if name in POSITION_METHODS}
metrics = {name: m for name, (_, m, problem) in entries.items() if problem is None and m is not None}
for name, (_, _, problem) in entries.items():
    if problem is not None:
        st.warning(f"Checkpoint **{plain(display_name(name))}** could not be read: {problem}", icon="⚠️")
missing = [name for name in method_names() if name not in entries]
if not entries:
    st.warning("No checkpoints found, so the measured columns and the chart below are empty. "
               "Run `make checkpoints` to train the shipped set (about an hour on a laptop CPU).", icon="⚠️")
elif missing:
    st.info(f"No checkpoint yet for: {', '.join(map(display_name, missing))}. Run `make checkpoints` to train the full set.", icon="ℹ️")

st.header("The methods at a glance")
rows = pd.DataFrame(home.method_rows(metrics)).drop(columns=["summary"])
long_col = f"bits/byte @ {home.EXTRAPOLATION_MULTIPLE}×"
# The browser's grid draws a missing number as "None" (it ignores a Styler's na_rep), so the two bits/byte
# columns are shown as text: a value, "cannot run" (the method has a 1x value but no positions at 16x,
# e.g. the learned table) or "no checkpoint".


def bpb_text(value, method: str, has_1x: bool) -> str:
    if value is not None and value == value:
        return f"{value:.3f}"
    if method not in metrics:
        return "no checkpoint"
    return "cannot run" if has_1x else "—"


shown = rows.copy()
has_1x = rows["bits/byte @ 1×"].notna()
for column in ("bits/byte @ 1×", long_col):
    shown[column] = [bpb_text(v, m, h) for v, m, h in zip(rows[column], rows["method"], has_1x)]
shown["method"] = shown["method"].map(display_name)  # the ids stay in links; the table says each method's name
st.dataframe(
    shown,
    hide_index=True,
    height="content",
    column_config={
        "paper": st.column_config.LinkColumn("paper", display_text="paper ↗"),
        # Short headers: with the long ones the last columns were cut at 1366 px.
        "absolute / relative": st.column_config.TextColumn("kind", help="absolute, relative or neither"),
        "fixed / learned": st.column_config.TextColumn("weights", help="fixed by a formula, or learned in training"),
        "acts on": st.column_config.TextColumn(help="Where the position enters: added to the input, rotating queries "
                                               "and keys, a bias on the logits, the attention weights themselves (no "
                                               "softmax), or the hidden states through a short convolution."),
        "KV-cacheable": st.column_config.TextColumn(help="Can keys and values be computed once and reused while "
                                                    "generating? Added vectors: " + home.KV_CACHE_REASON["input"]
                                                    + "; rotations: " + home.KV_CACHE_REASON["q/k"] + "; biases: "
                                                    + home.KV_CACHE_REASON["logits"] + "."),
        "bits/byte @ 1×": st.column_config.Column(help=f"Bits per byte at the training length on {EVAL_TEXT}."),
        long_col: st.column_config.Column(
            help=f"Bits per byte at {home.EXTRAPOLATION_MULTIPLE}× the training length on {EVAL_TEXT}; “cannot run”: "
                 "the method has no representation for positions that far."),
        "extrapolates": st.column_config.TextColumn(
            help=f"yes: at most {home.EXTRAPOLATES_WITHIN_BPB} bits/byte worse at {home.EXTRAPOLATION_MULTIPLE}× "
                 f"the training length than at 1×; partly: at most {home.DEGRADES_WITHIN_BPB} worse; no: worse still, "
                 "or cannot run at all."),
    },
)
st.caption("Columns from each method's definition in `posviz/positions`; the bits/byte columns and "
           "“extrapolates” from the shipped checkpoints' metrics.json (same model, data and recipe for every method), "
           f"on {EVAL_TEXT}. The sidebar's “final bpb” is the training run's own last check, on the first 64 KiB of those documents.")


@st.fragment
def bpb_section(curve: pd.DataFrame, train_lengths: list[int]) -> None:
    """The radio and the chart under it: moving it reruns this alone, and a range seen before draws its kept spec."""
    ids = [n for n in method_names() if display_name(n) in set(curve["checkpoint"])]
    # Up to 4x the methods that extrapolate sit close together: a closer look separates them.
    ranges = {"all": "every length measured", "4": "up to 4× the training length"}
    left, right = st.columns([3, 1])
    shown_range = left.radio("Lengths", list(ranges), format_func=ranges.get, horizontal=True, key="w_range",
                             index=list(ranges).index(qp_choice("range", "all", list(ranges))))
    # Eight lines a room can tell apart (one method of each family); every checkpoint one click away.
    every = right.toggle(f"All {len(ids)} checkpoints", value=qp_bool("all", False), key="w_all",
                         help="Off: one method of each family (" + ", ".join(map(display_name, opening_set(ids))) + ").")
    sync_url(range=shown_range, all=every)
    order = [display_name(n) for n in (ids if every else opening_set(ids))]
    shown = curve if shown_range == "all" else curve[curve["multiple"] <= float(shown_range)]
    shown = shown[shown["checkpoint"].isin(order)]

    def build():
        lengths = sorted(set(shown["length"].tolist()))
        lines = alt.Chart(shown).mark_line(point=True).encode(
            x=alt.X("length:Q", title="evaluation length (bytes, log₂ scale)",
                    scale=alt.Scale(type="log", base=2, domain=[min(lengths), max(lengths)]),
                    axis=alt.Axis(values=lengths, format=",d")),
            y=alt.Y("bpb:Q", title="bits per byte, held-out documents (lower is better)", scale=alt.Scale(zero=False)),
            color=alt.Color("checkpoint:N", scale=method_scales(order)[0], title="checkpoint",
                            legend=legend_for(len(order))),
            strokeDash=alt.StrokeDash("checkpoint:N", scale=method_scales(order)[1], title="checkpoint",
                                      legend=legend_for(len(order))),
            tooltip=[alt.Tooltip("checkpoint:N"), alt.Tooltip("length:Q", title="length (bytes)", format=","),
                     alt.Tooltip("multiple:Q", title="× training length", format=".3g"),
                     alt.Tooltip("bpb:Q", title="bits per byte", format=".3f")],
        )
        marks = pd.DataFrame({"length": train_lengths, "label": [f"training length {n:,}" for n in train_lengths]})
        rule = alt.Chart(marks).mark_rule(strokeDash=[5, 4], color="gray").encode(
            x=alt.X("length:Q"), tooltip=[alt.Tooltip("label:N", title="marks")])
        label = alt.Chart(marks).mark_text(align="left", dx=4, dy=-6, color="gray", baseline="bottom").encode(
            x=alt.X("length:Q"), y=alt.YValue(0), text=alt.Text("label:N"))
        return (lines + rule + label).properties(height=420), shown

    # the metrics behind the chart, as numbers: a re-evaluated checkpoint is another chart
    rows = tuple(map(tuple, curve[["checkpoint", "length", "bpb"]].itertuples(index=False)))
    chart("home", ("bpb-vs-length", shown_range, tuple(train_lengths), tuple(order)) + rows, build, "bpb_vs_length",
          "Non-overlapping windows of the evaluation length over the same held-out bytes. A line that stops "
          "means the method cannot run at longer lengths (the learned table has no rows past it).",
          says=lambda: extremes_sentence(shown, "checkpoint", "length", "bpb", "bits per byte on the held-out documents",
                                 length_words(train_lengths[0] if len(train_lengths) == 1 else None)))


st.header("Bits per byte vs evaluation length")
curve = pd.DataFrame(home.bpb_vs_length_rows(metrics))
if not curve.empty:  # the legend says names; the CSV keeps the ids beside them
    curve.insert(0, "id", curve["checkpoint"])
    curve["checkpoint"] = curve["id"].map(display_name)
if curve.empty:
    st.info("No evaluated checkpoints to plot yet. Run `make checkpoints`, then reload this page.", icon="ℹ️")
else:
    bpb_section(curve, sorted({home.train_length_of(m) for m in metrics.values()} - {None}))

st.header("Explore each method")
EXPLAINER = {  # where a method acts -> the page that takes such methods apart; NoPE goes to the live lab
    "input": ("views/sinusoidal_learned.py", "Sinusoidal & learned", "🌊"),
    "q/k": ("views/rope.py", "RoPE", "🔄"),
    "logits": ("views/attention_biases.py", "Attention biases", "📐"),
    "content": ("views/content_positions.py", "Positions from content", "🧮"),  # a kind: looked up first
    "hidden": ("views/rope.py", "RoPE (beside the layer layouts)", "🔄"),  # Canon layers: their kernels are drawn there
}
cols = st.columns(2)
for i, name in enumerate(method_names()):
    cls = POSITION_METHODS[name]
    path, title, icon = EXPLAINER.get(cls.kind) or EXPLAINER.get(cls.acts_on, ("views/extrapolation.py", "Extrapolation lab", "📈"))
    with cols[i % 2]:
        st.page_link(path, label=f"{display_name(name)} — {title}", icon=icon, help=POSITION_METHODS[name].summary)
