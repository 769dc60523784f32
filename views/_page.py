"""The frame every page draws around its content: the title, the shared sidebar, presentation mode, the
URL notices, error boxes and the stop when no shipped checkpoint can be used.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from posviz.models.checkpoint_files import shipped_checkpoints
from posviz.errors import PosvizError
from posviz.limits import device_label
from views._checkpoints import VAL_BPB, VAL_BPB_HELP, checkpoint_summary
from views import _slide as slide
from views._quote import plain  # noqa: F401  (the pages import plain from here)
from views._url import show_url_notices

def page_header(title: str, intro: str, headline: str | None = None) -> None:
    """Title, intro, the shared sidebar, presentation mode (the page as a slide, ``views._slide``) and any URL
    notices. ``headline``: the start of the name of the chart the page's slide shows (else its first chart)."""
    st.session_state.pop("_url_notice_slot", None)  # the previous run's slot is gone
    if not slide.begin(title, intro, headline):
        st.sidebar.markdown(f"**Device:** {device_label()}")
        summary = checkpoint_summary()
        if summary.empty:
            st.sidebar.warning("No checkpoints found in models/. Run `make checkpoints` to train them.")
        else:
            st.sidebar.markdown("**Shipped checkpoints**")
            # Short header: the sidebar's default width cuts a longer one; the help says which text it scores.
            st.sidebar.dataframe(summary[["checkpoint", VAL_BPB]], hide_index=True, width="stretch", height="content",
                                 column_config={VAL_BPB: st.column_config.NumberColumn(
                                     "final bpb", format="%.3f", help=VAL_BPB_HELP)})
        st.title(title)
        st.caption(intro)
    show_url_notices()


NO_CHECKPOINTS = "No checkpoints found in models/. Run `make checkpoints` to train the shipped set, then reload."
REBUILD = "Rebuild it with `make checkpoints`; the other checkpoints keep working."


def usable_checkpoints(read) -> tuple[dict, dict]:
    """({name: folder}, {name: read(folder)}) for every shipped checkpoint ``read`` can open.

    Each one it cannot open gets an error box naming it and what to do; the page goes on with the
    rest, and stops with a notice when there is none at all.
    """
    checkpoints, facts = shipped_checkpoints(), {}
    if not checkpoints:
        st.warning(NO_CHECKPOINTS)
        st.stop()
    for name, folder in checkpoints.items():
        try:
            facts[name] = read(folder)
        except (PosvizError, KeyError) as exc:
            error_box(PosvizError(f"Checkpoint {name!r} cannot be loaded: {exc}"), REBUILD)
    if not facts:
        st.stop()
    return checkpoints, facts




def error_box(exc: Exception, what_next: str | None = None) -> None:
    """A bad-input message on the page; the app keeps running."""
    st.error(f"{exc}" + (f"\n\n{what_next}" if what_next else ""), icon="🚫")


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
