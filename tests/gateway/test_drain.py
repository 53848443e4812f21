"""Drain on stop, and the gateway as its own process (``python -m kiln_registry.gateway``)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from kiln_registry.gateway.config import GatewayConfig, gateway_argv
from tests.gateway.support import (
    SERVED,
    FakeUpstream,
    RunningGateway,
    completion,
    post,
    raw_exchange,
    status_of,
)
from tests.helpers import free_port

KEY = "drain-test-key-0123"


def test_drain_finishes_requests_in_flight_and_closes_idle_connections(
    gateway: RunningGateway, upstream: FakeUpstream
) -> None:
    idle = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    idle.sendall(b"GET /health HTTP/1.1\r\nhost: g\r\n\r\n")
    assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")
    answers: list[bytes] = []
    slow = threading.Thread(
        target=lambda: answers.append(
            raw_exchange(gateway.port, post("/v1/completions", completion(kiln_test="slow")))
        )
    )
    slow.start()
    while len(upstream.seen) < 2:
        time.sleep(0.01)
    waiter = gateway.drain(30.0)
    assert idle.recv(65536) == b""  # the idle keep-alive connection is closed
    idle.close()
    slow.join(30)
    waiter.join(30)
    assert status_of(answers[0]) == 200
    try:
        late = raw_exchange(gateway.port, b"GET /health HTTP/1.1\r\nhost: g\r\n\r\n")
    except ConnectionRefusedError:
        late = b""
    assert late == b"" or status_of(late) == 503
    assert len(upstream.seen) == 2


def _start(upstream: FakeUpstream, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    config = GatewayConfig("127.0.0.1", port, upstream.path, SERVED, 256, 32)
    argv = [sys.executable, "-m", "kiln_registry.gateway", *gateway_argv(config,
            api_key_env="KILN_GW_TEST_KEY")]  # fmt: skip
    assert all(KEY not in token for token in argv)
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _ready(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
        finally:
            conn.close()
    raise AssertionError("the gateway process did not become ready")


def test_the_gateway_process_serves_then_exits_0_on_sigterm(upstream: FakeUpstream) -> None:
    port = free_port()
    env = {**os.environ, "KILN_GW_TEST_KEY": KEY}
    process = _start(upstream, port, env)
    try:
        _ready(port, process)
        auth = b"authorization: Bearer " + KEY.encode()
        assert status_of(raw_exchange(port, post("/v1/completions", completion(), auth))) == 200
        assert status_of(raw_exchange(port, post("/v1/completions", completion()))) == 401
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert KEY.encode() not in stderr
    assert stderr.startswith(b"kiln-gateway: listening on 127.0.0.1:")


def test_bad_flags_exit_2_with_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kiln_registry.gateway", "--api-key=abc"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count(b"\n") == 1 and b"abc" not in result.stderr


def test_a_taken_port_exits_2(upstream: FakeUpstream) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        process = _start(upstream, taken.getsockname()[1], {**os.environ, "KILN_GW_TEST_KEY": KEY})
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert b"cannot listen" in stderr
