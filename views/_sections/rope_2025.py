"""The RoPE page's sections for the methods of 2025 beside RoPE (FoPE's Fourier series, PoPE's phases) and for
NoPE + Canon beside the layer layouts (what its convolutions weigh). Each reads the shipped checkpoint's weights, or
the method as initialised when none is shipped, and says which. The numbers: ``posviz.explore.rope_2025``."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st
import torch

from posviz.display import display_name
from posviz.explore import rope_2025
from posviz.palette import colour
from posviz.positions import build_position_method
from posviz.positions.base import ModelShape
from views._checkpoints import shipped_checkpoints, shipped_lab_model
from views._explore import chart
from views._sections import RopePage, section

VIEW = "rope"


def _method(page: RopePage, name: str):
    """(the method with the shipped checkpoint's weights, or as the recipe initialises it, a sentence saying which)."""
    if name in shipped_checkpoints():
        model, problem = shipped_lab_model(name)
        if model is not None:
            return model.net.position, f"the shipped {display_name(name)} checkpoint"
        st.warning(problem, icon="⚠️")
    shape = ModelShape(4, 4, page.head_dim, 4 * page.head_dim, page.train_length)
    return build_position_method(name, shape), (f"{display_name(name)} as initialised (no checkpoint shipped here: "
                                                f"`python -m posviz.train --method {name}`)")


def _trained(page: RopePage, name: str, header: str, reads: str, about: str):
    """A section that reads the shipped checkpoint's trained ``reads`` on the held-out text: its header, then the
    model and a caption saying where its numbers come from and ``about`` them, or None after saying why not (as
    initialised they say nothing yet)."""
    st.header(header)
    model, problem = shipped_lab_model(name)
    if model is None:
        st.info(f"{problem} This section reads the trained {reads}: as initialised they say nothing yet.", icon="ℹ️")
        return None
    st.caption(f"From the shipped {display_name(name)} checkpoint, on the first {page.train_length:,} bytes of the "
               f"held-out text. {about}")
    return model


def _held_out(length: int) -> torch.Tensor:
    """(1, length) the first ``length`` bytes of the held-out text, the text these sections read the model on."""
    from posviz.training.data import load_corpus

    return torch.as_tensor(np.frombuffer(load_corpus().eval_stream(length), dtype=np.uint8).copy()).long()[None]


@section("fope-spectrum", "rope", order=12)
def fope_section(page: RopePage, method: str) -> None:
    fope, source = _method(page, method)
    freqs = pd.DataFrame(rope_2025.fope_frequencies(fope))
    kept = int(freqs["kept"].sum())
    st.header("FoPE: a Fourier series per pair, and the frequencies that never turn zeroed")
    st.caption(f"From {source}. Of RoPE's {len(freqs)} frequencies per head, {kept} turn at least once within the "
               f"{fope.options.floor_length:,} training positions and are kept; the other {len(freqs) - kept} would "
               "reach angles never seen in training, and FoPE gives their pairs frequency 0 (no rotation). Each of "
               f"the first {fope.series_pairs} pairs then turns by a fixed mix of all {kept} kept frequencies "
               f"(the heatmap: mean share off a pair's own frequency {rope_2025.fope_leakage(fope):.0%}); the rest stand still.")
    head = 0 if fope.shape.n_head < 2 else st.slider("FoPE head", 0, fope.shape.n_head - 1, 0, key="w_fope_head")

    def build():
        data = pd.DataFrame(rope_2025.fope_series(fope, head))
        heat = alt.Chart(data).mark_rect().encode(
            x=alt.X("pair:O", title="pair (features p and p + hs/2)"),
            y=alt.Y("frequency index:O", title="kept frequency D (0: fastest)"),
            color=alt.Color("weight:Q", title="weight", scale=alt.Scale(scheme="redblue", domainMid=0, reverse=True)),
            tooltip=["part:N", "pair:Q", "frequency index:Q", alt.Tooltip("frequency:Q", format=".4f"),
                     alt.Tooltip("weight:Q", format=".3f")]
        ).properties(width=230, height=200).facet(column=alt.Column("part:N", title=None))
        return heat, data

    chart(VIEW, ("fope-series", method, head, source), build, f"{method}_series_head{head}",
          "Each column is a pair's series: its weights on the kept frequencies (normalised to sum to 1). The diagonal "
          "is RoPE; everything off it is the frequencies FoPE mixes in.")

    def build_freqs():
        data = freqs.assign(status=np.where(freqs["kept"], "kept", "zeroed (frequency 0)"))
        bars = alt.Chart(data).mark_bar().encode(
            x=alt.X("pair:O", title="RoPE pair p (frequency base^(-2p/hs))"),
            y=alt.Y("wavelength:Q", title=["wavelength (positions", "per turn, log scale)"], scale=alt.Scale(type="log")),
            y2=alt.datum(1.0),  # a bar on a log scale rises from 1 position, not from 0 (log 0: no bar at all)
            color=alt.Color("status:N", title=None, legend=alt.Legend(orient="bottom"),
                            scale=alt.Scale(domain=["kept", "zeroed (frequency 0)"], range=[colour(method), "#bbbbbb"])),
            tooltip=["pair:Q", alt.Tooltip("wavelength:Q", format=",.1f"), "status:N"])
        rule = alt.Chart(pd.DataFrame({"y": [fope.options.floor_length]})).mark_rule(strokeDash=[5, 4], color="gray").encode(y="y:Q")
        return (bars + rule).properties(height=240), data

    chart(VIEW, ("fope-kept", method, source), build_freqs, f"{method}_kept_frequencies",
          "Dashed: the training length. A frequency whose wavelength is above it completes less than a turn in training; "
          "FoPE zeroes it.")


@section("pope-polar", "rope", order=14)
def pope_section(page: RopePage, method: str) -> None:
    pope, source = _method(page, method)
    phases = pd.DataFrame(rope_2025.pope_phases(pope))
    st.header("PoPE: the phase from the position, the magnitude from the content")
    st.caption(f"From {source}. Every feature of a query or key is one complex number: its length is softplus of the "
               "content (never negative, so content cannot flip a match into a mismatch), its angle is position × "
               f"frequency, one frequency per feature ({pope.shape.head_dim} per head, not {pope.shape.head_dim // 2} "
               "pairs as RoPE). A key's angle also carries a learned phase δ per head and feature (left); with the "
               "content held fixed, the logit then depends on the distance alone (right).")
    left, right = st.columns(2)

    def build_phase():
        heat = alt.Chart(phases).mark_rect().encode(
            x=alt.X("feature:O", title="feature c (0: fastest)"), y=alt.Y("head:O"),
            color=alt.Color("key phase (degrees):Q", scale=alt.Scale(scheme="purpleorange", domain=[-360, 0])),
            tooltip=["head:Q", "feature:Q", alt.Tooltip("wavelength:Q", format=",.1f"),
                     alt.Tooltip("key phase (degrees):Q", format=".1f")]).properties(height=180)
        return heat, phases

    with left:
        chart(VIEW, ("pope-phase", method, source), build_phase, f"{method}_key_phase")
    distances = np.arange(0, 4 * page.train_length + 1, max(1, page.train_length // 64))

    def build_score():
        data = pd.DataFrame(rope_2025.pope_score_by_distance(pope, distances))
        line = alt.Chart(data).mark_line().encode(
            x=alt.X("distance:Q", title="distance (positions)"), y=alt.Y("logit:Q", title="logit"),
            color=alt.Color("head:N", legend=alt.Legend(orient="bottom")),
            tooltip=["head:N", "distance:Q", alt.Tooltip("logit:Q", format=".3f")])
        rule = alt.Chart(pd.DataFrame({"x": [page.train_length]})).mark_rule(strokeDash=[5, 4], color="gray").encode(x="x:Q")
        return (line + rule).properties(height=180), data

    with right:
        chart(VIEW, ("pope-score", method, source, page.train_length), build_score, f"{method}_logit_by_distance",
              "Every feature's magnitude set to 1. Dashed: the training length.")


@section("canon-kernels", "rope", order=25)
def canon_section(page: RopePage, method: str) -> None:
    canon, source = _method(page, method)
    st.header("NoPE + Canon: what the short convolutions weigh")
    st.caption(f"From {source}. No layer of this model reads a position: attention is NoPE. Order enters through "
               f"Canon layers, a causal convolution over the byte and its {canon.options.kernel - 1} predecessors "
               "added to the hidden state, at four sites of every block: A (attention's input), B (queries, keys and "
               "values), C (the MLP's input), D (the MLP's hidden layer). First: how much each site weighs each byte "
               "back, on average over its channels. Then: the kernel of one site, channel by channel.")

    def build_reach():
        data = pd.DataFrame(rope_2025.canon_reach(canon))
        bars = alt.Chart(data).mark_bar().encode(
            x=alt.X("bytes back:O", title="bytes back (0: the byte itself)"), y=alt.Y("mean |weight|:Q"),
            color=alt.Color("site:N", legend=alt.Legend(orient="bottom")), xOffset="site:N", row=alt.Row("layer:O"),
            tooltip=["layer:Q", "site:N", "bytes back:Q", alt.Tooltip("mean |weight|:Q", format=".3f")]
        ).properties(height=70)
        return bars, data

    # Its own row: a chart faceted by layer has a fixed width (16 bars a layer), which ran under a neighbouring column.
    chart(VIEW, ("canon-reach", method, source), build_reach, f"{method}_reach")
    pick, heat_column = st.columns([1, 3])
    layer = pick.selectbox("Layer", list(range(canon.shape.n_layer)), key="w_canon_layer")
    site = pick.selectbox("Site", list(canon.options.sites), key="w_canon_site")
    kernel = rope_2025.canon_kernel(canon, layer, site)

    def build_kernel():
        K = kernel.shape[1]
        data = pd.DataFrame({"channel": np.repeat(np.arange(kernel.shape[0]), K),
                             "bytes back": np.tile(np.arange(K - 1, -1, -1), kernel.shape[0]),
                             "weight": kernel.reshape(-1)})
        heat = alt.Chart(data).mark_rect().encode(
            x=alt.X("channel:O", axis=alt.Axis(labels=False, ticks=False), title=f"channel (of {kernel.shape[0]})"),
            y=alt.Y("bytes back:O"),
            color=alt.Color("weight:Q", scale=alt.Scale(scheme="redblue", domainMid=0, reverse=True)),
            tooltip=["channel:Q", "bytes back:Q", alt.Tooltip("weight:Q", format=".3f")]).properties(height=160)
        return heat, data

    with heat_column:
        chart(VIEW, ("canon-kernel", method, source, layer, site), build_kernel, f"{method}_kernel_L{layer}{site}")


@section("nope-temperature", "rope", order=26)
def temperature_section(page: RopePage, method: str) -> None:
    nope, source = _method(page, method)
    floor, scale = nope.options.temperature_floor_scale, nope.options.temperature_attn_scale
    st.header("NoPE + temperature: each query scaled by its position")
    st.caption(f"From {source}. No layer reads a position, except that each query at position i is multiplied by "
               f"1 + {scale:g} · log(1 + ⌊(i + 1) / {floor}⌋) (Llama 4's NoPE layers; Scalable-Softmax's s · log n): "
               "the longer the context, the sharper each softmax, so that attention over many keys does not flatten. "
               f"Dashed: the training length ({page.train_length:,}) and 16× it.")
    lengths = np.unique(np.linspace(0, 16 * page.train_length - 1, 400).astype(int))

    data = pd.DataFrame(rope_2025.temperature_curve(nope, lengths))
    ours, llama = (data[data["curve"] == name]["query scale"].to_numpy() for name in data["curve"].unique())
    # Why the two curves can lie on one another: floor 8 over 256 bytes is Llama 4's 8,192 over 262,144 tokens
    # (a step every 1/32 of the context); the +1 inside the floor is all that parts them, so say it in numbers.
    st.caption(f"The grey dashed curve is Llama 4's own scale with its position read at the same share of its "
               f"{rope_2025.LLAMA4_CONTEXT:,}-token context; the two differ by at most "
               f"{np.abs(ours - llama).max():.3f} here (at 16×: {ours[-1]:.3f} and {llama[-1]:.3f}).")

    def build():
        names = list(data["curve"].unique())
        lines = alt.Chart(data).mark_line(interpolate="step-after").encode(
            x=alt.X("position:Q", title="query position i (bytes)"),
            y=alt.Y("query scale:Q", title="query scale (× q)", scale=alt.Scale(zero=False)),
            color=alt.Color("curve:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=320),
                            scale=alt.Scale(domain=names, range=[colour(method), "#888888"])),
            strokeDash=alt.StrokeDash("curve:N", scale=alt.Scale(domain=names, range=[[1, 0], [6, 4]]), legend=None),
            strokeWidth=alt.StrokeWidth("curve:N", scale=alt.Scale(domain=names, range=[4, 2]), legend=None),
            tooltip=["curve:N", "position:Q", alt.Tooltip("query scale:Q", format=".3f")])
        rules = alt.Chart(pd.DataFrame({"x": [page.train_length, 16 * page.train_length]})).mark_rule(
            strokeDash=[5, 4], color="gray").encode(x="x:Q")
        return (lines + rules).properties(height=260), data

    chart(VIEW, ("nope-temperature", method, source, page.train_length), build, f"{method}_query_scale")


@section("output-gate", "rope", order=27)
def gate_section(page: RopePage, method: str) -> None:
    model = _trained(page, method, "Gated attention: does a head that can close still use a sink?", "gates",
                     "Each head's output is multiplied, channel by channel, by a sigmoid gate from the layer's input "
                     "(Qwen3-Next): 0 closes the head, 1 lets it through. Beside it, the weight the head's queries put "
                     "on the first byte (the attention sink of StreamingLLM): a head that closes its gate need not park "
                     "its weight there. Compare the KV cache lab's first-byte share of the RoPE checkpoint.")
    if model is None:
        return

    def build():
        data = pd.DataFrame(rope_2025.gates_and_sinks(model.net, _held_out(page.train_length)))
        bars = alt.Chart(data).transform_fold(["mean gate", "weight on the first byte"], as_=["measure", "value"]).mark_bar().encode(
            x=alt.X("head:O"), y=alt.Y("value:Q", title="mean over the text", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("measure:N", title=None, legend=alt.Legend(orient="bottom"),
                            scale=alt.Scale(domain=["mean gate", "weight on the first byte"],
                                            range=[colour(method), "#888888"])),
            xOffset="measure:N", column=alt.Column("layer:O", title="layer"),
            tooltip=["layer:Q", "head:Q", "measure:N", alt.Tooltip("value:Q", format=".3f")]).properties(width=110, height=200)
        return bars, data

    chart(VIEW, ("output-gate", method, page.train_length, model.key), build, f"{method}_gates_and_sinks")


@section("mla-logit-parts", "rope", order=28)
def mla_section(page: RopePage, method: str) -> None:
    model = _trained(page, method, "MLA: a logit's content part and its position part", "projections",
                     "DeepSeek's latent attention splits each head's query and key: an unrotated part from the shared "
                     "latent (content) and a small rotated part whose key every head shares (position). Each logit is "
                     "their sum; here each part's mean over heads and queries, by distance from the query.")
    if model is None:
        return

    def build():
        data = pd.DataFrame(rope_2025.mla_logit_parts(model.net, _held_out(page.train_length), min(64, page.train_length)))
        lines = alt.Chart(data).mark_line().encode(
            x=alt.X("distance:Q", title="distance i − j (bytes)"), y=alt.Y("mean logit:Q", title="mean logit part"),
            color=alt.Color("part:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=320),
                            scale=alt.Scale(range=[colour(method), "#888888"])),
            facet=alt.Facet("layer:O", title="layer", columns=4),
            tooltip=["layer:Q", "distance:Q", "part:N", alt.Tooltip("mean logit:Q", format=".3f")]).properties(width=150, height=180)
        return lines, data

    chart(VIEW, ("mla-logit-parts", method, page.train_length, model.key), build, f"{method}_logit_parts")
