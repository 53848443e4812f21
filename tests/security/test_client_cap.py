"""Issue 27 item 3: a reconnecting slowloris cannot keep ``/health`` and ``/ready`` from answering.

Protocol level (both of uvicorn's protocols): past the per-client cap a
connection is answered only on ``/health`` and ``/ready`` (503
``server_busy`` for anything else), and past uvicorn's concurrency limit
``/health`` and ``/ready`` still answer (their reserved slot).  Against a
real ``kiln serve`` with a small cap: one address keeps many sockets
trickling header bytes and reopens each one the server closes, while every
``/health`` probe from that same address answers 200.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from kiln_registry.config.edge import ServerEdgeKeys
from kiln_registry.serve import guard as serve_guard
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import ServerProcess, _uvicorn_thread, write_config

CAP = 4
ATTACK_SOCKETS = 24
PROBES = 20
PROBE_GAP_S = 0.1
MAX_OPENS = 5000  # a bound on the attacker's reconnect loop


async def _text(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.url.path)


APP = Starlette(routes=[Route(path, _text) for path in ("/health", "/ready", "/ok")])


def _trickler(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


@contextlib.contextmanager
def _serving(httptools: bool, per_client: int, concurrency: int) -> Iterator[int]:
    edge = ServerEdgeKeys(max_connections_per_client=per_client)
    limits = serve_guard.uvicorn_limits(edge, prefer_httptools=httptools)
    limits["limit_concurrency"] = concurrency
    config = uvicorn.Config(APP, log_level="error", access_log=False, lifespan="off", **limits)
    with _uvicorn_thread(config) as port:
        yield port


def _get(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10, trust_env=False)


@pytest.mark.parametrize("httptools", [True, False], ids=["httptools", "h11"])
def test_past_the_client_cap_only_health_and_ready_answer(httptools: bool) -> None:
    with _serving(httptools, per_client=CAP, concurrency=1024) as port:
        held = [_trickler(port) for _ in range(CAP)]
        try:
            refused = _get(port, "/ok")
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "server_busy"
            assert refused.headers["retry-after"] == "1"
            for path in ("/health", "/ready"):
                assert _get(port, path).status_code == 200
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)  # the server sees the closes (no assertion on time)
        assert _get(port, "/ok").status_code == 200


@pytest.mark.parametrize("httptools", [True, False], ids=["httptools", "h11"])
def test_health_and_ready_keep_a_slot_past_the_concurrency_limit(httptools: bool) -> None:
    with _serving(httptools, per_client=1000, concurrency=CAP) as port:
        held = [_trickler(port) for _ in range(2 * CAP)]
        try:
            assert _get(port, "/ok").status_code == 503
            for path in ("/health", "/ready"):
                assert _get(port, path).status_code == 200
        finally:
            for sock in held:
                sock.close()


class _Slowloris:
    """``ATTACK_SOCKETS`` trickling sockets from one address, each reopened once closed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.opens = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> socket.socket | None:
        self.opens += 1
        with contextlib.suppress(OSError):
            sock = _trickler(self.port)
            sock.settimeout(0)  # the liveness check below must never wait
            return sock
        return None

    def _alive(self, sock: socket.socket | None) -> bool:
        if sock is None:
            return False
        try:
            sock.send(b"a")
            return sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _run(self) -> None:
        socks = [self._open() for _ in range(ATTACK_SOCKETS)]
        while not self.stop.wait(0.25) and self.opens < MAX_OPENS:
            for n, sock in enumerate(socks):
                if not self._alive(sock):
                    if sock is not None:
                        sock.close()
                    socks[n] = self._open()
        for sock in socks:
            if sock is not None:
                sock.close()


def test_reconnecting_slowloris_keeps_health_answering(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    server_keys = {"max_connections_per_client": CAP}
    config = write_config(tmp_path, student=tiny_model.path, server=server_keys)
    with ServerProcess(config, tmp_path / "serve.log") as server:
        server.wait_ready()
        attack = _Slowloris(server.port)
        attack.thread.start()
        statuses: list[int] = []
        try:
            for _ in range(PROBES):
                statuses.append(_get(server.port, "/health").status_code)
                time.sleep(PROBE_GAP_S)
            ready = _get(server.port, "/ready").status_code
        finally:
            attack.stop.set()
            attack.thread.join(30)
        assert statuses == [200] * PROBES, statuses
        assert ready == 200
        assert attack.opens > ATTACK_SOCKETS  # the server closed sockets and they reopened
