"""Issue 27 item 2: slow request bodies cannot hold the shared byte budget.

Against a real ``kiln serve`` (``auth = "required"``, a short body grace and
a minimum rate): token A opens a ``/v1/jobs`` request declaring a maximal
body and trickles it.  A's second maximal body is refused at once (A holds
its share); with token C holding the rest of the large bodies' share, token
B's small requests are still served (never 503); A's slow body is answered
``408 request_timeout`` once it falls below the minimum rate and its
connection is closed, which frees A's share.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kiln_registry.api.limits import MAX_JOB_REQUEST_BYTES
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import ServerProcess, write_config
from tests.auth.support import bearer, create_token

GRACE_S = 1.0
MIN_RATE = 4096  # bytes per second once the grace is spent
TRICKLE_S = 0.25  # one byte per this many seconds: far below MIN_RATE
MAX_TRICKLE = 400  # bytes: a bound on the trickle loop (the server cuts it long before)
SOCKET_TIMEOUT_S = 60


@pytest.fixture
def served(tmp_path: Path, tiny_model: TinyModel) -> Iterator[tuple[ServerProcess, str, str, str]]:
    server_keys = {"auth": "required", "body_grace_s": GRACE_S, "body_min_bytes_per_s": MIN_RATE}
    config = write_config(tmp_path, student=tiny_model.path, server=server_keys)
    database = tmp_path / "registry.db"
    token_a = create_token(database, "caller-a", {"jobs", "register"})
    token_b = create_token(database, "caller-b", {"jobs", "register"})
    token_c = create_token(database, "caller-c", {"jobs"})
    with ServerProcess(config, tmp_path / "serve.log") as server:
        server.wait_ready()
        yield server, token_a, token_b, token_c


def _slow_job(port: int, token: str) -> socket.socket:
    """A ``POST /v1/jobs`` declaring a maximal body, its head and one body byte sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S)
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {MAX_JOB_REQUEST_BYTES}\r\n\r\n{{"
    )
    sock.sendall(head.encode())
    return sock


def _answer(sock: socket.socket) -> bytes:
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def _trickle_until_answered(sock: socket.socket) -> bytes:
    """Send one byte per ``TRICKLE_S`` until the server answers (at most ``MAX_TRICKLE``)."""
    sock.settimeout(TRICKLE_S)
    for _ in range(MAX_TRICKLE):
        try:
            sock.sendall(b" ")
            first = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return b""
        sock.settimeout(SOCKET_TIMEOUT_S)
        return first + _answer(sock)
    raise AssertionError("the server kept reading a body far below the minimum rate")


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def test_a_trickled_body_is_cut_and_never_blocks_another_caller(
    served: tuple[ServerProcess, str, str, str],
) -> None:
    server, token_a, token_b, token_c = served
    slow = _slow_job(server.port, token_a)
    # C holds the rest of the large bodies' budget: small bodies still find room.
    slow_c = _slow_job(server.port, token_c)
    try:
        time.sleep(0.2)  # let the server take A's reservation (no assertion on time)
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client:
            # A's second maximal body does not fit A's share: 503 at once, with Retry-After.
            with _slow_job(server.port, token_a) as second:
                refused = _answer(second)
            assert _status(refused) == 503 and b"server_busy" in refused, refused[:200]
            assert b"retry-after: 1" in refused.lower()
            # B is another caller: its job submission and registration are read and judged.
            job = client.post("/v1/jobs", json={"kind": "nothing"}, headers=bearer(token_b))
            assert job.status_code == 400, job.text
            teacher = client.post("/v1/teachers", json={}, headers=bearer(token_b))
            assert teacher.status_code in (400, 422), teacher.text
            # A's slow body falls below the minimum rate: 408, and the connection closes.
            answer = _trickle_until_answered(slow)
            assert _status(answer) == 408 and b"request_timeout" in answer, answer[:300]
            assert b"connection: close" in answer.lower()
            assert _status(_trickle_until_answered(slow_c)) == 408
            # A's share is free again: A is served.
            again = client.post("/v1/jobs", json={"kind": "nothing"}, headers=bearer(token_a))
            assert again.status_code == 400, again.text
    finally:
        slow.close()
        slow_c.close()
    assert httpx.get(server.url + "/health", trust_env=False).status_code == 200
