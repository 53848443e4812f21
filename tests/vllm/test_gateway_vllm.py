"""The teacher gateway in front of real vLLM 0.32 (the CPU build).

The route list is taken from the running vLLM itself: its ``/openapi.json``,
read over the private Unix socket the launcher gave it (the test runs as the
same user, so the 0700 runtime directory is readable here).  Every route it
registers is refused at the gateway except the three allowed, and vLLM
itself holds no key.  Probes, registration, scoring and the adapter's base
alias through the gateway are covered by ``test_real_vllm.py``, whose
launches now go through the gateway by default.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import socket
import stat
from pathlib import Path

from tests.vllm.support import SERVED, Launched

ALLOWED = {("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/health")}
UNLISTED = [
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("POST", "/invocations"),
]


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.path_ = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(self.path_)
        self.sock = sock


def _vllm_socket(launched: Launched) -> str:
    (path,) = glob.glob(f"/tmp/kiln-{launched.proc.pid}-*/vllm.sock")
    return path


def _get(conn: http.client.HTTPConnection, method: str, path: str) -> tuple[int, bytes]:
    body = b"{}" if method != "GET" else None
    conn.request(method, path, body=body, headers={"content-type": "application/json"})
    answer = conn.getresponse()
    return answer.status, answer.read()


def test_every_route_vllm_registers_is_refused_but_three(launched: Launched) -> None:
    uds = _vllm_socket(launched)
    assert stat.S_IMODE(os.stat(os.path.dirname(uds)).st_mode) == 0o700
    direct = _UnixConnection(uds)
    status, spec = _get(direct, "GET", "/openapi.json")
    assert status == 200
    routes = {
        (method.upper(), path)
        for path, item in json.loads(spec)["paths"].items()
        for method in item
        if "{" not in path
    }
    assert routes >= ALLOWED and len(routes) > 10  # vLLM registers many more
    gateway = http.client.HTTPConnection("127.0.0.1", launched.port, timeout=30)
    for method, path in sorted(routes | set(UNLISTED)):
        status, body = _get(gateway, method, path)
        if (method, path) in ALLOWED:
            assert status != 404, (method, path)
        else:
            assert status == 404, (method, path, status)
            assert json.loads(body)["error"]["code"] == 404
        gateway.close()
    direct.close()


def test_vllm_holds_no_key_and_answers_only_on_its_socket(launched: Launched) -> None:
    uds = _vllm_socket(launched)
    direct = _UnixConnection(uds)
    status, models = _get(direct, "GET", "/v1/models")  # no key: vLLM was given none
    assert status == 200 and json.loads(models)["data"][0]["id"] == SERVED
    direct.close()
    for pid in launched.vllm_pids():
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert not any(token.startswith((b"--api-key", b"--host", b"--port")) for token in argv)
        assert f"--uds={uds}".encode() in argv
