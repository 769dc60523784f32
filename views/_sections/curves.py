"""The Attention biases page's own section: the bias by distance of every registered method whose bias is
a curve of distance (``PositionMethod.bias_by_distance``), from its checkpoint, or from its formula when
it learns nothing. A new method's curve, and its most lenient head in the side-by-side comparison, show
up here without a line about it."""
import pandas as pd
import streamlit as st

from posviz.explore import attention_biases
from posviz.positions import POSITION_METHODS
from views._bias_charts import method_curves_chart
from views._checkpoints import shipped_lab_model
from views._explore import chart, kept, rerun_page_if_changed
from views._sections import BiasPage, section
from views._url import qp_choice, qp_int, sync_url
from posviz.display import display_name

VIEW = "biases"
MULTIPLES = [1, 4, 16]
FIXED_HEAD_DIM = 32  # head size a formula-only method is built with: its curve does not depend on it


@section("bias-curves", "biases", order=40, always=True)
def curves_section(page: BiasPage, method: str | None) -> None:
    st.header("Learned curves of distance: KERPLE and FIRE next to ALiBi and T5")
    st.markdown(
        "**KERPLE** (log variant) learns −r1·log(1 + r2·d) per head and layer: a penalty that grows like a logarithm, "
        "so far keys are pushed down much less than by ALiBi's straight line. **FIRE** learns any curve, per head and layer: "
        "a small MLP of ψ(d)/ψ(max(L, i)) with ψ(x) = log(c·x + 1), so every distance a query can see is squeezed into [0, 1] "
        "whatever the length. Below, each checkpoint's own bias for the last query of a context, up to 16× the "
        "training length: distances the models never saw in training."
    )
    _curves(page)


def _positions(page: BiasPage) -> tuple[dict, list[str]]:
    """{method: (its PositionMethod, the key its numbers are kept under)} of every method drawn as a curve,
    and the learned ones without a checkpoint."""
    positions, missing = {}, []
    for name in attention_biases.distance_only_bias_methods():
        model, _ = shipped_lab_model(name)
        if model is not None:
            positions[name] = (model.position, tuple(model.key))
        elif not POSITION_METHODS[name].learned:  # nothing to learn: the formula is the method
            positions[name] = (attention_biases.fixed_method(name, page.n_layer, page.n_head, FIXED_HEAD_DIM,
                                                             page.train_length),
                               ("formula", name, page.n_layer, page.n_head, page.train_length))
        else:
            missing.append(name)
    return positions, missing


@st.fragment
def _curves(page: BiasPage) -> None:
    train_length = page.train_length
    c1, c2 = st.columns(2)
    multiple = c1.select_slider("context (× training length)", MULTIPLES,
                                value=int(qp_choice("cmult", "16", [str(m) for m in MULTIPLES])), key="cmult",
                                format_func=lambda m: f"{m}× = {m * train_length:,} bytes")
    curve_layer = c2.slider("layer", 0, page.n_layer - 1, min(qp_int("clayer", 0, 0, 63), page.n_layer - 1), key="clayer",
                            help="KERPLE and FIRE learn one curve per head and layer; ALiBi and T5 use the same in every layer.")
    sync_url(cmult=multiple, clayer=curve_layer)
    page.handed_on["curves"] = (curve_layer, multiple, MULTIPLES)  # FIRE's section draws the same layer and context
    positions, missing = _positions(page)
    if missing:
        st.info(f"No checkpoint yet for {', '.join(map(display_name, missing))}: its learned curve is not drawn. "
                "Train one with `python -m posviz.train --method NAME`, or run `make checkpoints`.", icon="ℹ️")
    n_curve = multiple * train_length
    layers = {name: min(curve_layer, position.shape.n_layer - 1) for name, (position, _) in positions.items()}
    if positions:
        def build():
            frames = [kept(VIEW, "curves", (name, key, layers[name], n_curve), lambda p=position, n=name: pd.DataFrame(
                attention_biases.bias_curves(p, [layers[n]], [n_curve])).assign(method=display_name(n)))
                for name, (position, key) in positions.items()]
            curves = pd.concat(frames, ignore_index=True)
            curves["series"] = curves["method"] + " · head " + curves["head"].astype(str)
            return method_curves_chart(curves, [display_name(n) for n in positions], n_curve, train_length)

        curves = tuple((name, key, layers[name]) for name, (_, key) in positions.items())
        chart(VIEW, ("bias-curves", n_curve) + curves, build, f"bias_curves_layer{curve_layer}_n{n_curve}",
              f"One line per head. Dashed: the farthest distance seen in training ({train_length - 1:,}); to its right "
              "the learned functions extrapolate. ALiBi keeps falling in a straight line (on a log axis: a steep "
              "curve), T5 goes flat after its last bucket, KERPLE bends over like a logarithm, FIRE stays inside "
              "what it learned because its input never leaves [0, 1].")
    n_keys, margin = page.n_keys, page.margin
    for name, (position, key) in positions.items():  # the side-by-side comparison below: one line per method
        if name in page.summarised:
            continue  # its own section put it there already
        layer = layers[name]
        page.summary[f"{display_name(name)}, most lenient head of layer {layer}"] = kept(
            VIEW, "curve-bound", (name, key, layer, n_keys, margin), lambda p=position, l=layer: attention_biases.strongest_head(
                attention_biases.log_max_attention_weight(attention_biases.bias_by_distance(p, l, n_keys), margin)))
    rerun_page_if_changed("curves", (curve_layer, multiple))  # the comparison and FIRE's section use them
