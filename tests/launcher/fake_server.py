"""A small real HTTP server with two child processes, supervised in tests.

Run as ``python tests/launcher/fake_server.py --port=N [options]``.  It
starts two children in its own process group (``python -c`` sleepers), writes
``{"server": pid, "children": [pid, pid]}`` to ``--pid-file`` and serves
``GET /health`` on 127.0.0.1.  Options make it misbehave on purpose:

* ``--ready-after=S``: /health answers 503 for the first S seconds;
* ``--never-ready``: /health always answers 503;
* ``--exit-after=S --exit-code=C``: exit with C after S seconds (children
  are left running, as a crashing server would leave them);
* ``--children-ignore-term``: the children ignore SIGTERM (so a drain must
  escalate to SIGKILL);
* ``--fail-before-listen=C``: exit with C immediately.

``--uds=PATH`` serves on a Unix socket instead of the port (as vLLM does
behind the teacher gateway); then ``POST /v1/completions`` answers a fixed
body, and ``--record=FILE`` appends each request's method, path and header
names as one JSON line.

Standard library only; it must stay importable by a bare interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLEEPER = "import signal, sys, time\n{ignore}\nwhile True:\n    time.sleep(1)\n"


def _children(ignore_term: bool) -> list[subprocess.Popen[bytes]]:
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_term else ""
    code = SLEEPER.format(ignore=ignore)
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]


COMPLETION = b'{"id":"cmpl-fake","object":"text_completion","choices":[]}'


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _handler(
    started: float, ready_after: float, never: bool, record: str | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def address_string(self) -> str:
            return "uds"

        def _record(self) -> None:
            if record:
                line = {"method": self.command, "path": self.path,
                        "headers": sorted(k.lower() for k in self.headers)}  # fmt: skip
                with open(record, "a", encoding="utf-8") as out:
                    out.write(json.dumps(line) + "\n")

        def do_POST(self) -> None:
            self._record()
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            ok = self.path == "/v1/completions"
            self.send_response(200 if ok else 404)
            body = COMPLETION if ok else b"{}"
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._record()
            ready = not never and time.monotonic() - started >= ready_after
            status = 200 if self.path == "/health" and ready else 503
            body = b"{}" if status == 200 else b'{"ready":false}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid-file")
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--exit-after", type=float)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--children-ignore-term", action="store_true")
    parser.add_argument("--fail-before-listen", type=int)
    parser.add_argument("--uds")
    parser.add_argument("--record")
    args, _ = parser.parse_known_args()
    if args.fail_before_listen is not None:
        raise SystemExit(args.fail_before_listen)
    children = _children(args.children_ignore_term)
    if args.pid_file:
        record = {"server": os.getpid(), "children": [c.pid for c in children]}
        with open(args.pid_file + ".tmp", "w", encoding="utf-8") as out:
            json.dump(record, out)
        os.replace(args.pid_file + ".tmp", args.pid_file)
    handler = _handler(time.monotonic(), args.ready_after, args.never_ready, args.record)
    server: socketserver.BaseServer
    if args.uds:
        server = UnixHTTPServer(args.uds, handler)
    else:
        server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    if args.exit_after is not None:
        timer = threading.Timer(args.exit_after, os._exit, (args.exit_code,))
        timer.daemon = True
        timer.start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
