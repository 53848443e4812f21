"""Issue 15 attack 8: slow-header connections are closed, oversize headers refused, logs capped.

Run against a real ``kiln serve`` subprocess: clients that trickle a request
line and never finish their headers are disconnected by the server (the
header-read deadline, ``serve_guard.HEADER_TIMEOUT_S``) while ``/health``
keeps answering; a header block over the h11 bound is refused.  The log
filter is exercised on a real logger.
"""

from __future__ import annotations

import io
import logging
import socket
from pathlib import Path

import httpx

from kiln_registry.serve.guard import HEADER_TIMEOUT_S, MAX_HEADER_BYTES, RepeatFilter
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import ServerProcess, write_config

SLOW_CLIENTS = 40


def _slow_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=HEADER_TIMEOUT_S * 6)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def test_slow_headers_are_cut_and_health_answers(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    with ServerProcess(config, tmp_path / "serve.log") as server:
        server.wait_ready()
        slow = [_slow_client(server.port) for _ in range(SLOW_CLIENTS)]
        try:
            health = httpx.get(server.url + "/health", timeout=60, trust_env=False)
            assert health.status_code == 200
            # The server closes every one of them (recv returns EOF, not a timeout).
            assert all(_closed_by_server(sock) for sock in slow)
        finally:
            for sock in slow:
                sock.close()
        assert _oversize_header_refused(server.port)
        assert httpx.get(server.url + "/health", trust_env=False).status_code == 200


def _oversize_header_refused(port: int) -> bool:
    """A header block sent in pieces past the bound gets 431 (or a close), never a 200."""
    with socket.create_connection(("127.0.0.1", port), timeout=HEADER_TIMEOUT_S * 6) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        try:
            for _ in range(MAX_HEADER_BYTES // 1024 + 2):
                sock.sendall(b"a" * 1024)
            sock.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return True
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass  # closed with our unread bytes pending: refused
        return not answer.startswith(b"HTTP/1.1 200")


def test_repeated_log_lines_are_capped() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RepeatFilter(burst=3, window_s=3600))
    logger = logging.getLogger("kiln_registry.tests.flood")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for n in range(1000):
            logger.warning("accept failed: %s", n)
        logger.warning("a different line")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert lines == ["accept failed: 0", "accept failed: 1", "accept failed: 2", "a different line"]


def test_repeat_filter_reports_what_it_dropped() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RepeatFilter(burst=1, window_s=0.0))  # every record opens a new window
    logger = logging.getLogger("kiln_registry.tests.flood2")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for _ in range(3):
            logger.warning("same")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().splitlines() == ["same", "same", "same"]
