"""Issue 15 attack 5: teachers that never answer cannot starve other callers or jobs.

A real registry and a real TCP server that accepts and never answers.  One
caller (client address 127.0.0.1) holds its share of the registration probe
slots with two hanging registrations; its third is ``503
teacher_identity_probe_busy`` while another caller (127.0.0.2) still gets a
slot, and the job workers' probe capacity is separate and untouched.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kiln_registry.api.context import REGISTRATION_PROBES_PER_CALLER
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config
from tests.security.conftest import CountingTeacher


@pytest.fixture
def hanging_url() -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)  # read nothing, answer nothing

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


@pytest.fixture
def slow_registry(tmp_path: Path, tiny_model: TinyModel) -> Iterator[RegistryServer]:
    config = write_config(tmp_path, student=tiny_model.path, server={"probe_timeout_s": 4.0})
    with run_registry(config) as server:
        yield server


def _remote(alias: str, url: str) -> dict[str, str]:
    return {"alias": alias, "kind": "remote", "provider": "vllm", "model_id": "m", "url": url}


def test_one_caller_cannot_take_every_probe_slot(
    slow_registry: RegistryServer, hanging_url: str, counting_teacher: CountingTeacher
) -> None:
    results: list[int] = []

    def hang(alias: str) -> None:
        with slow_registry.client() as http:
            results.append(http.post("/v1/teachers", json=_remote(alias, hanging_url)).status_code)

    threads = [
        threading.Thread(target=hang, args=(f"h{n}",))
        for n in range(REGISTRATION_PROBES_PER_CALLER)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    limiter = slow_registry.ctx.probe_limiter
    while limiter.in_flight < REGISTRATION_PROBES_PER_CALLER and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert limiter.in_flight == REGISTRATION_PROBES_PER_CALLER
        with slow_registry.client() as http:
            third = http.post("/v1/teachers", json=_remote("h-more", hanging_url))
        assert third.status_code == 503, third.text
        assert error_of(third)["code"] == "teacher_identity_probe_busy"
        other = httpx.Client(
            base_url=slow_registry.url,
            trust_env=False,
            timeout=30,
            transport=httpx.HTTPTransport(local_address="127.0.0.2"),
        )
        with other:
            answer = other.post("/v1/teachers", json=_remote("b1", counting_teacher.url + "/v1"))
        assert answer.status_code == 502, answer.text  # it got a slot and probed
        assert counting_teacher.requests
        # The job workers' probe capacity is separate and untouched.
        assert slow_registry.ctx.job_probe_limiter is not limiter
        assert slow_registry.ctx.job_probe_limiter.in_flight == 0
    finally:
        for thread in threads:
            thread.join(30)
    assert results == [502] * REGISTRATION_PROBES_PER_CALLER
