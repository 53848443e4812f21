"""The relay's framing state machine against an upstream that answers in awkward pieces.

A scripted upstream (a real Unix-socket server in a thread) reads each request and
answers with bytes it writes in given pieces, so every split of a head, a chunk-size
line, a payload or a trailer reaches the gateway's parser for real.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kiln_registry.gateway import admission
from kiln_registry.gateway.refusals import Refusal
from tests.gateway.support import (
    body_of,
    completion,
    config_for,
    post,
    raw_exchange,
    running_gateway,
    status_of,
)

BODY = b'{"id":"cmpl-1","choices":[]}'
PIECE_PAUSE = 0.002


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _read_request(conn: socket.socket) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.startswith(b"content-length")
        ),
        0,
    )
    while len(rest) < length:
        rest += conn.recv(65536)
    return True


@contextmanager
def scripted_upstream(directory: Path, answer: list[bytes]) -> Iterator[list[int]]:
    """Answer every request with ``answer``'s pieces; yields the list of accepted connections."""
    path = directory / "scripted.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.05)
    accepted: list[int] = []
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while _read_request(conn):
                for piece in answer:
                    conn.sendall(piece)
                    time.sleep(PIECE_PAUSE)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            accepted.append(1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield accepted
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _keep_alive_request() -> bytes:
    body = completion()
    return b"POST /v1/completions HTTP/1.1\r\nhost: g\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def _exchange(directory: Path, answer: list[bytes], request: bytes) -> tuple[bytes, int]:
    config = config_for(str(directory / "scripted.sock"))
    with scripted_upstream(directory, answer) as accepted, running_gateway(config) as gateway:
        response = raw_exchange(gateway.port, request)
    return response, len(accepted)


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(
    BODY
)


@pytest.mark.parametrize("size", [1, 3, 7, 4096])
def test_a_length_answer_in_pieces_is_relayed_byte_for_byte(socket_dir: Path, size: int) -> None:
    response, _ = _exchange(
        socket_dir, _pieces(HEAD + BODY, size), post("/v1/completions", completion())
    )
    assert status_of(response) == 200 and body_of(response) == BODY


def test_interim_answers_are_skipped(socket_dir: Path) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
    response, _ = _exchange(
        socket_dir, [interim, HEAD + BODY], post("/v1/completions", completion())
    )
    assert response.startswith(b"HTTP/1.1 200 OK\r\n") and body_of(response) == BODY
    assert b"link:" not in response


def test_a_chunked_answer_in_one_byte_pieces_is_reframed_chunk_for_chunk(socket_dir: Path) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1a\r\n" + b"z" * 26 + b"\r\n0\r\nx-trailer: 1\r\n\r\n"
    )
    response, _ = _exchange(socket_dir, _pieces(chunked, 1), post("/v1/completions", completion()))
    assert status_of(response) == 200
    assert body_of(response) == b"5\r\nhello\r\n1a\r\n" + b"z" * 26 + b"\r\n0\r\n\r\n"
    assert b"ext=1" not in response and b"x-trailer" not in response


def test_a_chunk_larger_than_the_bound_is_refused_before_it_is_read(socket_dir: Path) -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffff\r\n" + b"x" * 100
    response, _ = _exchange(socket_dir, [chunked], post("/v1/completions", completion()))
    assert status_of(response) == 502
    assert b"exceeds the bound" in body_of(response)


def test_a_broken_chunk_framing_is_502(socket_dir: Path) -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"
    response, _ = _exchange(socket_dir, [chunked], post("/v1/completions", completion()))
    assert status_of(response) == 502


def test_bytes_past_the_length_are_dropped_and_the_connection_not_reused(
    socket_dir: Path,
) -> None:
    answer = [HEAD + BODY + b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"]
    response, connections = _exchange(socket_dir, answer, _keep_alive_request() * 2
                                      + post("/v1/completions", completion()))  # fmt: skip
    assert response.count(b"HTTP/1.1 200 OK") == 3
    assert response.count(BODY) == 3 and b"content-length: 0" not in response
    assert connections == 3  # each answer overran its length: a fresh connection each time


def test_pipelined_requests_are_answered_in_order_over_one_upstream_connection(
    socket_dir: Path,
) -> None:
    response, connections = _exchange(
        socket_dir,
        _pieces(HEAD + BODY, 5),
        _keep_alive_request() * 3 + post("/v1/completions", completion()),
    )
    assert response.count(b"HTTP/1.1 200 OK") == 4 and response.count(BODY) == 4
    assert connections == 1


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "a": 2}',
        b'{"a": {"b": 1, "b": 2}}',
        b'{"a": [{"b": 1}, {"c": 2, "c": 3}]}',
        b'{"a": "x\\":", "b": 1}',
        b'{"a": "{", "b": {"c": 1}}',
        b'{"a" :1, "b"\n:2}',
        b'{"a": NaN}',
        b'{"a": 1e400}',
        b'{"a": "\\ud800"}',
        b'{"a": 123456789012345678901234567890}',
        b'{"a": -1234567890123456789}',
        b'{"a": [1, 2, 3], "b": null, "c": true, "d": 1.5}',
        b"[" * 2000 + b"]" * 2000,
        b'{"a": "\xff"}',
        b"\xef\xbb\xbf{}",
        b"{} {}",
    ],
)
def test_the_fast_body_parser_agrees_with_the_strict_one(body: bytes) -> None:
    """orjson's fast path must give the strict parser's verdict and value, or defer to it."""
    fast = admission._fast_parse(body)
    try:
        exact: object = admission._exact_parse(body)
    except Refusal:
        exact = Refusal
    assert fast is None or (exact is not Refusal and fast == exact)


def test_a_client_that_reads_slowly_pauses_the_upstream_and_gets_every_byte(
    socket_dir: Path,
) -> None:
    """4 MiB answers to a client that waits before reading: the gateway's buffer fills, the
    upstream read pauses, and resumes; the connection then serves a second request."""
    big = bytes(range(256)) * (16 << 10)
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big)
    request = completion(prompt=list(range(4000)), prompt_logprobs=32)
    one = b"POST /v1/completions HTTP/1.1\r\nhost: g\r\ncontent-length: %d\r\n\r\n%s" % (
        len(request),
        request,
    )
    config = config_for(str(socket_dir / "scripted.sock"), max_model_len=4096)
    with (
        scripted_upstream(socket_dir, [head, big]) as accepted,
        running_gateway(config) as gateway,
        socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as client,
    ):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        for _ in range(2):
            client.sendall(one)
            time.sleep(0.5)  # nothing read: the gateway has to hold back
            expected = len(head) + len(big)
            received = b""
            while len(received) < expected:
                chunk = client.recv(1 << 20)
                assert chunk
                received += chunk
            assert received.endswith(big) and received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert len(accepted) == 1
