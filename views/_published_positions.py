"""The published models a deployer lists in ``$POSVIZ_MODELS``, as the explore pages show their position
parameters: which of them fit a page, a chooser among those, an error box for each that cannot be
opened, and their numbers worked out once per server. Nothing is drawn, imported or loaded while
``$POSVIZ_MODELS`` is empty: the pages then look exactly as they do without published models.
"""
from __future__ import annotations


import streamlit as st

from posviz.errors import PosvizError
from posviz.limits import CACHE_ENTRIES
from views._page import error_box
from views._url import qp_choice, sync_url

PAGES = {"learned": "Sinusoidal & learned", "rope": "RoPE", "alibi": "Attention biases"}
FIX = "Fix or remove it in $POSVIZ_MODELS; the rest of this page works without it."


def listed() -> list[str]:
    """The refs of $POSVIZ_MODELS (posviz.models.hf.settings imports nothing heavy)."""
    from posviz.models.hf.settings import deployer_models

    return deployer_models()


def published_section(method: str, header: str, intro: str):
    """The header of a page's section on the published models whose position method is ``method``, an
    error box for each listed model that cannot be opened, and a chooser when more than one fits.

    Returns the chosen model (a ``PublishedModel``), or None: nothing listed (nothing drawn at all),
    or nothing that fits (a notice says so).
    """
    refs = listed()
    if not refs:
        return None
    from posviz.models.interface import open_model

    st.header(header)
    st.caption(intro)
    from views._models import described_without_download

    fits, others = {}, []
    waiting = [ref for ref in refs if not described_without_download(ref)]
    for ref in refs:
        if ref in waiting:  # nothing of a hub model is fetched for a page nobody picked it on
            continue
        try:
            model = open_model(ref)
        except PosvizError as exc:
            error_box(PosvizError(f"Published model {ref!r} cannot be opened: {exc}"), FIX)
            continue
        if model.stored_metrics():  # our checkpoints come with the metrics they were evaluated on
            error_box(PosvizError(f"{ref!r} in $POSVIZ_MODELS is one of posviz's own checkpoints, not a published "
                                  "model: the sections above show the shipped checkpoints."), FIX)
            continue
        label = model.name if model.name not in fits else model.ref
        if model.method == method:
            fits[label] = model
        else:
            others.append(f"{label} ({model.method}: on the {PAGES[model.method]} page)" if model.method in PAGES
                          else f"{label} ({model.method}: no position parameters to draw)")
    if others:
        st.caption("Also listed: " + "; ".join(others) + ".")
    if waiting:
        st.caption("Listed but not fetched yet (a model is fetched when a visitor picks it in a live lab, and then "
                   "drawn here too): " + ", ".join(waiting) + ".")
    if not fits:
        st.info(f"None of the published models in $POSVIZ_MODELS uses {method} positions.", icon="ℹ️")
        return None
    names = list(fits)
    if len(names) == 1:
        return fits[names[0]]
    choice = st.selectbox("published model", names, index=names.index(qp_choice("pub", names[0], names)), key="pub",
                          help="The published models of $POSVIZ_MODELS whose position method this section draws.")
    sync_url(pub=choice)
    return fits[choice]


@st.cache_data(max_entries=CACHE_ENTRIES, show_spinner="Reading the published model's positions…")
def _analysis(what: str, key: tuple, _compute):
    return _compute()


def analysed(model, what: str, compute):
    """``compute()`` (the numbers a section shows of ``model``), once per server for the model as it is
    on disk (its key holds its files' stamps, or its hub id)."""
    return _analysis(what, model.key, compute)


def section_failed(model, exc: PosvizError) -> None:
    """An error box for a published model whose parameters cannot be read (e.g. its weights)."""
    error_box(PosvizError(f"Published model {model.name!r} cannot be shown: {exc}"), FIX)
