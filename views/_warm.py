"""A visitor that speaks Streamlit's own WebSocket protocol and draws nothing.

The server is its own first visitor (``_serving.warm_the_store``): ``ProtocolSession`` opens a page in a
session of its own and moves its widgets with the messages a browser sends (the widget ids the page
announced, the hashes of the messages it already holds), so every page computes and stores its default
view, and the next stops of its main slider, under exactly the keys a visitor's run asks for: nothing
here knows what a page shows. The warm-up's computations go to the back of the server's queue
(``WARM_HEADER``): a visitor's computation always starts before the next one of the warm-up.

The load driver (``posviz_tools.loadtest``) sends crowds of the same sessions: drawing nothing, they
measure the server, not a browser on the same cores. An answer ends at the run's ``script_finished``
(a fragment's own run included); it is an error when the page drew an exception box or the run did not
finish successfully.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

WARM_HEADER = "X-Posviz-Warm"  # sent by the warm-up's own session: its work is background work
# What a session drags, in this order of preference; a page with none of these has at least the
# sidebar's presentation-mode toggle (a checkbox).
MOVABLE = ("slider", "selectbox", "radio", "checkbox")


def server_stream_url(address: str | None, port: int, base_path: str | None) -> str:
    """The WebSocket URL of this server's own stream, reached from inside the machine: a wildcard or
    empty listen address is reached on the loopback interface."""
    host = address if address and address not in ("0.0.0.0", "::", "localhost") else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    base = "/".join(part for part in (base_path or "").split("/") if part)
    return f"ws://{host}:{port}/{base + '/' if base else ''}_stcore/stream"




def _label(element) -> str:
    return getattr(element, "label", "") or ""


@dataclass
class Widget:
    id: str
    kind: str  # the element's proto field: "slider", "selectbox", "radio", "multiselect", ...
    label: str
    options: list[str]  # formatted options, where the widget has them
    fragment_id: str  # the fragment the widget belongs to ("" for the page)
    value: object = None  # what it shows: an option's text, or a number for a plain slider
    numbers: tuple = ()  # a plain slider's first stops from its value: value, value + step, value + 2 steps


def _describe(kind: str, inner, fragment_id: str) -> Widget:
    options = [str(o) for o in getattr(inner, "options", [])]
    default = getattr(inner, "default", None)
    value, numbers = None, ()
    if kind == "slider" and options:  # a select slider: its default holds option indices
        value = options[int(default[0])] if len(default) and int(default[0]) < len(options) else options[0]
    elif kind == "slider":
        start, step, top = float(default[0]) if len(default) else inner.min, inner.step or 1, inner.max
        numbers = tuple(v for v in (start, start + step, start + 2 * step) if v <= top) or (start,)
        value = start
    elif kind == "checkbox":
        value = bool(inner.default)
    elif kind in ("selectbox", "radio") and options:
        value = options[default] if isinstance(default, int) and 0 <= default < len(options) else options[0]
    return Widget(inner.id, kind, _label(inner), options, fragment_id, value, numbers)


@dataclass
class Answer:
    seconds: float  # from the request to the end of the run
    status: str  # "ok" or Streamlit's status name
    exceptions: list[str] = field(default_factory=list)  # texts of exception boxes drawn
    texts: list[str] = field(default_factory=list)  # what the run wrote: headings, Markdown, captions, alerts
    alerts: list[str] = field(default_factory=list)  # of which the error boxes
    progress: list[str] = field(default_factory=list)  # the texts of the progress bars the run drew (a computation)
    html: list[str] = field(default_factory=list)  # Markdown sent to be drawn as HTML (unsafe_allow_html)
    messages: int = 0  # ForwardMsgs received
    bytes: int = 0  # their size on the wire

    @property
    def ok(self) -> bool:
        return self.status == "ok" and not self.exceptions


class ProtocolSession:
    """One visitor of one page (see the module docstring). Use as a context manager."""

    def __init__(self, stream_url: str, page: str, query_string: str = "", timeout_s: float = 120.0,
                 headers: dict | None = None):
        self.stream_url, self.page, self.query_string = stream_url, page, query_string
        self.timeout_s, self.headers = timeout_s, headers or {}
        self.widgets: dict[str, Widget] = {}  # by label
        self.cached: set[str] = set()  # hashes of cacheable messages received, which the server may refer to
        self.socket = None

    def __enter__(self) -> "ProtocolSession":
        from contextlib import ExitStack

        from websockets.sync.client import connect

        self._stack = ExitStack()
        self.socket = self._stack.enter_context(connect(self.stream_url, subprotocols=["streamlit"], open_timeout=30,
                                                        additional_headers=self.headers, max_size=None))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def open(self) -> Answer:
        """Run the page at the link's settings, as a new tab does."""
        return self._run(self._request())

    def move(self, label: str, value) -> Answer:
        """Set the widget labelled ``label`` to ``value`` (an option's text for a select slider, a select
        box or a radio; a number for a slider) and wait for the rerun it causes."""
        widget = self.widgets.get(label)
        if widget is None:
            raise KeyError(f"no widget labelled {label!r} on {self.page!r}; seen: {sorted(self.widgets)}")
        request = self._request(widget.fragment_id)
        state = request.rerun_script.widget_states.widgets.add()
        state.id = widget.id
        if widget.kind == "slider" and widget.options:  # a select slider: its options' texts
            state.string_array_value.data.append(str(value))
        elif widget.kind == "slider":
            state.double_array_value.data.append(float(value))
        elif widget.kind == "multiselect":
            state.string_array_value.data.extend(str(v) for v in value)
        elif widget.kind in ("selectbox", "radio"):
            state.string_value = str(value)
        elif widget.kind == "checkbox":
            state.bool_value = bool(value)
        elif widget.kind == "text_input":
            state.string_value = str(value)
        elif widget.kind == "button":  # a press: a trigger that is true for this one run
            state.trigger_value = True
        else:
            raise ValueError(f"moving a {widget.kind} is not supported")
        return self._run(request)

    def press(self, label_start: str) -> Answer:
        """Press the button whose label starts with ``label_start``, as a click does."""
        labels = [label for label, w in self.widgets.items() if w.kind == "button" and label.startswith(label_start)]
        if not labels:
            raise KeyError(f"no button labelled {label_start!r}… on {self.page!r}; seen: {sorted(self.widgets)}")
        return self.move(labels[0], True)

    def rerun(self, fragment_id: str = "") -> Answer:
        """Run the page again with nothing changed, or only the fragment ``fragment_id`` (as its timer does in a
        browser)."""
        return self._run(self._request(fragment_id))

    # ---------------------------------------------------------------------------------------------
    def _request(self, fragment_id: str = ""):
        from streamlit.proto.BackMsg_pb2 import BackMsg

        request = BackMsg()
        request.rerun_script.page_name = self.page
        request.rerun_script.query_string = self.query_string
        request.rerun_script.fragment_id = fragment_id
        request.rerun_script.cached_message_hashes.extend(sorted(self.cached))
        return request

    def _run(self, request) -> Answer:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        start = time.perf_counter()
        self.socket.send(request.SerializeToString())
        deadline = time.monotonic() + self.timeout_s
        answer = Answer(0.0, "running")
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.page or '/'}: no answer within {self.timeout_s:.0f} s")
            raw = self.socket.recv(timeout=left)
            message = ForwardMsg()
            message.ParseFromString(raw)
            answer.messages += 1
            answer.bytes += len(raw)
            if message.metadata.cacheable and message.hash:
                self.cached.add(message.hash)
            kind = message.WhichOneof("type")
            if kind == "delta":
                self._read_delta(message.delta, answer)
            elif kind == "page_not_found":
                answer.status = "page_not_found"
            elif kind == "script_finished":
                status = message.script_finished
                if status in (ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY):
                    answer.status = "ok" if answer.status == "running" else answer.status
                else:
                    answer.status = ForwardMsg.ScriptFinishedStatus.Name(status)
                answer.seconds = time.perf_counter() - start
                return answer

    def _read_delta(self, delta, answer: Answer) -> None:
        if delta.WhichOneof("type") != "new_element":
            return
        element = delta.new_element
        kind = element.WhichOneof("type")
        if kind == "exception":
            answer.exceptions.append(f"{element.exception.type}: {element.exception.message}")
            return
        if kind in ("markdown", "heading", "alert"):
            answer.texts.append(getattr(element, kind).body)
            if kind == "markdown" and element.markdown.allow_html:
                answer.html.append(element.markdown.body)
            if kind == "alert" and element.alert.format == element.alert.ERROR:
                answer.alerts.append(element.alert.body)
        elif kind == "progress":  # sent even when the run replaces it before a browser could draw it
            answer.texts.append(element.progress.text)
            answer.progress.append(element.progress.text)
        inner = getattr(element, kind, None) if kind else None
        widget_id = getattr(inner, "id", "") if inner is not None else ""
        if widget_id and _label(inner):
            self.widgets[_label(inner)] = _describe(kind, inner, delta.fragment_id)


# A page whose main widget is not its first slider says which it is (the start of its label): the KV cache
# lab's first slider only redraws a diagram; its window is what a visitor drags.
MAIN_WIDGETS = {"kv-cache": "Window W"}


def main_widget(session: ProtocolSession, label: str | None = None) -> Widget | None:
    """The widget a visitor drags: the one labelled (at its start) ``label``, else the page's own
    (``MAIN_WIDGETS``), else its first select slider or slider, then select box, radio, checkbox; None when
    the page has none."""
    widgets = list(session.widgets.values())
    label = label if label is not None else MAIN_WIDGETS.get(session.page)
    if label is not None:
        return next((w for w in widgets if w.label.startswith(label)), None)
    for kind in MOVABLE:
        for w in widgets:
            if w.kind == kind and (w.options or kind in ("slider", "checkbox")):
                return w
    return None


def next_stops(widget: Widget, count: int = 3) -> list:
    """The value ``widget`` shows and the ones after it, ``count`` in all: the stops a crowd drags it
    through (back and forth, so each setting is computed once)."""
    if widget.kind == "checkbox":
        return [bool(widget.value), not widget.value]
    if widget.options:
        at = widget.options.index(widget.value) if widget.value in widget.options else 0
        picks = widget.options[at:at + count] if at + count <= len(widget.options) else widget.options[-count:]
        return picks if len(picks) > 1 else widget.options[:count]
    return list(widget.numbers)[:count]


def visit(stream_url: str, page: str, drag: int = 0, timeout_s: float = 300.0) -> str:
    """Open ``page`` (its URL path, "" for the home page) at its defaults in a new session of the
    warm-up and wait until its script has finished; then move its main widget to each of the ``drag``
    stops after its default. Returns "ok", or how a run did not finish.

    Raises ``TimeoutError`` when a run takes longer than ``timeout_s`` and ``OSError`` when the server
    cannot be reached.
    """
    with ProtocolSession(stream_url, page, timeout_s=timeout_s, headers={WARM_HEADER: "1"}) as session:
        answer = session.open()
        widget = main_widget(session) if drag else None
        for value in (next_stops(widget, drag + 1)[1:] if widget is not None and answer.status == "ok" else []):
            answer = session.move(widget.label, value)
            if answer.status != "ok":
                break
        return answer.status
