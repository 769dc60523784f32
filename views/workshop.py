"""Workshop: write a position method as a formula of a logit bias, see it at once, train it in minutes, and find it
in every lab as "yours: …". The formula language is posviz/positions/formula_language.py, the drawing posviz/workshop/drawing.py,
the training queue posviz/workshop/training.py; nothing is computed here.
"""
from __future__ import annotations

import json
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

from posviz.errors import PosvizError
from posviz.limits import WORKSHOP_MAX_TRAIN_SECONDS, WORKSHOP_RESULTS_PER_SESSION
from posviz.positions import ModelShape
from posviz.training.quick import QUICK_MULTIPLES, QUICK_RECIPE_WHY
from posviz.training.train import TrainConfig
from posviz.workshop import drawing
from posviz.positions.formula_language import FUNCTIONS, MAX_CHARACTERS, VARIABLES, parse_formula
from posviz.workshop.training import check_before_training, page_recipe, run_key
from views._bias_charts import distance_axis
from posviz.slides import extremes_sentence
from views._charts import show_chart
from views._matrices import show_matrix
from views._page import error_box, page_header, plain
from views._url import notice_junk, qp_choice, qp_int, sync_url
from views._workshop import JOB_KEY, keep, quick_baseline_seeds, quick_baselines, quick_baselines_stamp, results, trainer

OWN = "Your own"
RECIPE = TrainConfig()  # the shipped shape: what a run trains, and what is drawn
SHAPE = ModelShape(RECIPE.n_layer, RECIPE.n_head, RECIPE.n_embd // RECIPE.n_head, RECIPE.n_embd, RECIPE.train_length)
CURVE_KEYS = 4 * RECIPE.train_length  # the curves run to 4x the trained context: where extrapolation shows
MATRIX_SIDE = 96  # past the hard-cut example's 64, and a heatmap light enough to draw at once (9,216 cells)

page_header(
    "Workshop: write your own position method",
    "Type a logit bias as a formula of the distance, the positions and the head; see it per head at once; train it "
    "in a few minutes with the same short recipe as three baselines; then run it through every lab as yours.")

# -- the formula: from the URL, an example, or typed --------------------------------------------------------------
names = list(drawing.EXAMPLES) + [OWN]


def _url_params(key: str, allowed: set[str]) -> dict[str, str]:
    """"a=0:2;b=0.5" from the URL as {"a": "0:2", "b": "0.5"}, for the formula's parameters ``allowed``; anything
    else in it is ignored with a notice. Empty (``init=``) names none, as absent does: no notice."""
    raw = st.query_params.get(key)
    if raw is None or not raw.strip():
        return {}
    out = {}
    for item in raw.split(";"):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in allowed or len(value) > drawing.MAX_VALUE_CHARACTERS:
            notice_junk(key, raw, "")
            return {}
        out[name.strip()] = value.strip()
    return out


def _set_inputs(formula: str, parameters: dict) -> None:
    st.session_state["w_formula"] = formula
    for name, spec in parameters.items():
        st.session_state[f"w_init_{name}"], st.session_state[f"w_floor_{name}"] = drawing.spec_text(spec)


def _example_picked() -> None:
    example = drawing.EXAMPLES.get(st.session_state["w_example"])
    if example is not None:
        _set_inputs(example.formula, example.parameters)


def _formula_typed() -> None:
    """The picker follows what was typed: the example whose formula it is, else "Your own" (with its own caption)."""
    typed = st.session_state["w_formula"].strip()
    if drawing.EXAMPLES.get(st.session_state["w_example"], None) is not None and \
            drawing.EXAMPLES[st.session_state["w_example"]].formula == typed:
        return
    same = [n for n, e in drawing.EXAMPLES.items() if e.formula == typed]
    st.session_state["w_example"] = same[0] if same else OWN


def _from_link() -> None:
    """A session's first run: the link's formula (``bias``) and parameters, else its example's, else the first."""
    start = qp_choice("example", names[0], names)
    raw = st.query_params.get("bias")
    linked = None
    if raw is not None:
        try:
            linked = parse_formula(raw)
        except PosvizError:
            notice_junk("bias", raw, drawing.EXAMPLES.get(start, drawing.EXAMPLES[names[0]]).formula)
    allowed = set(linked.parameters) if linked is not None else set()
    inits, floors = _url_params("init", allowed), _url_params("floor", allowed)
    if linked is None:
        st.session_state["w_example"] = start if start in drawing.EXAMPLES else names[0]
        _example_picked()
        return
    same = [n for n, e in drawing.EXAMPLES.items() if e.formula == raw]
    st.session_state["w_example"] = start if start in same else (same[0] if same else OWN)
    example = drawing.EXAMPLES.get(st.session_state["w_example"])
    _set_inputs(raw, example.parameters if example is not None else {})
    # A link that names the inits is the page's own: it names them all, and every floor there is (it leaves out
    # an empty floor=), so a parameter whose floor it does not name has none.
    for name in linked.parameters:
        if inits:
            st.session_state[f"w_init_{name}"] = inits.get(name, "1")
        if floors or inits:
            st.session_state[f"w_floor_{name}"] = floors.get(name, "")


if "w_formula" not in st.session_state:
    _from_link()
layer_in_link, head_in_link = qp_int("layer", 0, 0, RECIPE.n_layer - 1), qp_int("head", 0, 0, RECIPE.n_head - 1)

left, right = st.columns([2, 3])
example = left.selectbox("Start from an example", names, key="w_example", on_change=_example_picked,
                         help="Each fills in the formula and its parameters; edit them freely.")
left.caption(drawing.EXAMPLES[example].why if example in drawing.EXAMPLES else
             "Your own formula: its bias per head is drawn below, checked at every length a run is scored at.")
formula = right.text_input(
    "Logit bias (added to q·k/√d for query i and key j)", key="w_formula", max_chars=MAX_CHARACTERS,
    on_change=_formula_typed,
    help=f"Variables: {', '.join(VARIABLES)} (d = i − j, h the head, H the heads, L the trained context = "
         f"{RECIPE.train_length}). Functions: {', '.join(FUNCTIONS)}. Numbers, + − * / **, comparisons, -inf (a hard "
         "cut). A learned parameter is name[h] (one per head) or name[layer, h].")
with st.expander("The language", expanded=False):
    st.markdown(
        f"- **Variables**: `i` the query's position, `j` the key's, `d` = i − j (0 on the diagonal), `h` the head "
        f"(0 … H−1), `H` = {RECIPE.n_head} heads, `L` = {RECIPE.train_length} the trained context, `layer` "
        f"(0 … {RECIPE.n_layer - 1}).\n"
        f"- **Functions**: {', '.join(f'`{f}`' for f in FUNCTIONS)}; `where(cond, a, b)` picks a where cond holds.\n"
        "- **Learned parameters**: `s[h]` (one per head) or `a[layer, h]` (one per layer and head), each with an "
        "initial value (a number, or a range `0:2` drawn uniformly) and an optional floor it never goes below.\n"
        "- Only the causal pairs (j ≤ i) are evaluated. A value that is NaN or +∞ there, or a query with no key "
        "left, is refused with the reason. Nothing you type is run as Python: it is parsed against a whitelist.")

options, method, problem = None, None, None
try:
    parsed = parse_formula(formula)
    typed = {}
    if parsed.parameters:
        st.markdown("**Learned parameters** (initial value: a number or a range low:high; floor: optional)")
        cells = st.columns(min(4, 2 * len(parsed.parameters)))
        for n, (name, index) in enumerate(sorted(parsed.parameters.items())):
            st.session_state.setdefault(f"w_init_{name}", "1")
            st.session_state.setdefault(f"w_floor_{name}", "")
            per = "per head" if index == ("h",) else "per layer and head"
            init = cells[(2 * n) % len(cells)].text_input(f"{plain(name)} ({per}): initial value", key=f"w_init_{name}",
                                                          max_chars=drawing.MAX_VALUE_CHARACTERS)
            floor = cells[(2 * n + 1) % len(cells)].text_input(f"{plain(name)}: floor", key=f"w_floor_{name}",
                                                               max_chars=drawing.MAX_VALUE_CHARACTERS)
            typed[name] = (init, floor)
    typed_options = drawing.method_options(formula, typed)
    drawn = drawing.drawn_method(typed_options, SHAPE)  # refuses a formula that is no bias within the context
    with st.spinner(f"Checking your formula at every length a run is scored at (to {max(QUICK_MULTIPLES)}× the "
                    "context)…", show_time=True):
        check_before_training(typed_options)  # and one that breaks only past it: before anyone's minutes go to it
    method, options = drawn, typed_options  # drawn only once it is a bias everywhere a run goes: no gaps that lie
except PosvizError as exc:  # every refusal of the formula path; anything else is a bug, shown as one
    error_box(PosvizError(plain(str(exc))), "Edit the formula above, or start again from an example.")

specs = (options or {}).get("parameters", {})
sync_url(example=example, bias=formula)
for key, value in (("init", ";".join(f"{n}={drawing.spec_text(s)[0]}" for n, s in specs.items())),
                   ("floor", ";".join(f"{n}={drawing.spec_text(s)[1]}" for n, s in specs.items()
                                      if s.get("floor") is not None))):
    if value:
        sync_url(**{key: value})
    else:  # none to name: the key leaves the link (an empty init= read as junk once, and says nothing)
        st.query_params.pop(key, None)

# -- drawn at once ------------------------------------------------------------------------------------------------
if method is not None:
    by_layer = "layer" in method.formula.reads or ("layer", "h") in method.formula.parameters.values()
    reads = ", ".join(sorted(method.formula.reads)) or "nothing (a constant)"
    c1, c2, c3 = st.columns(3)
    c1.metric("reads", reads)
    c2.metric("learned values", f"{sum(p.numel() for p in method.parameters()):,}",
              help="One per head for name[h], one per layer and head for name[layer, h].")
    c3.metric("shift-invariant", "yes" if method.is_shift_invariant() else "no: reads i or j",
              help="A formula of d alone is shift-invariant: a KV cache's window may start anywhere, and a cached "
                   "window with its true positions equals re-encoding it. One that reads i or j is not: the KV cache "
                   "lab says so for it.")
    layer = 0
    if by_layer:
        layer = st.select_slider("layer", list(range(RECIPE.n_layer)), value=layer_in_link, key="w_layer",
                                 help="Your formula differs by layer.")
    sync_url(layer=layer)
    st.subheader("The bias of each head against distance")
    curves = drawing.curves(method, layer, CURVE_KEYS)
    chart = alt.Chart(curves).mark_line().encode(
        x=distance_axis("distance from the query (positions, symlog scale)", CURVE_KEYS),
        y=alt.Y("bias:Q", title="bias (logits)", axis=alt.Axis(format=",.3~g")), color=alt.Color("head:N", title=None),
        tooltip=["head", alt.Tooltip("distance:Q", format=","), alt.Tooltip("bias:Q", format=".3f")],
    ).properties(height=280)
    rule = alt.Chart(pd.DataFrame({"distance": [RECIPE.train_length]})).mark_rule(strokeDash=[4, 3], color="gray").encode(
        x="distance:Q")
    show_chart(chart + rule, curves, "workshop_bias_by_distance",
               f"For the last query of a {CURVE_KEYS:,}-position context, at the parameters' initial values (a range is "
               f"drawn with seed 0). Dashed: the trained context, {RECIPE.train_length} positions. A gap: -inf, a key "
               "cut off." + (" Every head has the same bias: their lines overlap." if drawing.heads_alike(curves) else "")
               + ("" if method.is_shift_invariant() else " Your formula reads i or j, so other queries "
                  "see other curves: the matrix below has them all."),
               says=lambda: extremes_sentence(curves, "head", "distance", "bias", "bias in logits",
                                      lambda d: f"distance {int(d):,}", lower_is_better=False))
    st.subheader("As a matrix: every query against every key")
    head = st.select_slider("head", list(range(RECIPE.n_head)), value=head_in_link, key="w_head")
    sync_url(head=head)
    show_matrix(drawing.matrix(method, layer, head, MATRIX_SIDE), f"workshop_bias_matrix_h{head}",
                "key position j", "query position i", "bias (logits)",
                key=(json.dumps(options, sort_keys=True), layer, head))
    st.caption(f"Head {head}, the first {MATRIX_SIDE} positions; blank: keys after the query (masked) or cut off (-inf).")

# -- train --------------------------------------------------------------------------------------------------------
st.header("Train it")
st.markdown(
    f"A run trains the shipped model shape ({RECIPE.n_layer} layers, {RECIPE.n_head} heads, {RECIPE.n_embd} wide, "
    f"{RECIPE.train_length}-byte context) from scratch with the quick recipe: {QUICK_RECIPE_WHY}. The quick "
    "baselines in the table were trained the same way, so they, not the shipped checkpoints, are the fair comparison. One "
    f"run trains at a time on this server; others wait in line. A run stops at {WORKSHOP_MAX_TRAIN_SECONDS} s "
    "whatever its step. A finished run is kept on this server and shared: whoever trains the same formula, with the "
    "same initial values and floors, gets the same run at once (the examples are trained ahead). This session lists "
    f"its last {WORKSHOP_RESULTS_PER_SESSION}.")
job = st.session_state.get(JOB_KEY)


@st.fragment(run_every=1.0)
def progress() -> None:
    current = st.session_state.get(JOB_KEY)
    if current is None:
        return
    if current.finished:
        st.session_state.pop(JOB_KEY, None)
        if current.status == "done":
            keep(current)
        else:
            st.session_state["_workshop_last_end"] = (current.status, current.message)
        st.rerun(scope="app")
    ahead = trainer().place(current)
    others = current.visitors - 1
    shared = f" ({others} other visitor{'s' if others != 1 else ''} asked for the same run)" if others > 0 else ""
    if current.status == "queued":
        st.info(f"Waiting: {ahead} training{'s' if ahead != 1 else ''} ahead of yours on this server{shared}.", icon="⏳")
    else:
        fraction = current.step / current.steps if current.steps else 0.0
        st.progress(min(1.0, fraction), text=f"Training {plain(current.label)}: step {current.step:,} of "
                                             f"{current.steps:,}, {current.seconds:.0f} s{shared}")
    if st.button("Cancel", key="w_cancel"):
        trainer().cancel(current)  # this visitor no longer waits: once, so a second press cannot cancel another's wait
        st.session_state.pop(JOB_KEY, None)
        left = current.visitors if not current.cancel_requested else 0
        st.session_state["_workshop_last_end"] = (
            "cancelled", f"you left it; it goes on for the {left} other visitor{'s' if left != 1 else ''} who asked for "
                         "the same run" if left else "cancelled")
        st.rerun(scope="app")


if job is not None:
    progress()
else:
    ended = st.session_state.pop("_workshop_last_end", None)
    if ended is not None:
        (st.warning if ended[0] == "cancelled" else st.error)(f"The last run {ended[0]}: {plain(ended[1])}")
    stored = options is not None and trainer().store.get(run_key(page_recipe(options)), touch=False) is not None
    if st.button("Show its run (trained already on this server)" if stored else "Train (about 3 minutes)",
                 type="primary", key="w_train", disabled=options is None):
        label = drawing.label_for(formula, {r["label"] for r in results()},
                                  example if example in drawing.EXAMPLES and
                                  drawing.EXAMPLES[example].formula == formula else None)
        try:
            st.session_state[JOB_KEY] = trainer().submit(label, options)
        except PosvizError as exc:
            error_box(PosvizError(plain(str(exc))))
        else:
            st.rerun()

# -- results ------------------------------------------------------------------------------------------------------
baselines = quick_baselines(quick_baselines_stamp())
seeds = quick_baseline_seeds(quick_baselines_stamp())
kept = results()
multiples = [f"{m:g}" for m in QUICK_MULTIPLES]
rows = [{"model": f"yours: {r['label']}", **{f"{m}×": r["scores"].get(float(m)) for m in multiples}}
        for r in reversed(kept)]
rows += [{"model": name, **{f"{m}×": bpb.get(m) for m in multiples},
          "training seeds": ", ".join(f"{m}×: {drawing.seed_spread([e['bits_per_byte'].get(m) for e in seeds.get(name, [])])}"
                                    for m in multiples)} for name, bpb in baselines.items()]
if kept:
    st.header("Yours")
if rows:  # before any run of yours: what the baselines score, so a visitor knows what to expect
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", height="content",
                 column_config={f"{m}×": st.column_config.NumberColumn(f"bits/byte {m}×", format="%.3f")
                                for m in multiples})
    st.caption("Bits per byte (lower is better) on the same 32 KiB of held-out text, at 1×, 4× and 16× the trained "
               "context. A baseline's number is its first seed's; \"training seeds\": the lowest–highest over the runs "
               "of its recipe with other initial weights and data order. The quick baselines: "
               "`python -m posviz_tools.quick_runs --seeds 1 2`.")
if kept and seeds:  # a difference from one baseline run may be one training's luck: compared with the seeds' range
    st.markdown("**Yours against each baseline's training seeds**")
    st.dataframe(pd.DataFrame([{"yours": r["label"], "baseline": name,
                                **{f"{m}×": drawing.against_seeds(r["scores"].get(float(m)),
                                                                  [e["bits_per_byte"].get(m) for e in runs])
                                   for m in multiples}}
                               for r in reversed(kept) for name, runs in seeds.items()]),
                 hide_index=True, width="stretch", height="content")
if kept:
    from posviz.workshop.training import checkpoint_zip

    for r in reversed(kept):
        with st.container(border=True):
            st.markdown(f"**yours: {plain(r['label'])}**")
            st.code(r["formula"], language=None)
            if r["message"]:
                st.warning(r["message"], icon="⏱️")
            row = st.container(horizontal=True, vertical_alignment="center")
            folder = Path(r["folder"])
            if (folder / "config.json").is_file():
                row.download_button("Download (safetensors + config.json)", lambda f=folder: checkpoint_zip(f),
                                    file_name=f"{folder.name}.zip", mime="application/zip", key=f"zip-{folder.name}",
                                    width="content", on_click="ignore")
            row.page_link("views/extrapolation.py", label="Open in the Extrapolation lab", icon="📈",
                          query_params={"models": drawing.lab_link_models(r["label"])})
    st.caption("Every lab (Extrapolation, KV cache, Retrieval, Generation, Compare) lists these as \"yours: …\" "
               "beside the shipped checkpoints, for this session.")
