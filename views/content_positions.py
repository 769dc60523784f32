"""Positions from content: FoX, CoPE and stick-breaking on the visitor's own text."""
import hashlib

import streamlit as st

from posviz.explore import content_positions
from posviz.models.checkpoint_files import shipped_checkpoints
from posviz.display import display_name
from views._checkpoints import shipped_lab_model
from views._explore import kept
from views._matrices import show_matrix
from views._page import error_box, page_header
from views._sections import ContentPage, sections_for
from views._text import choose_text
from views._url import qp_choice, qp_int, sync_url

VIEW = "content"

page_header(
    "Positions from content",
    "Every other method puts position in by a rule of the index: a vector, a rotation or a bias per distance. "
    "These let the text decide what counts as far. FoX (Lin et al. 2025) forgets at a gate each byte sets; CoPE "
    "(Golovneva et al. 2024) counts only the keys its gates let through; stick-breaking attention (Tan et al. "
    "2025) gives the nearest key that fires its share first, with no softmax and no position at all, and what no "
    "earlier key takes to the byte itself; PaTH (Yang et al. 2025) turns every key by one Householder step per byte "
    "between it and the query, so distance is what lies between. Pick a "
    "checkpoint, a layer and a head, and see what it computed on your text.",
)

methods = content_positions.content_methods()
on_disk = shipped_checkpoints()
available = [m for m in methods if m in on_disk]
if not available:
    st.info(f"No checkpoint of {', '.join(map(display_name, methods))} in models/. Train one with `python -m posviz.train --method "
            f"{methods[0] if methods else 'fox'}` (or `make checkpoints`), then reload.")
    st.stop()

controls = st.columns([2, 1, 1, 2])
checkpoint = controls[0].selectbox("Checkpoint", available, format_func=display_name, index=available.index(qp_choice("model", available[0], available)),
                                   key="w_model", help="Checkpoints trained with the shared recipe whose method reads content.")
model, problem = shipped_lab_model(checkpoint)
if model is None:
    error_box(RuntimeError(problem))
    st.stop()


def index_slider(where, label: str, count: int, url_key: str) -> int:
    """A slider over 0..count-1 (a model of one layer or head has nothing to pick: 0)."""
    if count < 2:
        return 0
    return where.slider(label, 0, count - 1, qp_int(url_key, 0, 0, count - 1), key=f"w_{url_key}")


layer = index_slider(controls[1], "Layer", model.n_layer, "layer")
head = index_slider(controls[2], "Head", model.n_head, "head")
limit = min(content_positions.MAX_BYTES, model.train_length)
lowest = max(2, min(32, limit // 2))
n_bytes = controls[3].slider("Bytes shown", lowest, limit, qp_int("n", min(128, limit), lowest, limit),
                             step=16 if (limit - lowest) % 16 == 0 else 1, key="w_n",
                             help=f"The opening of the text, at most one training length ({model.train_length} bytes).")
sync_url(model=checkpoint, layer=layer, head=head, n=n_bytes)

text = choose_text()
if text is None:
    st.stop()
ids = text.ids[:n_bytes]
if ids.numel() < 2:
    st.warning("The text is too short: give at least two bytes.", icon="⚠️")
    st.stop()
digest = hashlib.sha256(bytes(ids.tolist())).hexdigest()[:16]
key = (checkpoint, model.key, digest, int(ids.numel()), layer)
with st.spinner(f"Running {display_name(checkpoint)} on {ids.numel()} bytes…"):
    view = kept(VIEW, "layer", key, lambda: content_positions.layer_view(model.net, ids, layer))
chars = [chr(b) if 32 <= b < 127 or b in (9, 10) else "·" for b in view.ids.tolist()]

st.header(f"Attention of head {head}, layer {layer}")
st.caption("Left: the weights the method gives. Right: a plain softmax of the very same queries and keys, with "
           "neither the method's bias nor its normalisation: the difference is what the content-computed positions do.")
left, right = st.columns(2)
with left:
    show_matrix(view.weights[head], f"{checkpoint}_weights_L{layer}_H{head}", "key j", "query i", "weight",
                key=key + ("weights", head),
                says=lambda: content_positions.near_weight_sentence(view.weights[head], view.softmax[head], display_name(checkpoint),
                                                           layer, head))
with right:
    show_matrix(view.softmax[head], f"{checkpoint}_softmax_L{layer}_H{head}", "key j", "query i", "softmax weight",
                key=key + ("softmax", head))

page = ContentPage(view, checkpoint, layer, head, chars, key)
for found, method in sections_for("content"):
    if method == model.method:
        found.draw(page, method)
