"""Header smuggling, malformed heads, and the upstream's faults, against real sockets."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import GatewayFactory
from tests.gateway.support import (
    PL1,
    FakeUpstream,
    RunningGateway,
    body_of,
    completion,
    config_for,
    post,
    raw_exchange,
    running_gateway,
    status_of,
)

BODY = completion()
N = len(BODY)
SMUGGLING = [
    b"content-length: %d\r\ncontent-length: %d" % (N, N),
    b"content-length: %d\r\ncontent-length: %d" % (N, N + 1),
    b"content-length: %d, %d" % (N, N),
    b"content-length: +%d" % N,
    b"content-length: 0x%x" % N,
    b"content-length: %d\r\ntransfer-encoding: chunked" % N,
    b"transfer-encoding: chunked",
    b"transfer-encoding: identity\r\ncontent-length: %d" % N,
    b"Transfer-Encoding : chunked\r\ncontent-length: %d" % N,
    b"content-length : %d" % N,
    b"content-length: %d\r\n transfer-encoding: chunked" % N,  # obs-fold
    b"content-length:\t%d\r\ntransfer-encoding:\tchunked" % N,
    b"x\x00y: 1\r\ncontent-length: %d" % N,
    b"content-length: %d\r\nfoo: b\x01r" % N,
]


def _raw_post(header_lines: bytes, body: bytes = BODY) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: g\r\n" + header_lines + b"\r\n\r\n" + body
        + b"GET /metrics HTTP/1.1\r\nhost: g\r\n\r\n"
    )  # fmt: skip


@pytest.mark.parametrize("lines", SMUGGLING)
def test_smuggling_attempts_are_400_and_nothing_is_forwarded(
    gateway: RunningGateway, upstream: FakeUpstream, lines: bytes
) -> None:
    answer = raw_exchange(gateway.port, _raw_post(lines))
    assert status_of(answer) == 400
    assert answer.count(b"HTTP/1.1 ") == 1  # the connection closed after the refusal
    assert upstream.seen == []


def test_a_pipelined_second_request_is_judged_on_its_own(
    gateway: RunningGateway, upstream: FakeUpstream
) -> None:
    """A body shorter than the bytes sent: the rest is a new request, refused by route."""
    answer = raw_exchange(gateway.port, _raw_post(b"content-length: %d" % N))
    assert answer.count(b"HTTP/1.1 200 ") == 1 and answer.count(b"HTTP/1.1 404 ") == 1
    assert [s.path for s in upstream.seen] == ["/v1/completions"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}",
        b"post /v1/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}",
        b"POST  /v1/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}",
        b"POST /v1/completions HTTP/1.1 \r\ncontent-length: 2\r\n\r\n{}",
        b"POST /v1/completions HTTP/2.0\r\ncontent-length: 2\r\n\r\n{}",
        b"GET /health HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}",
        b"GET /health HTTP/1.1\r\nexpect: 200-ok\r\n\r\n",
        b"\r\nGET /health HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_heads_are_refused(
    gateway: RunningGateway, upstream: FakeUpstream, request_bytes: bytes
) -> None:
    assert status_of(raw_exchange(gateway.port, request_bytes)) in (400, 417)
    assert upstream.seen == []


def test_head_and_header_count_limits(gateway: RunningGateway, upstream: FakeUpstream) -> None:
    big = b"GET /health HTTP/1.1\r\nx: " + b"a" * 20_000 + b"\r\n\r\n"
    many = b"GET /health HTTP/1.1\r\n" + b"x: 1\r\n" * 65 + b"\r\n"
    assert status_of(raw_exchange(gateway.port, big)) == 431
    assert status_of(raw_exchange(gateway.port, many)) == 431
    assert upstream.seen == []


def test_a_post_without_content_length_is_411(gateway: RunningGateway) -> None:
    answer = raw_exchange(gateway.port, b"POST /v1/completions HTTP/1.1\r\nhost: g\r\n\r\n")
    assert status_of(answer) == 411


def test_bare_lf_heads_are_never_forwarded(gateway: RunningGateway, upstream: FakeUpstream) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\nhost: g\n\n")
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(100) == b""  # no complete head: closed without an answer
    assert upstream.seen == []


def test_expect_continue_is_answered(gateway: RunningGateway) -> None:
    answer = raw_exchange(gateway.port, post("/v1/completions", BODY, b"expect: 100-continue"))
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert answer.endswith(PL1)


def test_keep_alive_reuses_the_upstream_connection(
    gateway: RunningGateway, upstream: FakeUpstream
) -> None:
    one = b"POST /v1/completions HTTP/1.1\r\nhost: g\r\ncontent-length: %d\r\n\r\n%s" % (N, BODY)
    answer = raw_exchange(gateway.port, one * 3 + post("/v1/completions", BODY))
    assert answer.count(b"HTTP/1.1 200 OK") == 4
    assert len(upstream.seen) == 4


# -- upstream faults ---------------------------------------------------------------------


def test_a_slow_upstream_is_504(make_gateway: GatewayFactory) -> None:
    with make_gateway(upstream_timeout=0.5) as gateway:
        answer = raw_exchange(gateway.port, post("/v1/completions", completion(kiln_test="slow")))
    assert status_of(answer) == 504
    assert b'"code":504' in body_of(answer)


def test_an_answer_that_breaks_off_before_anything_was_relayed_is_502(
    gateway: RunningGateway,
) -> None:
    answer = raw_exchange(gateway.port, post("/v1/completions", completion(kiln_test="drop")))
    assert status_of(answer) == 502
    assert b"x" * 10 not in answer  # never part of the broken body


def test_a_stream_that_breaks_off_cuts_the_client_off(gateway: RunningGateway) -> None:
    answer = raw_exchange(
        gateway.port, post("/v1/completions", completion(kiln_test="stream_drop"))
    )
    assert status_of(answer) == 200
    assert b"data: " in answer
    assert not answer.endswith(b"0\r\n\r\n")  # no last chunk: visibly incomplete


def test_a_missing_upstream_socket_is_502(socket_dir: Path) -> None:
    with running_gateway(config_for(str(socket_dir / "absent.sock"))) as gateway:
        answer = raw_exchange(gateway.port, post("/v1/completions", BODY))
    assert status_of(answer) == 502


@pytest.fixture
def mute_upstream(socket_dir: Path) -> Iterator[str]:
    """A Unix socket server that reads a request and closes without answering."""
    path = str(socket_dir / "mute.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        server.close()
        thread.join(5)


def test_an_upstream_that_closes_without_answering_is_502(mute_upstream: str) -> None:
    with running_gateway(config_for(mute_upstream)) as gateway:
        answer = raw_exchange(gateway.port, post("/v1/completions", BODY))
    assert status_of(answer) == 502
