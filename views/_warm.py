"""The server's warm-up visit: it opens every page once, as a new visitor with default settings does.

A lab computes its default view for whoever opens it first, and keeps it in the server's shared store
(``posviz.serving``) for everyone after. The warm-up makes the server that first visitor: a session of
its own on its own WebSocket, the same messages a browser sends, so every page's default view is stored
under exactly the keys a visitor's run asks for (the page script itself computes them; nothing here
knows what a page shows). Its computations go to the back of the server's queue (``WARM_HEADER``):
a visitor's computation always starts before the next one of the warm-up.

Only the Streamlit wire protocol lives here; what to warm and when is ``_serving.warm_the_store``.
"""
from __future__ import annotations

import time

WARM_HEADER = "X-Posviz-Warm"  # sent by the warm-up's own session: its work is background work


def server_stream_url(address: str | None, port: int, base_path: str | None) -> str:
    """The WebSocket URL of this server's own stream, reached from inside the machine: a wildcard or
    empty listen address is reached on the loopback interface."""
    host = address if address and address not in ("0.0.0.0", "::", "localhost") else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    base = "/".join(part for part in (base_path or "").split("/") if part)
    return f"ws://{host}:{port}/{base + '/' if base else ''}_stcore/stream"


def visit(stream_url: str, page: str, timeout_s: float = 300.0) -> str:
    """Open ``page`` (its URL path, "" for the home page) at its defaults in a new session and wait
    until its script has finished; returns how it finished ("ok", or Streamlit's status name).

    Raises ``TimeoutError`` when it takes longer than ``timeout_s`` and ``OSError`` when the server
    cannot be reached.
    """
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from websockets.sync.client import connect

    request = BackMsg()
    request.rerun_script.page_name = page
    request.rerun_script.query_string = ""
    deadline = time.monotonic() + timeout_s
    with connect(stream_url, subprotocols=["streamlit"], additional_headers={WARM_HEADER: "1"},
                 open_timeout=30, max_size=None) as socket:
        socket.send(request.SerializeToString())
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"page {page or '/'!r} did not finish within {timeout_s:.0f} s")
            message = ForwardMsg()
            message.ParseFromString(socket.recv(timeout=left))
            if message.WhichOneof("type") == "script_finished":
                status = message.script_finished
                if status == ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY:
                    continue  # a fragment of the page reran; the page's own run is still going
                return "ok" if status == ForwardMsg.FINISHED_SUCCESSFULLY else ForwardMsg.ScriptFinishedStatus.Name(status)
