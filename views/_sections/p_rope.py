"""p-RoPE's section of the RoPE page: which pairs of the shipped p_rope checkpoint turn and which stand still,
beside RoPE's wavelengths for the same θ (Barbero et al. 2025: the slow pairs are where RoPE's meaning lives)."""
import altair as alt
import pandas as pd
import streamlit as st

from posviz.explore import rope
from posviz.palette import colour
from posviz.positions import build_position_method
from posviz.positions.base import ModelShape
from posviz.display import display_name
from views._checkpoints import shipped_checkpoint_json
from views._explore import chart
from views._sections import RopePage, section

VIEW = "rope"


@section("p-rope-pairs", "rope", order=10)
def pairs_section(page: RopePage, method: str) -> None:
    config = (shipped_checkpoint_json().get(method) or (None, None, None))[0] or {}
    model = config.get("model", {})
    options = dict(model.get("position_options") or {})
    shape = ModelShape(n_layer=1, n_head=1, head_dim=int(model.get("n_embd", 128)) // int(model.get("n_head", 4)),
                       n_embd=int(model.get("n_embd", 128)), train_length=int(model.get("train_length", page.train_length)))
    own = build_position_method(method, shape, options)
    plain = build_position_method("rope", shape, {"base": own.options.base})
    columns = rope.pairs_beside_rope(own.rotation_frequencies(shape.train_length)[0],
                                     plain.rotation_frequencies(shape.train_length)[0], shape.train_length)
    table = pd.DataFrame(columns)
    turning = int(table["rotates"].sum())
    st.header(f"p-RoPE: only the fastest pairs turn (p = {own.options.p:g})")
    st.caption(f"The {display_name(method)} checkpoint{'' if config else ' (not shipped here: the defaults)'}: {turning} of its "
               f"{len(table)} pairs per head turn, exactly as RoPE's fastest {turning}; the other {len(table) - turning} "
               "stand still, so they carry no position at all. In RoPE those slow pairs turn less than once within "
               "the training length: they act as channels for meaning, and past the training length they are the "
               "ones that reach angles never seen in training (Barbero et al. 2025). p-RoPE stops them.")

    def build():
        ropes, ours = f"{display_name('rope')}, every pair", f"{display_name(method)}: pairs that turn"
        lines = pd.concat([table.assign(series=ropes, wavelength=table["plain_wavelength"]),
                           table[table["rotates"]].assign(series=ours)], ignore_index=True)
        still = table[~table["rotates"]]
        line = alt.Chart(lines).mark_line(point=alt.OverlayMarkDef(size=70)).encode(
            x=alt.X("pair:Q", title="pair i (features i and i + d/2)", axis=alt.Axis(tickMinStep=1, format="d")),
            y=alt.Y("wavelength:Q", title=["wavelength (positions", "per full turn, log scale)"], scale=alt.Scale(type="log")),
            color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=400),
                            scale=alt.Scale(domain=[ropes, ours], range=[colour("rope"), colour(method)])),
            strokeWidth=alt.StrokeWidth("series:N", legend=None, scale=alt.Scale(domain=[ropes, ours], range=[1.5, 4])),
            tooltip=[alt.Tooltip("series:N"), alt.Tooltip("pair:Q"), alt.Tooltip("wavelength:Q", format=",.1f")])
        band = alt.Chart(still).mark_rect(opacity=0.15, color="gray").encode(
            x=alt.X("start:Q"), x2=alt.X2("end:Q"),
            tooltip=[alt.Tooltip("pair:Q"), alt.Tooltip("plain_wavelength:Q", title="RoPE's wavelength", format=",.1f")]
        ).transform_calculate(start="datum.pair - 0.5", end="datum.pair + 0.5")
        marks = pd.DataFrame({"y": [shape.train_length], "label": [f"training length {shape.train_length:,}"]})
        rule = alt.Chart(marks).mark_rule(strokeDash=[5, 4], color="gray").encode(y=alt.Y("y:Q"))
        return (band + line + rule).properties(height=300), table

    chart(VIEW, ("p-rope-pairs", method, tuple(sorted(options.items())), shape.head_dim), build, f"{method}_pairs",
          "Shaded: pairs that stand still (frequency 0, no wavelength). Dashed: the training length; a pair above it "
          "completes less than one turn within it.")
