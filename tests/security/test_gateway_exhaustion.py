"""Issue 27 item 4: silent sockets without a key cannot keep keyed clients off the gateway.

256 silent sockets with no key used to fill ``max_connections`` and make
every keyed completion a 503 for 75 s.  Now a connection is unproven until
one of its requests passes the key check: unproven connections have their
own small cap (a newcomer closes the oldest one still waiting for a head)
and a short deadline for a whole head, apart from the proven ones.  The
gateway's default address is loopback, and it warns when it listens beyond.
Real gateways on 127.0.0.1 in front of a real fake vLLM on a Unix socket;
plain sockets for the attackers.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.gateway.config import GatewayConfig, gateway_argv
from tests.gateway.support import (
    SERVED,
    FakeUpstream,
    RunningGateway,
    completion,
    config_for,
    fake_upstream,
    post,
    raw_exchange,
    running_gateway,
    status_of,
)
from tests.helpers import free_port

KEY = "gw-exhaustion-key-0123456789"
AUTH = b"authorization: Bearer " + KEY.encode()
KEEP_ALIVE_COMPLETION = (
    b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
    b"%s\r\ncontent-length: %d\r\n\r\n%s"
)


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    directory = Path(tempfile.mkdtemp(prefix="kgx-"))  # a Unix socket path is short
    try:
        with fake_upstream(directory) as app:
            yield app
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def _gateway(upstream: FakeUpstream, **overrides: Any) -> Iterator[RunningGateway]:
    with running_gateway(config_for(upstream.path, api_key=KEY.encode(), **overrides)) as gw:
        yield gw


def _silent(port: int, count: int, stack: ExitStack, first: bytes = b"") -> list[socket.socket]:
    """``count`` connections that send at most ``first`` and then nothing."""
    sockets = []
    for _ in range(count):
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=30))
        if first:
            sock.sendall(first)
        sockets.append(sock)
    return sockets


def _closed_by_gateway(sock: socket.socket) -> bool:
    """True once the gateway has closed ``sock`` without answering (waits up to its timeout)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def _keyed_completion(sock: socket.socket) -> int:
    body = completion()
    sock.sendall(KEEP_ALIVE_COMPLETION % (AUTH, len(body), body))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(65536)
        assert chunk, "the gateway closed a keyed connection"
        head += chunk
    raw_head, _, rest = head.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in raw_head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))  # fmt: skip
    while len(rest) < length:
        rest += sock.recv(65536)
    return status_of(head)


def _sync(gw: RunningGateway) -> None:
    """Wait until the gateway's loop has handled what was sent before this call."""
    assert status_of(raw_exchange(gw.port, b"GET /health HTTP/1.1\r\nconnection: close\r\n\r\n"))


def test_silent_unkeyed_sockets_do_not_block_keyed_completions(upstream: FakeUpstream) -> None:
    # evict_after=0: the sockets need not age 1 s before a newcomer may close them
    with _gateway(upstream, evict_after=0.0) as gw, ExitStack() as stack:
        silent = _silent(gw.port, 300, stack)  # more than max_connections (256) and the cap
        trickling = _silent(gw.port, 20, stack, first=b"POST /v1/completions HTTP/1.1\r\n")
        _sync(gw)
        assert len(gw.gateway.unproven) <= gw.gateway.config.max_unproven
        for _ in range(3):  # fresh keyed connections get through, one after another
            answer = raw_exchange(gw.port, post("/v1/completions", completion(), AUTH))
            assert status_of(answer) == 200
        assert sum(map(_closed_by_gateway, silent[:200])) == 200  # the oldest were closed
        assert len(trickling) == 20 and len(gw.gateway.proven) == 0


def test_an_unproven_connection_gets_a_short_head_deadline(upstream: FakeUpstream) -> None:
    with _gateway(upstream, head_timeout=1.0, idle_timeout=600.0) as gw, ExitStack() as stack:
        (trickle,) = _silent(gw.port, 1, stack, first=b"GET /v1/models HTTP/1.1\r\n")
        assert _closed_by_gateway(trickle)  # long before the 600 s a proven one gets
        (health,) = _silent(gw.port, 1, stack, first=b"GET /health HTTP/1.1\r\n\r\n")
        assert health.recv(65536).startswith(b"HTTP/1.1 200")
        assert _closed_by_gateway(health)  # /health proves nothing
        keyed = stack.enter_context(socket.create_connection(("127.0.0.1", gw.port), timeout=30))
        assert _keyed_completion(keyed) == 200
        keyed.settimeout(2.0)  # twice the unproven deadline: a proven connection stays
        with pytest.raises(TimeoutError):
            keyed.recv(1)
        assert _keyed_completion(keyed) == 200


def test_a_wrong_key_proves_nothing_and_is_closed(upstream: FakeUpstream) -> None:
    with _gateway(upstream) as gw:
        wrong = b"authorization: Bearer not-the-key"
        request = post("/v1/completions", completion(), wrong).replace(
            b"connection: close\r\n", b""
        )
        answer = raw_exchange(gw.port, request)
        assert status_of(answer) == 401 and b"connection: close" in answer.lower()
        assert len(gw.gateway.proven) == 0


def test_proven_and_unproven_connections_have_separate_caps(upstream: FakeUpstream) -> None:
    caps = {"max_connections": 2, "max_unproven": 3, "evict_after": 0.0}
    with _gateway(upstream, **caps) as gw, ExitStack() as stack:
        keyed = [stack.enter_context(socket.create_connection(("127.0.0.1", gw.port), timeout=30))
                 for _ in range(3)]  # fmt: skip
        assert [_keyed_completion(sock) for sock in keyed[:2]] == [200, 200]
        third = raw_exchange(gw.port, post("/v1/completions", completion(), AUTH))
        assert status_of(third) == 503  # the proven connections are full
        oldest, *_ = _silent(gw.port, 4, stack)  # a fourth unproven one closes the oldest
        _sync(gw)
        assert _closed_by_gateway(oldest)
        assert [_keyed_completion(sock) for sock in keyed[:2]] == [200, 200]


def test_a_burst_of_new_clients_does_not_close_itself(upstream: FakeUpstream) -> None:
    with _gateway(upstream, max_unproven=3, evict_after=600.0) as gw, ExitStack() as stack:
        burst = _silent(gw.port, 3, stack)  # connected, heads not yet sent
        (late,) = _silent(gw.port, 1, stack)  # sends nothing: the 503 is read, never reset
        assert status_of(late.recv(65536)) == 503  # none of the burst is old enough to close
        assert [_keyed_completion(sock) for sock in burst] == [200, 200, 200]
        assert len(gw.gateway.proven) == 3 and not gw.gateway.unproven


def _gateway_process(upstream: FakeUpstream, host: str, env: dict[str, str]) -> list[bytes]:
    config = GatewayConfig(host, free_port(), upstream.path, SERVED, 256, 32)
    key_env = "KILN_GW_EXPOSURE_KEY" if "KILN_GW_EXPOSURE_KEY" in env else None
    argv = [sys.executable, "-m", "kiln_registry.gateway", *gateway_argv(config,
            api_key_env=key_env)]  # fmt: skip
    process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert process.stderr is not None
    try:
        lines = [process.stderr.readline()]
        if host != "127.0.0.1":
            lines.append(process.stderr.readline())
        process.send_signal(signal.SIGTERM)
        lines.extend(process.communicate(timeout=60)[1].splitlines(keepends=True))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    return lines


def test_the_gateway_warns_when_it_listens_beyond_loopback(upstream: FakeUpstream) -> None:
    env = {**os.environ, "KILN_GW_EXPOSURE_KEY": KEY}
    keyed = _gateway_process(upstream, "0.0.0.0", env)
    assert keyed[0].startswith(b"kiln-gateway: listening on 0.0.0.0:")
    assert keyed[1].startswith(b"kiln-gateway: warning:") and b"plain HTTP" in keyed[1]
    assert not any(KEY.encode() in line for line in keyed)
    open_env = {k: v for k, v in os.environ.items() if k != "KILN_GW_EXPOSURE_KEY"}
    unkeyed = _gateway_process(upstream, "0.0.0.0", open_env)
    assert b"without an API key" in unkeyed[1]
    quiet = _gateway_process(upstream, "127.0.0.1", env)
    assert not any(b"warning" in line for line in quiet)
