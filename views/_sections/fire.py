"""FIRE's section of the Attention biases page: the normalised distance its MLP reads, and the checkpoint's
curves per head in the layer the curves section shows."""
from posviz.display import display_name
import pandas as pd
import streamlit as st

from posviz.explore import attention_biases
from posviz.positions.fire import THRESHOLD_FRACTION, FireOptions
from views._bias_charts import head_curves_chart, normalised_distance_chart
from views._checkpoints import shipped_lab_model
from views._explore import chart, kept
from views._sections import BiasPage, section

VIEW = "biases"


@section("fire-input", "biases", order=60)
def input_section(page: BiasPage, method: str) -> None:
    st.subheader("FIRE's input: every context squeezed into [0, 1]")
    curve_layer, multiple, multiples = page.handed_on.get("curves", (0, 16, [1, 4, 16]))
    train_length = page.train_length
    model, problem = shipped_lab_model(method)
    key = None if model is None else tuple(model.key)
    fire_layer = min(curve_layer, model.n_layer - 1) if model is not None else curve_layer
    facts = None if model is None else kept(VIEW, "fire-learned", key, lambda: pd.DataFrame(attention_biases.fire_learned(model)))
    if facts is not None:
        c_value, threshold = facts["c"][fire_layer], facts["threshold"][fire_layer]
    else:  # the paper's c, and L at a quarter of the training length (FIRE's own defaults)
        c_value, threshold = FireOptions().c_init, THRESHOLD_FRACTION * train_length

    def normalised():
        norm_df = pd.DataFrame(attention_biases.fire_normalised_distance([m * train_length for m in multiples],
                                                                         c_value, threshold))
        norm_df["context"] = norm_df["context"].map(lambda n: f"{n:,} bytes ({n // train_length}×)")
        return normalised_distance_chart(norm_df, multiples[-1] * train_length)

    chart(VIEW, ("fire-normalised", float(c_value), float(threshold), train_length, tuple(multiples)), normalised,
          "fire_normalised_distance",
          f"c = {c_value:.3g}, L = {threshold:,.0f} ({f'layer {fire_layer} of the {display_name(method)} checkpoint' if facts is not None else 'FIRE’s initial values: no FIRE checkpoint'}). "
          "Queries before L all use ψ(L); past it the farthest key always maps to 1, so a long context never asks the MLP "
          "about an input it has not seen: it reads far keys as 'about as far as anything I saw'.")
    if model is None:
        st.warning(problem, icon="⚠️")
        return
    st.markdown(f"**What the {display_name(method)} checkpoint learned in layer {fire_layer}**: one curve per head (the layer slider above "
                "picks the layer). Heads that differ are what lets one head look far while another stays local.")
    position = model.position

    def heads():
        curves = pd.DataFrame(attention_biases.bias_curves(position, [fire_layer], [train_length, multiple * train_length]))
        curves["context"] = curves["context"].map(lambda n: f"{n:,} bytes ({n // train_length}×)")
        curves["head"] = "head " + curves["head"].astype(str)
        return head_curves_chart(curves, multiple * train_length)

    least, most = kept(VIEW, "fire-far", key + (fire_layer, train_length), lambda: attention_biases.far_bias_by_head(
        attention_biases.bias_by_distance(position, fire_layer, train_length)))  # (H, n) -> spread at the far end
    chart(VIEW, ("fire-heads", fire_layer, multiple, train_length) + key, heads, f"fire_heads_layer{fire_layer}",
          f"At {train_length - 1:,} bytes, the farthest distance seen in training, the heads of layer {fire_layer} add "
          f"from {least:.1f} to {most:.1f} logits: a gentle head lets a far copy through, a steep one stays local. "
          "Solid and dashed: the same last query at two context lengths, its distances normalised by ψ of its position.")
    st.dataframe(facts.rename(columns={"threshold": "L (learned)", "threshold_init": "L at start"}), hide_index=True)
