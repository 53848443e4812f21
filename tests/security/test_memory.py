"""Issue 15 attack 4: a burst of large refused job bodies does not take the server's memory.

32 clients each send a 16 MiB ``POST /v1/jobs`` body (millions of tiny
tokens, refused) at once to a real ``kiln serve`` subprocess.  Bodies beyond
the in-flight byte budget are answered 503 with ``Retry-After`` before they
are read, the others are refused before parsing; the server's peak resident
memory (``VmHWM``) stays within a bound far below the 4.7 GiB the attack
reached, and ``/health`` answers afterwards.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import httpx

from kiln_registry.api.limits import MAX_BYTES_IN_FLIGHT, MAX_JOB_REQUEST_BYTES
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import ServerProcess, write_config

CLIENTS = 32
MIB = 1 << 20
# Idle server plus the budget's bodies parsed at a small multiple of their size.
PEAK_ALLOWANCE = 8 * MAX_BYTES_IN_FLIGHT


def _body() -> bytes:
    head = b'{"kind": "teacher_scoring", "teacher": "t", "top_k": 1, "sequences": [['
    tail = b"1]]}"
    fill = MAX_JOB_REQUEST_BYTES - len(head) - len(tail)
    return head + b"1," * (fill // 2) + b" " * (fill % 2) + tail


def _vm(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"{key} missing")


def _post(port: int, body: bytes, statuses: list[int]) -> None:
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        # The server may answer and close before the whole body was sent.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + body)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    statuses.append(int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0)


def test_burst_of_large_job_bodies(tmp_path: Path, tiny_model: TinyModel) -> None:
    body = _body()
    assert len(body) == MAX_JOB_REQUEST_BYTES
    config = write_config(tmp_path, student=tiny_model.path)
    with ServerProcess(config, tmp_path / "serve.log") as server:
        server.wait_ready()
        idle = _vm(server.proc.pid, "VmRSS")
        statuses: list[int] = []
        threads = [
            threading.Thread(target=_post, args=(server.port, body, statuses))
            for _ in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        peak = _vm(server.proc.pid, "VmHWM")
        health = httpx.get(server.url + "/health", timeout=30, trust_env=False)
        assert health.status_code == 200
    assert len(statuses) == CLIENTS
    assert set(statuses) <= {400, 503, 0}, statuses
    assert 400 in statuses and 503 in statuses, statuses
    assert peak - idle < PEAK_ALLOWANCE, (peak // MIB, idle // MIB)
