"""The live labs' text: the chooser (a held-out validation document or pasted text) and text drawn
with each character coloured by its value (e.g. loss in bits).
"""
from __future__ import annotations

from typing import Sequence

import streamlit as st

from posviz.errors import PosvizError
from views._page import error_box
from views._url import qp_choice, qp_int, sync_url


@st.cache_data(max_entries=4, show_spinner="Reading the held-out validation documents…")
def validation_documents() -> list[bytes]:
    """The long held-out validation documents (never seen in training)."""
    from posviz.training.data import load_corpus

    return list(load_corpus().eval_documents)


@st.cache_data(max_entries=4, show_spinner=False)
def _document_labels(n: int) -> list[str]:
    from posviz.labs.inputs import document_label

    return [document_label(i, d) for i, d in enumerate(validation_documents())]


def choose_text(where=None, default_doc: int = 0):
    """A text picker: a held-out validation document (in the URL as ``doc``) or pasted text.

    Returns a ``posviz.labs.inputs.TextInput``, or None after showing why there is no usable text (the
    caller then stops). Pasted text is not put in the URL (it can be 64 kB); the choice of
    document is. Notices (cut to the cap, control bytes) are shown as info boxes.
    """
    from posviz.labs.inputs import prepare_text
    from posviz.limits import MAX_TEXT_BYTES

    where = where or st
    documents = validation_documents()
    sources = ["doc", "paste"] if documents else ["paste"]
    source = where.radio("Text", sources, index=sources.index(qp_choice("src", sources[0], sources)),
                         format_func={"doc": "Held-out document", "paste": "Paste text"}.get, horizontal=True,
                         key="w_src", help="Validation documents are Python standard-library files kept out of training.")
    if source == "doc":
        labels = _document_labels(len(documents))
        index = where.selectbox("Document", range(len(documents)), index=qp_int("doc", min(default_doc, len(documents) - 1),
                                0, len(documents) - 1), format_func=labels.__getitem__, key="w_doc")
        sync_url(src=source, doc=index)
        raw: bytes | str = documents[index]
    else:
        sync_url(src=source)
        raw = where.text_area(f"Paste text (at most {MAX_TEXT_BYTES:,} bytes are used; not stored in the link)",
                              key="w_paste", height=140, placeholder="def f(x):\n    return x + 1\n")
    try:
        text = prepare_text(raw)
    except PosvizError as exc:
        error_box(exc)
        return None
    for notice in text.notices:
        where.info(notice, icon="ℹ️")
    return text


LOSS_RAMP = [(255, 255, 255), (255, 237, 160), (254, 178, 76), (240, 59, 32), (189, 0, 38)]


def _loss_colour(value: float, top: float) -> str:
    if value != value:  # NaN: not scored (the first byte of the text: nothing predicts it)
        return "#e6e6e6"
    x = min(max(value / top, 0.0), 1.0) * (len(LOSS_RAMP) - 1)
    i = min(int(x), len(LOSS_RAMP) - 2)
    f = x - i
    r, g, b = (round(a * (1 - f) + c * f) for a, c in zip(LOSS_RAMP[i], LOSS_RAMP[i + 1]))
    return f"#{r:02x}{g:02x}{b:02x}"


def show_coloured_text(chars_with_values: Sequence[tuple[str, float]], top: float, unit: str = "bits",
                       height: int = 320, mark_at: int | None = None, mark_label: str = "",
                       missing: str = "not scored (nothing before it to predict from)") -> None:
    """Text with each character's background coloured by its value (e.g. loss in bits); see ``coloured_html``.
    ``missing``: what a grey (NaN) character means, "" where there is none."""
    st.html(coloured_html(chars_with_values, top, unit, height, mark_at, mark_label, missing))


def coloured_html(chars_with_values: Sequence[tuple[str, float]], top: float, unit: str = "bits",
                  height: int = 320, mark_at: int | None = None, mark_label: str = "",
                  missing: str = "not scored (nothing before it to predict from)") -> str:
    """The HTML of ``show_coloured_text``: a page that keeps it (``_serving.shared``) sends 4,096 coloured
    characters on a rerun without building them again.

    ``mark_at``: a bar before that character (e.g. where the context passes the training length),
    explained by ``mark_label`` under the text.

    Every character goes through ``html.escape`` before it reaches ``st.html``, so user text can
    never become markup; the only markup is our own spans with a colour and a numeric tooltip.
    """
    import html as _html

    spans = []
    for char, value in chars_with_values:
        tip = "not scored" if value != value else f"{value:.2f} {unit}"
        # a line break as <br>: the HTML is then one line, which st.html's dedent reads in no time (a
        # 4,096-character text of code took it 7 ms a run, line by line)
        shown = "<br>" if char == "\n" else _html.escape(char if char != "\r" else "", quote=True)
        if mark_at is not None and len(spans) == mark_at:
            spans.append('<span style="border-left:3px solid #d00;margin:0 1px"></span>')
        spans.append(f'<span style="background:{_loss_colour(value, top)}" title="{tip}">{shown}</span>')
    tick = ".0f" if top >= 4 else ".2f"  # bits run to several; a share (forgotten, kept) to 1
    legend = "".join(f'<span style="background:{_loss_colour(top * k / 4, top)};padding:0 .6em">'
                     f'{top * k / 4:{tick}}</span>' for k in range(5))
    return (
        f'<div style="font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem;line-height:1.45;'
        f'white-space:pre-wrap;word-break:break-all;max-height:{height}px;overflow-y:auto;border:1px solid #ddd;'
        f'border-radius:6px;padding:.6em;color:#111;background:#fff">{"".join(spans)}</div>'
        f'<div style="font-size:.8rem;color:#555;margin-top:.3em">{unit} per character: {legend} or more'
        + ("; " if missing else "")
        + (f'<span style="background:#e6e6e6;padding:0 .4em">grey</span> = {_html.escape(missing)}' if missing else "")
        + (f'; <span style="border-left:3px solid #d00;padding-left:.3em">red bar</span>: {_html.escape(mark_label)}'
           if mark_at is not None and mark_label else "") + '</div>'
    )
