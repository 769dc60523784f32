"""Absolute position embeddings: the fixed sinusoidal table and the learned (GPT-2 style) one."""
import altair as alt
import numpy as np
import pandas as pd
import streamlit as st
import torch

from views._charts import metric_rows, show_chart, split_title
from views._checkpoints import shipped_lab_model
from views._explore import chart, kept
from views._matrices import ALTAIR_MAX_CELLS, show_matrix, show_pooled_matrix
from views._page import page_header
from views._published_positions import analysed, published_section, section_failed
from views._url import qp_choice, qp_int, qp_multi, sync_url
from posviz.explore import sinusoidal_learned
from posviz.errors import PosvizError, PositionLimitError
from posviz.positions import POSITION_METHODS, method_names

VIEW = "absolute"
DIMS = [8, 16, 32, 64, 128, 256, 512]
BASES = [100, 1_000, 10_000, 100_000, 1_000_000]
SMALL_DIMS = [2, 4, 6, 8]

page_header(
    "Sinusoidal & learned absolute positions",
    "Absolute methods add a vector per position to each token's embedding before the first layer. "
    "Sinusoidal vectors come from a formula (Vaswani et al. 2017, §3.5); learned ones are a trained table (GPT-2).",
)

# -- controls, read from the URL ---------------------------------------------------------------
st.header("The sinusoidal table")
st.markdown(
    "Pair *i* of dimensions (2*i*, 2*i*+1) holds sin and cos of *p*·θᵢ with θᵢ = base^(−2*i*/*d*): "
    "a ladder of wavelengths from 2π positions (pair 0) to about 2π·base (the last pair)."
)
c1, c2, c3 = st.columns(3)
length = c1.slider("positions shown (length)", 16, 2048, qp_int("len", 128, 16, 2048), step=16, key="len")
dim = c2.select_slider("model width d (dimensions)", DIMS, value=int(qp_choice("dim", "64", [str(d) for d in DIMS])),
                       key="dim")
base = c3.select_slider("base", BASES, value=int(qp_choice("base", "10000", [str(b) for b in BASES])), key="base",
                        format_func=lambda b: f"{b:,}", help="10,000 in the paper; larger = slower slowest wave.")
sync_url(len=length, dim=dim, base=base)  # every section below draws at these: moving one reruns the page

show_matrix(kept(VIEW, "pe", (length, dim, base), lambda: sinusoidal_learned.sinusoidal_pe(length, dim, base)),
            f"sinusoidal_pe_L{length}_d{dim}", x_title="dimension", y_title="position", value_title="PE value",
            scheme="redblue", key=(length, dim, base), says=lambda: sinusoidal_learned.pe_sentence(length, dim, base))
st.caption("Left columns (fast pairs) flicker from row to row; right columns (slow pairs) barely change over "
           "the whole table: they are almost constant, so they tell little about position at these lengths.")


@st.fragment
def wave_section(length: int, dim: int, base: float) -> None:
    default_dims = [str(d) for d in (0, 2, dim // 4, dim // 2) if d < dim]
    default_dims = list(dict.fromkeys(default_dims))
    dims_shown = st.multiselect("dimensions to draw as waves", [str(d) for d in range(dim)],
                                default=qp_multi("dims", default_dims, [str(d) for d in range(dim)]), key=f"dims-{dim}",
                                help="Even dimensions are sines, odd ones cosines of the same pair.", wrap=True)
    if dims_shown:
        sync_url(dims=[int(d) for d in dims_shown])
    else:
        st.query_params.pop("dims", None)  # an empty list in the URL would read back as junk
    if dims_shown:
        chart(VIEW, ("waves", length, dim, base, tuple(dims_shown)), lambda: wave_chart(length, dim, base, dims_shown),
              f"sinusoid_waves_d{dim}")
    else:
        st.info("Pick at least one dimension to draw.", icon="ℹ️")


def wave_chart(length: int, dim: int, base: float, dims_shown: list[str]):
    waves = pd.DataFrame(sinusoidal_learned.sinusoid_waves(length, dim, base, [int(d) for d in dims_shown]))
    lines = alt.Chart(waves).mark_line().encode(
        x=alt.X("position:Q", title="position p"),
        y=alt.Y("value:Q", title="PE[p, dimension]", scale=alt.Scale(domain=[-1.05, 1.05])),
        color=alt.Color("dimension:N", title="dimension"),
        tooltip=[alt.Tooltip("dimension:N"), alt.Tooltip("position:Q"), alt.Tooltip("value:Q", format=".4f")],
    ).properties(height=260)
    return lines, waves


wave_section(length, dim, base)

# -- binary counting ---------------------------------------------------------------------------
@st.fragment
def binary_section(dim: int, base: float) -> None:
    count_len = st.slider("positions shown", 16, 256, qp_int("bits_len", 64, 16, 256), step=16, key="bits_len")
    sync_url(bits_len=count_len)
    analogy = kept(VIEW, "binary", (count_len, dim, base), lambda: sinusoidal_learned.binary_counting(count_len, dim, base))
    left, right = st.columns(2)
    with left:
        st.markdown(f"**Bits of p** ({analogy['bits'].shape[1]} bits, least significant on the left)")
        show_matrix(analogy["bits"], f"binary_bits_{count_len}", x_title="bit", y_title="position p", value_title="bit",
                    key=(count_len,))
    with right:
        st.markdown(f"**Sign bits of the {dim // 2} sine columns** (1 where sin(p·θᵢ) < 0)")
        show_matrix(analogy["sign_bits"], f"sinusoid_sign_bits_{count_len}_d{dim}", x_title="pair i",
                    y_title="position p", value_title="sign bit", key=(count_len, dim, base))
    periods = pd.DataFrame({"digit": np.arange(max(len(analogy["bit_periods"]), 6))})
    periods["binary bit: period (positions)"] = pd.Series(analogy["bit_periods"])
    periods["sinusoid pair: wavelength (positions)"] = pd.Series(analogy["pair_wavelengths"])
    st.dataframe(periods.head(8), hide_index=True, height="content",
                 column_config={"sinusoid pair: wavelength (positions)": st.column_config.NumberColumn(format="%.1f")})
    st.caption("Both are “digits” that turn over at geometrically slower rates. Bits double their period per digit; "
               f"with d = {dim} and base {base:,} each sinusoid pair's wavelength grows by {base ** (2 / dim):.2f}×. "
               "The sinusoids are the smooth version, and smooth rotations are what make the next section work.")


st.header("Like counting in binary")
binary_section(dim, base)


# -- PE(p + k) = M_k PE(p) ------------------------------------------------------------------------
@st.fragment
def shift_section(length: int, dim: int, base: float) -> None:
    c1, c2, c3 = st.columns(3)
    k = c1.slider("shift k (positions)", 0, 512, qp_int("k", 3, 0, 512), key="k")
    small = c2.select_slider("width shown for M_k", SMALL_DIMS, value=int(qp_choice("small", "4", [str(s) for s in SMALL_DIMS])),
                             key="small")
    example_p = c3.slider("example position p", 0, length - 1, min(qp_int("p", 5, 0, 2047), length - 1), key=f"p-{length}")
    sync_url(k=k, small=small, p=example_p)
    full = kept(VIEW, "shift", (length, dim, k, base, example_p),
                lambda: sinusoidal_learned.shift_check(length, dim, k, base, example_p))
    shown = kept(VIEW, "shift", (length, small, k, base, example_p),
                 lambda: sinusoidal_learned.shift_check(length, small, k, base, example_p))
    m1, m2 = st.columns(2)
    m1.metric(f"max |PE(p+k) − M_k·PE(p)| over p = 0…{length - 1}, d = {dim}", f"{full.max_error:.1e}",
              help="Largest absolute difference over every position and dimension (float64).")
    m2.metric("positions checked", f"{length:,}", help="M_k is built from k and the frequencies alone: one matrix for every p.")
    left, right = st.columns(2)
    with left:
        st.markdown(f"**M_{k}** for d = {small} (block-diagonal 2×2 rotations by k·θᵢ)")
        st.dataframe(pd.DataFrame(shown.matrix, columns=[f"col {j}" for j in range(small)]).round(6), hide_index=True,
                     height="content")
    with right:
        st.markdown(f"**At p = {example_p}** (first {min(dim, 8)} of {dim} dimensions)")
        st.dataframe(pd.DataFrame({"dimension": np.arange(min(dim, 8)),
                                   f"PE({example_p}+{k})": full.example_shifted[:8],
                                   f"M_{k}·PE({example_p})": full.example_mapped[:8]}).round(12), hide_index=True,
                     height="content")
    st.caption("So “k positions later” is a linear map a layer can learn once and apply anywhere — the original "
               "argument for sinusoids. It only holds for the position vector alone, though: after it is added to a "
               "token embedding and mixed by the layers, the model has to untangle it.")


st.header("Shifting by k is one fixed matrix: PE(p + k) = M_k · PE(p)")
shift_section(length, dim, base)


# -- dot product vs distance --------------------------------------------------------------------
def dot_chart(dim: int, base: float, max_distance: int):
    references = (max_distance, 4 * max_distance + 100)
    dot_df = pd.DataFrame(sinusoidal_learned.dot_product_vs_distance(dim, base, max_distance, references))
    lines = alt.Chart(dot_df).mark_line().encode(
        x=alt.X("distance:Q", title="distance Δ (positions; negative = key before)"),
        y=alt.Y("dot:Q", title="PE(p) · PE(p + Δ)"),
        color=alt.Color("reference:N", title="reference position p"),
        strokeDash=alt.StrokeDash("reference:N", title="reference position p"),
        tooltip=[alt.Tooltip("reference:N", title="p"), alt.Tooltip("distance:Q", title="Δ"),
                 alt.Tooltip("dot:Q", format=".4f")],
    ).properties(height=280)
    return lines, dot_df


@st.fragment
def dot_section(dim: int, base: float) -> None:
    max_distance = st.slider("largest distance Δ shown (positions)", 8, 512, qp_int("dist", 128, 8, 512), key="dist")
    sync_url(dist=max_distance)
    chart(VIEW, ("dots", dim, base, max_distance), lambda: dot_chart(dim, base, max_distance), f"pe_dot_vs_distance_d{dim}",
          f"The two reference positions give the same curve (it is Σᵢ cos(Δ·θᵢ), peak {dim // 2} at Δ = 0), and "
          "it is symmetric: the raw embeddings cannot tell a key before the query from one after it.")


st.header("PE(p) · PE(p + Δ) depends on the distance only")
dot_section(dim, base)


# -- the learned tables ---------------------------------------------------------------------------
def learned_analysis(model) -> tuple[np.ndarray, np.ndarray, dict]:
    """The vectors a learned absolute method adds at each position it has (``PositionMethod.added_vectors``),
    their cosine similarities and their two main directions."""
    position = model.position
    table = position.added_vectors(torch.arange(position.max_positions or model.train_length)).numpy()
    return table, sinusoidal_learned.cosine_similarity(table), sinusoidal_learned.pca_2d(table)


def pca_chart(pca: dict):
    points = pd.DataFrame({k: pca[k] for k in ("position", "pc1", "pc2")})
    scatter = alt.Chart(points).mark_line(color="lightgray").encode(
        x=alt.X("pc1:Q", title=f"PC 1 ({pca['explained'][0]:.0%} of variance)"),
        y=alt.Y("pc2:Q", title=f"PC 2 ({pca['explained'][1]:.0%} of variance)"),
        order=alt.Order("position:Q"),
    ) + alt.Chart(points).mark_circle(size=30).encode(
        x=alt.X("pc1:Q"), y=alt.Y("pc2:Q"), color=alt.Color("position:Q", scale=alt.Scale(scheme="viridis")),
        tooltip=[alt.Tooltip("position:Q"), alt.Tooltip("pc1:Q", format=".3f"), alt.Tooltip("pc2:Q", format=".3f")],
    )
    return scatter.properties(height=380), points


def limit_error(model, limit: int) -> PositionLimitError | None:
    """What the model itself raises one position past its table (None: it ran)."""
    try:
        model(torch.zeros(1, limit + 1, dtype=torch.long))
    except PositionLimitError as exc:
        return exc
    return None


def learned_table_section(name: str) -> None:
    """What a checkpoint of a learned absolute method trained: its table, how alike its rows are, and the
    model's own answer one position past the table."""
    st.header(f"The learned table (the `{name}` checkpoint)")
    model, problem = shipped_lab_model(name)
    if model is None:
        st.warning(problem, icon="⚠️")
        return
    key = tuple(model.key)
    with st.spinner("Analysing the learned table…"):
        table, cosine, pca = kept(VIEW, "learned-table", key, lambda: learned_analysis(model))
    rows = table.shape[0]
    st.markdown(f"{rows:,} positions × {table.shape[1]} dimensions, one trained vector per position.")
    show_matrix(table, f"{name}_table", x_title="dimension", y_title="position", value_title="weight", scheme="redblue",
                key=key)
    st.markdown("**Cosine similarity between positions**")
    show_matrix(cosine, f"{name}_cosine_similarity", x_title="position", y_title="position",
                value_title="cosine similarity", key=key)
    left, _ = st.columns([3, 1])
    with left:
        st.markdown(f"**The {rows:,} vectors projected on their two main directions (PCA)**")
        chart(VIEW, ("pca",) + key, lambda: pca_chart(pca), f"{name}_pca")
    st.caption("Nothing forces neighbouring rows to be alike, yet training usually makes them so: a bright band "
               "along the diagonal of the similarity matrix and a smooth path in the projection mean the model "
               "learned a notion of nearness. Untrained or rarely seen rows look like noise.")

    limit = model.position.max_positions
    if limit is None:
        return
    st.subheader(f"Position {limit:,}, one past the table: asking the real model")
    exc = kept(VIEW, "limit-error", key, lambda: limit_error(model, limit))
    if exc is not None:
        st.markdown(f"Running the `{name}` checkpoint on {limit + 1:,} bytes raises `{type(exc).__name__}`:")
        st.code(str(exc), language=None, wrap_lines=True)
        st.markdown(
            f"There is no row {limit:,} in the table, so there is nothing to add to that byte's embedding: the "
            "model is undefined there, not just inaccurate. Any fix is a guess made outside the model (reuse a row, "
            "slide a window, interpolate the table), which is why learned tables cap the context at the training "
            "length. Formula-based methods always have an answer; the **Extrapolation lab** measures whether it "
            "is a good one."
        )
    else:
        st.info(f"This checkpoint accepted {limit + 1:,} positions: its table is longer than reported.", icon="ℹ️")


# every registered method that adds a trained vector per position (GPT-2's learned table, and any new one)
for name in method_names():
    if POSITION_METHODS[name].acts_on == "input" and POSITION_METHODS[name].learned:
        learned_table_section(name)

# -- published learned tables ($POSVIZ_MODELS) ----------------------------------------------------
published = published_section(
    "learned", "Learned tables of published models",
    "GPT-2 and OPT learned one vector per position, like the `learned` checkpoint, over 1,024 and 2,048 "
    "positions. Their tables as the models hold them, position 0 first.")
if published is not None:
    try:
        facts = analysed(published, "learned-table", lambda: sinusoidal_learned.published_learned_table(published.position.table))
    except PosvizError as exc:
        section_failed(published, exc)
    else:
        rows, width = facts["shape"]
        name = published.name
        for note in published.position.notes:
            st.info(note, icon="ℹ️")
        components = facts["components"]
        metric_rows([
            dict(label="positions × width", value=f"{rows:,} × {width:,}"),
            dict(label="mean cosine of neighbours p, p + 1", value=f"{facts['neighbours']:.3f}",
                 help="1: each row points the same way as the next; 0: unrelated rows."),
            dict(label=f"variance along the first {components.explained.size} PCs",
                 value=f"{components.explained.sum():.0%}",
                 help="Share of the table's variance (rows minus their mean) the leading directions hold."),
        ], per_row=3)
        similarity, block = facts["similarity"], facts["block"]
        title = f"{name}: cosine similarity between positions"
        file = f"published_{name}_cosine_similarity"
        left, _ = st.columns([3, 2])  # a square map: the full width would make it taller than the window
        with left:
            if block == 1 and rows * rows <= ALTAIR_MAX_CELLS:
                st.markdown(f"**{title}**")
                show_matrix(similarity, file, x_title="position (tokens)", y_title="position (tokens)",
                            value_title="cosine similarity", scheme="redblue")
            else:
                show_pooled_matrix(similarity, block, (rows, rows), file, x_title="position (tokens)",
                                   y_title="position (tokens)", value_title="cosine similarity", scheme="redblue",
                                   title=title + (f" (averaged over {block} × {block} blocks)" if block > 1 else ""),
                                   key=("published-cosine", published.key))
        pcs = pd.DataFrame(components.columns())
        pcs["component"] = [f"PC {c} ({components.explained[c - 1]:.0%} of variance)" for c in pcs["component"]]
        st.markdown(f"**{name}: the table's first {components.explained.size} principal components, against position**")
        pc_chart = alt.Chart(pcs).mark_line().encode(
            x=alt.X("position:Q", title="position (tokens)", scale=alt.Scale(domain=[0, rows - 1], nice=False)),
            y=alt.Y("value:Q", title=split_title("coordinate along the component (embedding units)")),
            color=alt.Color("component:N", title="component", sort=None, legend=alt.Legend(labelLimit=320)),
            tooltip=[alt.Tooltip("component:N"), alt.Tooltip("position:Q"), alt.Tooltip("value:Q", format=".4f")],
        ).properties(height=320)
        show_chart(pc_chart, pcs, f"published_{name}_principal_components",
                   "Each line is one direction of the table (the rows minus their mean), drawn against position. "
                   "Smooth waves of growing wavelength mean the model learned something like a sinusoidal table "
                   "on its own; a lone step or spike at the end marks rows that training rarely reached.")

