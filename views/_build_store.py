"""``python -m views._build_store``: the result files built ahead (``make store``, the Docker image's build): the app
started as the README does, its first visit made (which starts its warm-up, ``views._warm``), every page's default
view and the Workshop's examples computed into the store, the server stopped. Its own module: the warm-up itself
(``views._warm``) imports nothing of the Workshop's, whose store it fills from here."""
from __future__ import annotations

import time

from views._warm import WARM_HEADER, ProtocolSession, server_stream_url

DEFAULTS_DONE = "posviz: warm-up: every page's default view computed"  # printed by views/_serving.warm_the_store
WARM_DONE = "posviz: warm-up done"


def build_store(port: int = 0, timeout_s: float = 1800.0, defaults_only: bool = False) -> int:
    """Start the app as the README does, make its first visit (which starts its warm-up), wait until the
    warm-up has finished (or, with ``defaults_only``, has computed every page's default view) and stop
    it: everything the warm-up computed is then in the result files (``$POSVIZ_STORE``, else
    ``.posviz-store/``), and the next server to start answers each page's default link without
    computing it. Returns the server's exit status, 0 when the warm-up finished."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "POSVIZ_WARM"}
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
               "--server.address", "127.0.0.1"]
    server = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wanted = DEFAULTS_DONE if defaults_only else WARM_DONE
    start, status = time.monotonic(), 1
    try:
        url = server_stream_url("127.0.0.1", port, None)
        while True:  # the server is up once its stream accepts a session
            try:
                with ProtocolSession(url, "", headers={WARM_HEADER: "1"}, timeout_s=timeout_s) as session:
                    session.open()  # the first visit starts the warm-up
                break
            except OSError:
                if server.poll() is not None or time.monotonic() - start > 120:
                    raise
                time.sleep(0.5)
        for line in server.stdout:
            print(line, end="", flush=True)
            if line.startswith(wanted):
                status = 0
                break
            if time.monotonic() - start > timeout_s:
                break
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"posviz: result files {'built' if status == 0 else 'NOT complete'} in {time.monotonic() - start:.0f} s",
          flush=True)
    return status


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Compute every page's default view into the result files, and the "
                                                 "Workshop's examples into its store of runs, ahead.")
    parser.add_argument("--defaults-only", action="store_true", help="stop once every page's default view is "
                        "computed (without the slider stops the warm-up goes on to)")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--no-workshop", action="store_true", help="without the Workshop's six examples, whose quick "
                        "runs are trained into the store after the pages (about 3 minutes each on 2 cores)")
    args = parser.parse_args()
    status = build_store(timeout_s=args.timeout, defaults_only=args.defaults_only)
    if not args.no_workshop:
        from views._workshop import train_examples_ahead

        status = status or train_examples_ahead()
    sys.exit(status)
