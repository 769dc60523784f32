"""RoPE: rotary position embedding, taken apart pair by pair."""
import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from views._charts import DASHED_LEGEND, cached_spec, csv_file, draw_spec, method_scales, metric_rows, show_chart, show_specs
from views._explore import chart, kept, rerun_page_if_changed
from views._checkpoints import shipped_checkpoint_json
from views._matrices import show_matrix
from views._page import page_header
from views._published_positions import analysed, published_section, section_failed
from views._sections import RopePage, sections_for
from views._url import qp_choice, qp_float, qp_int, sync_url
from posviz.positions.rope_remaps import remap_names
from posviz.explore import layers, rope
from posviz.errors import PosvizError
from posviz.display import display_name
from posviz.palette import rope_series
from posviz.positions.rope_scaling import ROPE_SCALINGS

# The app's colour per method: each scaling is drawn as the rope variant it makes (rope+yarn, ...).
# The legend says each scaling's display name (posviz.display); its colour is its id's.
SCALING_COLOURS, SCALING_DASHES = method_scales([display_name(s) for s in ROPE_SCALINGS],
                                                {display_name(s): rope_series(s) for s in ROPE_SCALINGS})

VIEW = "rope"
HEAD_DIMS = [8, 16, 32, 64, 128, 256]
BASES = [100, 1_000, 10_000, 100_000, 500_000, 1_000_000]
FACTORS = [1, 2, 4, 8, 16, 32]

page_header(
    "RoPE — rotary position embedding",
    "RoPE (Su et al. 2021) adds nothing to the tokens. It turns each pair of query and key features by an angle "
    "proportional to the position, so a query–key score can only depend on how far apart they are.",
    headline="rope_frequencies",
)

# What the shipped rope checkpoint uses, as defaults (the page works without it).
rope_config = (shipped_checkpoint_json().get("rope") or (None, None, None))[0] or {}
model_cfg = rope_config.get("model", {})
train_length = int(model_cfg.get("train_length", 256))
shipped_head_dim = model_cfg.get("n_embd", 128) // model_cfg.get("n_head", 4)
shipped_base = int(model_cfg.get("position_options", {}).get("base", 10_000))


def arrows(vectors: dict) -> pd.DataFrame:
    """Rows drawing each labelled 2-D vector as a segment from the origin."""
    rows = []
    for label, (x, y) in vectors.items():
        rows += [{"vector": label, "end": "origin", "x": 0.0, "y": 0.0}, {"vector": label, "end": "tip", "x": x, "y": y}]
    return pd.DataFrame(rows)


PAIR_COLOURS = alt.Scale(range=["#1565c0", "#ef6c00"])  # first label blue, second orange


def arrow_chart(df: pd.DataFrame, size: int = 320, radius: float = 1.3) -> alt.LayerChart:
    """Square plot of the vectors in ``df`` (from ``arrows``), each labelled at its tip."""
    scale = alt.Scale(domain=[-radius, radius], nice=False)
    lines = alt.Chart(df).mark_line(strokeWidth=3).encode(
        x=alt.X("x:Q", scale=scale, title="feature 1 of the pair"), y=alt.Y("y:Q", scale=scale, title="feature 2"),
        color=alt.Color("vector:N", legend=None, scale=PAIR_COLOURS), detail=alt.Detail("vector:N"))
    tip_rows = df[df["end"] == "tip"]
    tips = alt.Chart(tip_rows).mark_point(filled=True, size=80).encode(
        x=alt.X("x:Q"), y=alt.Y("y:Q"), color=alt.Color("vector:N", legend=None, scale=PAIR_COLOURS),
        tooltip=[alt.Tooltip("vector:N"), alt.Tooltip("x:Q", format=".3f"), alt.Tooltip("y:Q", format=".3f")])
    labels = alt.Chart(tip_rows).mark_text(dy=-12, fontWeight="bold").encode(
        x=alt.X("x:Q"), y=alt.Y("y:Q"), text=alt.Text("vector:N"), color=alt.Color("vector:N", legend=None, scale=PAIR_COLOURS))
    return (lines + tips + labels).properties(width=size, height=size)


def show_square(key: tuple, build, name: str, caption: str) -> None:
    """A fixed-size (square) chart with its CSV, ``build()`` -> (chart, data) kept under the view's key:
    geometry is the point, so it must not stretch."""
    spec, data = kept(VIEW, "square", key, lambda: (cached_spec(("explore-rope", "square") + key, lambda: build()[0]),
                                                    build()[1]))
    show_specs([spec], csv_file(data), name, caption, width="content")


def length_marks(marks: pd.DataFrame) -> alt.LayerChart:
    """Dashed horizontal lines at the lengths in ``marks`` (columns y, label), labelled at the left."""
    rule = alt.Chart(marks).mark_rule(strokeDash=[5, 4], color="gray").encode(
        y=alt.Y("y:Q"), tooltip=[alt.Tooltip("label:N", title="mark")])
    text = alt.Chart(marks).mark_text(align="left", dx=4, dy=-6, color="gray").encode(
        x=alt.XValue(0), y=alt.Y("y:Q"), text=alt.Text("label:N"))
    return rule + text


# -- one pair ---------------------------------------------------------------------------------------
st.header("One pair of features is a 2-D vector turned by m·θ")


@st.fragment
def pair_section() -> None:
    c1, c2 = st.columns(2)
    m = c1.slider("position m", 0, 64, qp_int("m", 3, 0, 64), key="m")
    theta = c2.slider("θ, the pair's speed (radians per position)", 0.05, 1.5, qp_float("theta", 0.5, 0.05, 1.5),
                      step=0.05, key="theta")
    vector = (1.0, 0.25)
    trail = kept(VIEW, "pair-path", (m, theta), lambda: pd.DataFrame(rope.rope_pair_path(vector, m, theta)))
    start, end = trail.iloc[0], trail.iloc[-1]
    left, right = st.columns([3, 2])
    with left:
        def turned():
            arrow = arrow_chart(arrows({"position 0": (start.x, start.y), f"position {m}": (end.x, end.y)}), size=380)
            return alt.Chart(trail).mark_point(color="gray", size=25).encode(
                x=alt.X("x:Q"), y=alt.Y("y:Q"), tooltip=[alt.Tooltip("position:Q"), alt.Tooltip("x:Q", format=".3f"),
                                           alt.Tooltip("y:Q", format=".3f"), alt.Tooltip("angle_deg:Q", title="angle (°)", format=".1f")]) + arrow, trail

        show_square(("pair", m, theta), turned, "rope_one_pair",
                    f"The vector x = (1, 0.25) at position 0 and turned by {m}·θ = {end.angle_deg:.0f}° at position {m}; "
                    "grey dots: its tip at positions 0 … m.")
    with right:
        st.metric("rotation angle m·θ", f"{end.angle_deg:.1f}°", help=f"{m * theta:.3f} radians")
        st.metric("length at position 0", f"{start.norm:.6f}")
        st.metric(f"length at position {m}", f"{end.norm:.6f}")

    # -- the dog example ----------------------------------------------------------------------------------
    st.header("“The dog” vs “The pig chased the dog”")
    st.markdown(
        "Take one pair of features of the query for **dog** and of the key for **the** (same word, same vectors in "
        "both sentences). In *The dog*, “dog” sits at position 1; in *The pig chased the dog*, at position 4. "
        "Its vector is turned by a different angle in each — yet the angle **between** the query and the key it "
        "looks at depends only on how far apart they are."
    )
    query, key = (1.0, 0.25), (0.55, 0.85)
    placements = [("The dog", "dog@1 → The@0", 1, 0), ("The pig chased the dog", "dog@4 → the@3", 4, 3),
                  ("The pig chased the dog", "dog@4 → The@0", 4, 0)]

    def dog_example() -> pd.DataFrame:
        example = pd.DataFrame(rope.rope_pair_example(query, key, theta, [(a, b) for _, _, a, b in placements]))
        example.insert(0, "query → key", [p[1] for p in placements])
        example.insert(0, "sentence", [p[0] for p in placements])
        return example

    example = kept(VIEW, "dog", (theta,), dog_example)
    cols = st.columns(3)
    for i, (col, (_, row)) in enumerate(zip(cols, example.iterrows())):
        with col:
            st.markdown(f"*{row['sentence']}*  \n**{row['query → key']}**: angle {row['angle_deg']:.1f}°")
            draw_spec(cached_spec(("explore-rope", "dog", theta, i), lambda row=row: arrow_chart(
                arrows({"q (dog)": (row.q_x, row.q_y), "k (the)": (row.k_x, row.k_y)}), size=260, radius=1.2)),
                width="content")
    shown = example[["sentence", "query → key", "m", "n", "offset", "angle_deg", "dot"]].rename(
        columns={"m": "query position m", "n": "key position n", "offset": "offset m − n",
                 "angle_deg": "angle from k to q (°)", "dot": "q·k"})
    st.dataframe(shown, hide_index=True, height="content", column_config={"angle from k to q (°)": st.column_config.NumberColumn(format="%.2f"),
                                                        "q·k": st.column_config.NumberColumn(format="%.6f")})
    st.download_button("Data (CSV)", csv_file(example), file_name="rope_dog_example.csv",
                       mime="text/csv", key="csv-rope_dog_example", on_click="ignore")
    st.caption(f"With θ = {theta:.2f}: the first two rows (offset 1) have the same angle and score; the third "
               "(offset 4) does not. Absolute positions cancel: q is turned by mθ, k by nθ, and the score sees (m − n)θ.")
    sync_url(m=m, theta=theta)


pair_section()

# -- frequencies --------------------------------------------------------------------------------------
st.header("Every pair turns at its own speed")
c1, c2 = st.columns(2)
head_dim = c1.select_slider("head dimension d", HEAD_DIMS, key="hd", value=int(qp_choice(
    "hd", str(shipped_head_dim) if shipped_head_dim in HEAD_DIMS else "32", [str(h) for h in HEAD_DIMS])))
base = c2.select_slider("base", BASES, value=int(qp_choice("rbase", str(shipped_base) if shipped_base in BASES else "10000",
                                                           [str(b) for b in BASES])),
                        key="rbase", format_func=lambda b: f"{b:,}")
sync_url(hd=head_dim, rbase=base)  # every section below draws at these: moving one reruns the page
freqs = kept(VIEW, "frequencies", (head_dim, base, train_length),
             lambda: pd.DataFrame(rope.rope_frequency_table(head_dim, base, train_length)))


def frequency_chart():
    lines = alt.Chart(freqs).mark_line(point=True).encode(
        x=alt.X("pair:Q", title="pair i (features i and i + d/2)", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("wavelength:Q", title=["wavelength (positions", "per full turn, log scale)"], scale=alt.Scale(type="log")),
        tooltip=[alt.Tooltip("pair:Q"), alt.Tooltip("first_feature:Q", title="feature"),
                 alt.Tooltip("second_feature:Q", title="paired with"), alt.Tooltip("theta:Q", title="θ (rad/position)", format=".3g"),
                 alt.Tooltip("wavelength:Q", format=",.1f"), alt.Tooltip("turns_in_training:Q", title="turns in training", format=",.2f")],
    ) + length_marks(pd.DataFrame({"y": [train_length], "label": [f"training length {train_length:,}"]}))
    return lines.properties(height=300), freqs


chart(VIEW, ("frequencies", head_dim, base, train_length), frequency_chart, f"rope_frequencies_d{head_dim}",
      f"θᵢ = base^(−2i/d). Pairs above the dashed line (training length {train_length:,}) never complete a turn "
      "during training: at longer lengths they reach angles the model has never seen.",
      says=lambda: rope.frequency_sentence(freqs, train_length))
st.dataframe(freqs.rename(columns={"first_feature": "feature", "second_feature": "paired with",
                                   "theta": "θ (rad/position)", "wavelength": "wavelength (positions)",
                                   "turns_in_training": f"turns in {train_length:,} positions"}),
             hide_index=True, height="content")


# -- shift invariance ---------------------------------------------------------------------------------
@st.fragment
def shift_section(head_dim: int, base: float) -> int:
    c1, c2, c3, c4 = st.columns(4)
    qm = c1.number_input("query position m", 0, 100_000, qp_int("sm", 7, 0, 100_000), key="sm")
    kn = c2.number_input("key position n", 0, 100_000, qp_int("sn", 2, 0, 100_000), key="sn")
    s = c3.number_input("shift s", 0, 1_000_000, qp_int("ss", 1000, 0, 1_000_000), key="ss")
    seed = c4.number_input("random q, k (seed)", 0, 9999, qp_int("seed", 0, 0, 9999), key="seed")
    sync_url(sm=qm, sn=kn, ss=s, seed=seed)

    def shift_check():
        q_vec, k_vec = rope.random_qk(head_dim, seed)
        return rope.rope_shift_invariance(q_vec, k_vec, qm, kn, s, base)

    check = kept(VIEW, "shift", (head_dim, base, seed, qm, kn, s), shift_check)
    c1, c2, c3 = st.columns(3)
    c1.metric(f"q·k at ({qm:,}, {kn:,})", f"{check.score:.10f}")
    c2.metric(f"q·k at ({qm + s:,}, {kn + s:,})", f"{check.shifted_score:.10f}")
    c3.metric("absolute difference", f"{check.difference:.1e}", help="float64 rounding of the angles m·θ, which grows with the position: about 1e-16 × position.")

    def scores() -> np.ndarray:
        q, k = rope.random_qk(head_dim, seed)
        return rope.rope_scores(q, k, 64, base)

    show_matrix(kept(VIEW, "scores", (head_dim, base, seed), scores), f"rope_scores_d{head_dim}", x_title="key position n",
                y_title="query position m", value_title="q·k", scheme="redblue", key=(head_dim, base, seed))
    st.caption("The same q and k placed at every (m, n) from 0 to 63: every diagonal (fixed m − n) has one colour.")
    rerun_page_if_changed("rope-seed", seed)  # the norms section below draws the same random vector
    return seed


st.header("Proof in numbers: q·k at (m, n) equals q·k at (m + s, n + s)")
seed = shift_section(head_dim, base)


# -- long-term decay -----------------------------------------------------------------------------------
def decay_chart(head_dim: int, base: float, max_distance: int):
    decay_df = pd.DataFrame(rope.rope_decay_bound(head_dim, base, max_distance))
    lines = alt.Chart(decay_df).mark_line().encode(
        x=alt.X("distance:Q", title="relative distance m − n (positions)"),
        y=alt.Y("bound:Q", title="relative upper bound (1/(d/2)) Σⱼ |Sⱼ|"),
        tooltip=[alt.Tooltip("distance:Q"), alt.Tooltip("bound:Q", format=".3f")],
    ).properties(height=280)
    return lines, decay_df


@st.fragment
def decay_section(head_dim: int, base: float) -> None:
    max_distance = st.slider("largest relative distance (positions)", 64, 8192, qp_int("dmax", 1024, 64, 8192), step=64,
                             key="dmax")
    sync_url(dmax=max_distance)
    chart(VIEW, ("decay", head_dim, base, max_distance), lambda: decay_chart(head_dim, base, max_distance),
          f"rope_decay_d{head_dim}",
          r"$S_j = \sum_{k<j} e^{i(m-n)\theta_k}$. Splitting q·k into pair terms $h_j\,e^{i(m-n)\theta_j}$, the score "
          r"is at most $\max_j |h_{j+1} - h_j| \cdot \sum_j |S_j|$: the envelope shrinks with distance. It is a bound on "
          "smooth content, not a promise that attention fades — a trained head can still attend far away.",
          says=lambda: rope.decay_sentence(rope.rope_decay_bound(head_dim, base, max_distance)))


st.header("Long-term decay (RoFormer §3.4.3)")
decay_section(head_dim, base)

# -- norm preservation ------------------------------------------------------------------------------------
st.header("Rotations keep the length")
norm_length = 16 * train_length
norms = kept(VIEW, "norms", (head_dim, base, norm_length, seed),
             lambda: pd.DataFrame(rope.rope_norms(head_dim, base, norm_length, seed)))


def norm_chart():
    norm_plot = norms.rename(columns={"norm_before": "before rotation", "norm_after": "after rotation"}).melt(
        id_vars="position", value_vars=["before rotation", "after rotation"], var_name="vector", value_name="norm")
    lines = alt.Chart(norm_plot).mark_line().encode(
        x=alt.X("position:Q", title="position"), y=alt.Y("norm:Q", title="‖x‖", axis=alt.Axis(format=".3f")),
        color=alt.Color("vector:N", title=None), strokeDash=alt.StrokeDash("vector:N", title=None),
        tooltip=[alt.Tooltip("vector:N"), alt.Tooltip("position:Q"), alt.Tooltip("norm:Q", format=".12f")],
    ).properties(height=220)
    return lines, norms


chart(VIEW, ("norms", head_dim, base, norm_length, seed), norm_chart, f"rope_norms_d{head_dim}")
st.metric(f"largest relative change of ‖x‖ over positions 0…{norm_length - 1:,}",
          f"{norms['relative_change'].max():.1e}")

# -- scalings -----------------------------------------------------------------------------------------------
@st.fragment
def scaling_section(head_dim: int, base: float) -> None:
    st.header("Context extension: wavelengths under each scaling")
    factor = st.select_slider("extension factor s (target length = s × training length)", FACTORS,
                              value=int(qp_choice("factor", "4", [str(f) for f in FACTORS])), key="factor")
    waves = kept(VIEW, "scalings", (head_dim, base, factor, train_length),
                 lambda: pd.DataFrame(rope.scaling_wavelengths(head_dim, base, factor, train_length)))
    # shown by name; the CSV keeps the id beside it
    waves = waves.assign(scaling_id=waves["scaling"], scaling=waves["scaling"].map(display_name))

    def scaling_chart():
        target = factor * train_length
        marks = pd.DataFrame({"y": [train_length, target],
                              "label": [f"training length {train_length:,}", f"target length {target:,}"]})
        lines = alt.Chart(waves).mark_line(point=True).encode(
            x=alt.X("pair:Q", title="pair i", axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("wavelength:Q", title="wavelength (positions, log scale)", scale=alt.Scale(type="log")),
            color=alt.Color("scaling:N", scale=SCALING_COLOURS, title="scaling", legend=DASHED_LEGEND),
            strokeDash=alt.StrokeDash("scaling:N", scale=SCALING_DASHES, title="scaling", legend=DASHED_LEGEND),
            tooltip=[alt.Tooltip("scaling:N"), alt.Tooltip("pair:Q"), alt.Tooltip("wavelength:Q", format=",.1f"),
                     alt.Tooltip("attention_factor:Q", title="attention factor", format=".3f")],
        ) + length_marks(marks)
        return lines.properties(height=360), waves

    chart(VIEW, ("scalings", head_dim, base, factor, train_length), scaling_chart, f"rope_scalings_x{factor}",
          f"{display_name('linear')} divides every speed by s; {display_name('ntk')} raises the base so the slowest "
          f"pair slows by s and the fastest stays; {display_name('dynamic')} does {display_name('ntk')} with the ratio of "
          "the length actually seen (here the target, as in one full forward pass over it; with a KV cache each key "
          f"keeps the ratio of the step that wrote it); {display_name('yarn')} and {display_name('llama3')} keep fast "
          "pairs, interpolate slow ones and blend in between.")
    factors = waves.groupby("scaling", sort=False)[["attention_factor", "logit_scale"]].first().reset_index()
    st.dataframe(factors.rename(columns={"attention_factor": "attention factor on cos and sin",
                                         "logit_scale": "logits scaled by (factor²)"}), hide_index=True,
                 height="content")
    sync_url(factor=factor)


scaling_section(head_dim, base)


# -- training-free remaps -------------------------------------------------------------------------------------
@st.fragment
def remap_section() -> None:
    st.header("Training-free remaps: which relative position each pair is seen at")
    st.markdown("A scaling changes how fast every pair turns; a remap keeps the speeds and changes the positions a "
                "query and a key are rotated at, pair by pair, so that no pair sees a distance the model never trained "
                f"on. Below: the relative position each query (row) and key (column) is attended at, for a text of "
                f"n × {train_length:,} bytes, with the remap's defaults covering it.")
    c1, c2 = st.columns(2)
    name = c1.selectbox("remap", remap_names(), format_func=display_name, index=remap_names().index(qp_choice("remap", "self_extend", remap_names())),
                        key="remap", help="Self-Extend (Jin et al. 2024), ReRoPE and Leaky ReRoPE (Su 2023), dual chunk "
                                          "attention (An et al. 2024), STRING (An et al. 2024).")
    multiple = c2.select_slider("text length (× training length)", [1, 2, 4], value=int(qp_choice("rn", "4", ["1", "2", "4"])),
                                key="rn")
    sync_url(remap=name, rn=multiple)
    length = multiple * train_length
    view = kept(VIEW, "remap", (name, train_length, length), lambda: rope.remap_view(name, train_length, length))
    metric_rows([
        dict(label="largest relative position a pair sees", value=f"{view.largest:,.1f}",
             help=f"Plain RoPE: {view.plain_largest:,} (the text's length minus one)."),
        dict(label="training length", value=f"{train_length:,}"),
    ], per_row=2)
    st.markdown(f"**{display_name(name)}'s parameters for {length:,} bytes:** " + ", ".join(
        f"`{k}={v:.3g}`" if isinstance(v, float) else f"`{k}={v}`" for k, v in view.parameters.items()))
    left, _ = st.columns([3, 2])  # a square map: the full width would make it taller than the window
    with left:
        show_matrix(view.matrix, f"rope_remap_{name}_x{multiple}", x_title="key position j", y_title="query position i",
                    value_title="relative position seen", key=(name, train_length, length))
    st.caption("Plain RoPE would show i − j, growing to the far corner. Every remap keeps the diagonal band (near pairs "
               "as trained); past it Self-Extend divides by the group, ReRoPE stands still at w, Leaky ReRoPE grows k "
               "times slower, dual chunk attention restarts in chunks and STRING moves far pairs back by S − W. The "
               "Context extension lab runs them on the RoPE checkpoint.")


remap_section()

# -- published RoPE models ($POSVIZ_MODELS) --------------------------------------------------------------
# Sections other rotary methods offer by name (p-RoPE's pairs that turn and those that stand still).
for section, method in sections_for("rope"):
    section.draw(RopePage(train_length, shipped_head_dim, shipped_base), method)

published = published_section(
    "rope", "Frequencies of published RoPE models",
    "Each published model's own speeds, read from its rotary module under its own scaling (Llama 3's bands, "
    "YaRN), next to the plain ladder θ^(−2i/d) its θ would give.")
if published is not None:
    try:
        facts = analysed(published, "rope-frequencies", lambda: rope.published_rope(published))
    except PosvizError as exc:
        section_failed(published, exc)
    else:
        scaling = "none" if facts.rope_type == "default" else facts.rope_type
        scaling += "" if facts.factor is None else f", factor {facts.factor:g}"
        metric_rows([
            dict(label="θ (base)", value=f"{facts.theta:,.0f}"),
            dict(label="scaling", value=scaling, help="transformers' rope_type in the model's config, and its factor."),
            dict(label="rotary share of each head", value=f"{facts.rotary_share:.0%}",
                 help=f"{facts.rotary_dims} of each head's {facts.head_dim} features rotate; the rest carry no position."),
            dict(label="attention factor", value=f"{facts.attention_factor:.3f}",
                 help="What the model multiplies cos and sin by (YaRN: 0.1·ln(factor) + 1; 1 otherwise)."),
            dict(label="trained context (tokens)", value=f"{facts.train_length:,}"),
        ], per_row=3)
        for note in facts.notes:
            st.info(note, icon="ℹ️")
        from views._sections.layers import layout_chart  # the layout checkpoints' chart, for this model's config

        layout = pd.DataFrame(layers.layout_rows({facts.name: published}))
        st.markdown(f"**{facts.name}: its layers** (from its config: which rotate, with which θ, through which window)")
        show_chart(layout_chart(layout, [facts.name]), layout, f"published_{facts.name}_layers")
        own, plain = f"{facts.name} ({scaling})", f"plain θ = {facts.theta:,.0f}"
        table = pd.DataFrame(facts.columns)
        lines = pd.concat([table.assign(series=own), table.assign(series=plain, wavelength=table["plain_wavelength"],
                                                                   inv_freq=table["plain_inv_freq"])], ignore_index=True)
        lines = lines[["series", "pair", "first_feature", "second_feature", "inv_freq", "wavelength", "ratio", "band"]]
        marks = [(facts.train_length, f"trained context {facts.train_length:,}")]
        if facts.original_length and facts.original_length != facts.train_length:
            marks.append((facts.original_length, f"original context {facts.original_length:,}"))
        mark_frame = pd.DataFrame({"y": [y for y, _ in marks], "label": [label for _, label in marks]})
        st.markdown(f"**{facts.name}: wavelength of each rotary pair, under its own scaling and with plain θ**")
        published_chart = alt.Chart(lines).mark_line(point=True).encode(
            x=alt.X("pair:Q", title=f"pair i (features i and i + {facts.rotary_dims // 2} of the rotated part)",
                    axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("wavelength:Q", title=["wavelength (tokens per", "full turn, log scale)"], scale=alt.Scale(type="log")),
            color=alt.Color("series:N", title=None, sort=[own, plain], legend=alt.Legend(orient="bottom", labelLimit=400)),
            strokeDash=alt.StrokeDash("series:N", title=None, sort=[own, plain], legend=alt.Legend(orient="bottom", labelLimit=400)),
            tooltip=[alt.Tooltip("series:N"), alt.Tooltip("pair:Q"), alt.Tooltip("inv_freq:Q", title="θᵢ (rad/token)", format=".4g"),
                     alt.Tooltip("wavelength:Q", title="wavelength (tokens)", format=",.1f"),
                     alt.Tooltip("ratio:Q", title="own / plain wavelength", format=".3g"), alt.Tooltip("band:N")],
        ) + length_marks(mark_frame.head(1))
        if len(mark_frame) > 1:  # the second mark labelled at the right: the two lines are often close
            second = mark_frame.iloc[1:]
            published_chart += alt.Chart(second).mark_rule(strokeDash=[2, 3], color="gray").encode(
                y=alt.Y("y:Q"), tooltip=[alt.Tooltip("label:N", title="mark")])
            published_chart += alt.Chart(second).mark_text(align="right", dx=-4, dy=10, color="gray").encode(
                x=alt.XValue("width"), y=alt.Y("y:Q"), text=alt.Text("label:N"))
        bands = table["band"].value_counts(sort=False)
        show_chart(published_chart.properties(height=320), lines, f"published_{facts.name}_rope_frequencies",
                   "Pairs by what its scaling did to them: " + ", ".join(f"{n} {b}" for b, n in bands.items())
                   + ". Pairs whose wavelength is above the trained context never complete a turn within it.")
