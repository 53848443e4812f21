"""The header deadline and header bound hold on both of uvicorn's HTTP/1.1 protocols.

``kiln serve`` uses httptools where it is installed and h11 otherwise
(``serve_guard.uvicorn_limits``); each runs here under a real uvicorn server
on loopback with a short deadline.
"""

from __future__ import annotations

import socket
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kiln_registry.serve import guard as serve_guard
from tests.api.support import _uvicorn_thread


async def _echo_length(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


APP = Starlette(routes=[Route("/echo", _echo_length, methods=["GET", "POST"])])


@pytest.fixture(params=[True, False], ids=["httptools", "h11"])
def port(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setattr(serve_guard, "HEADER_TIMEOUT_S", 0.5)
    limits = serve_guard.uvicorn_limits(prefer_httptools=request.param)
    if request.param:
        assert limits["http"].__name__ == "HeaderDeadlineHttpTools"
    config = uvicorn.Config(APP, log_level="warning", access_log=False, lifespan="off", **limits)
    with _uvicorn_thread(config) as bound:
        yield bound


def _read_all(sock: socket.socket) -> bytes:
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return answer


def test_a_client_that_never_finishes_its_headers_is_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server, not by our timeout
        assert time.monotonic() - started < 8


def test_keep_alive_requests_and_a_large_body_in_one_read_pass(port: int) -> None:
    body = b"x" * (4 * serve_guard.MAX_HEADER_BYTES)
    head = (
        b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(3):  # one connection, several requests, each head + body in one write
            sock.sendall(head + body)
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
            assert answer.endswith(b'{"bytes":%d}' % len(body))


def test_a_head_over_the_bound_is_refused(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        try:
            for _ in range(serve_guard.MAX_HEADER_BYTES // 1024 + 2):
                sock.sendall(b"a" * 1024)
            sock.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return
        answer = _read_all(sock)
        assert not answer.startswith(b"HTTP/1.1 200")


def test_a_whole_oversized_head_in_one_read(port: int, request: pytest.FixtureRequest) -> None:
    """httptools measures the parsed head and refuses it; h11 bounds only what it buffers
    incomplete, so a complete head that arrived in one read (at most 64 KiB) is served."""
    big = b"a" * (serve_guard.MAX_HEADER_BYTES + 1024)
    raw = b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + big + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            return
        answer = _read_all(sock) if "httptools" in request.node.name else sock.recv(4096)
        refused = not answer.startswith(b"HTTP/1.1 200")
        assert refused == ("httptools" in request.node.name), answer[:80]
