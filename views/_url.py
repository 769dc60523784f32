"""URL query-string state: every widget reads its default from the URL and writes its value back, so a
link reproduces the view. Junk values fall back to the default with a notice under the page's title.
"""
from __future__ import annotations

from typing import Sequence

import streamlit as st


def notice_junk(key: str, raw: str, default, kept: str | None = None) -> None:
    """A notice under the page's title that the link's ``key`` was (partly) ignored, saying what the page uses
    instead: ``kept`` (in words) where part of it was kept, else the default."""
    # The value sits in a code span, so a link's text can never become Markdown (images, links, colours).
    shown = repr(raw[:40]).replace("`", "'")
    message = (f"Ignored URL parameter {key}=`{shown}` in part; kept {kept}." if kept is not None else
               f"Ignored URL parameter {key}=`{shown}`; using the default `{_in_words(default)}`.")
    slot = st.session_state.get("_url_notice_slot")
    if slot is None:  # before page_header has drawn the title: shown by page_header
        st.session_state.setdefault("_url_notices", []).append(message)
    elif _fragment_rerun():  # the slot under the title is outside the fragment: Streamlit refuses writes there
        st.warning(message, icon="⚠️")
    else:  # parameters read by the page body: shown right under the title, in this same run
        slot.warning(message, icon="⚠️")


def _in_words(value) -> str:
    """A default as the page shows it: a list by its display names ("RoPE, ALiBi"), not as registry ids."""
    from posviz.display import display_name

    if isinstance(value, (list, tuple)):
        return ", ".join(display_name(str(v)) for v in value) if value else "none"
    return repr(value).replace("`", "'")


def _fragment_rerun() -> bool:
    """Whether this run reruns a fragment alone (a widget inside it moved), not the whole page."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    return bool(ctx is not None and ctx.fragment_ids_this_run)


def qp_int(key: str, default: int, lo: int, hi: int) -> int:
    raw = st.query_params.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        notice_junk(key, raw, default)
        return default
    if not lo <= value <= hi:
        notice_junk(key, raw, default)
        return default
    return value


def qp_float(key: str, default: float, lo: float, hi: float) -> float:
    raw = st.query_params.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        notice_junk(key, raw, default)
        return default
    if not (lo <= value <= hi) or value != value:
        notice_junk(key, raw, default)
        return default
    return value


def qp_choice(key: str, default: str, options: Sequence[str]) -> str:
    raw = st.query_params.get(key)
    if raw is None:
        return default
    if raw not in options:
        notice_junk(key, raw, default)
        return default
    return raw


def qp_multi(key: str, default: Sequence[str], options: Sequence[str]) -> list[str]:
    raw = st.query_params.get_all(key)
    if not raw:
        return list(default)
    values = [r for part in raw for r in part.split(",") if r]
    if not values:  # "refs=": the page's own link for an empty selection (sync_url writes it so), not junk
        return []
    good = [v for v in values if v in options]
    if len(good) != len(values) or not good:
        dropped = len(values) - len(good)
        notice_junk(key, ",".join(values), list(default), None if not good else
                    f"{_in_words(good)} (dropped {dropped} value{'s' if dropped != 1 else ''} naming no choice here)")
        return list(default) if not good else good
    return good


def qp_bool(key: str, default: bool) -> bool:
    raw = st.query_params.get(key)
    if raw is None:
        return default
    if raw not in ("0", "1", "true", "false"):
        notice_junk(key, raw, default)
        return default
    return raw in ("1", "true")


def sync_url(**values) -> None:
    """Write the current widget values to the URL (lists comma-joined, booleans as 0/1)."""
    for key, value in values.items():
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        text = str(value)
        if st.query_params.get(key) != text:
            st.query_params[key] = text


def show_url_notices() -> None:
    """Notices so far, and a slot under the title for those of the parameters the page reads later."""
    slot = st.container()
    for message in st.session_state.pop("_url_notices", []):
        slot.warning(message, icon="⚠️")
    st.session_state["_url_notice_slot"] = slot
