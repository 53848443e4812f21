"""Issues 15 (attack 5) and 27 (item 7): probe slots are shared fairly, never starved.

A real registry (``auth = "required"``) and a real TCP server that accepts
and never answers, so every flood registration holds its probe slot until the
probe times out.  Two flooding tokens send many hanging registrations at
once: they hold the three general slots, each token runs two registrations
at a time while its others wait their turn, and the surplus past a token's
queue is ``429 caller_busy`` with ``Retry-After``.
An admin still gets the reserved slot at once; another token's registration
waits and takes the first slot that comes free, ahead of the flood queued
before it (each freed slot goes to the waiting caller with the fewest probes
in flight).  The job workers' probe capacity is separate and untouched.
Ordering is asserted by what had finished, never by a clock.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kiln_registry.api.context import REGISTRATION_PROBES, REGISTRATION_PROBES_PER_CALLER
from kiln_registry.auth.gate import MAX_ACTIVE, MAX_WAITING
from kiln_registry.probe.limiter import ProbeCaller, ProbeLimiter
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config
from tests.auth.support import bearer, create_token
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
def slow_registry(
    tmp_path: Path, tiny_model: TinyModel
) -> Iterator[tuple[RegistryServer, dict[str, str]]]:
    server = {"probe_timeout_s": 2.0, "auth": "required"}
    config = write_config(tmp_path, student=tiny_model.path, server=server)
    db = tmp_path / "registry.db"
    tokens = {name: create_token(db, name, {"register", "read"}) for name in ("f1", "f2", "legit")}
    tokens["root"] = create_token(db, "root", {"admin"})
    with run_registry(config) as registry:
        yield registry, tokens


def _remote(alias: str, url: str) -> dict[str, str]:
    return {"alias": alias, "kind": "remote", "provider": "vllm", "model_id": "m", "url": url}


def _wait_for(condition: object, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_a_flood_cannot_starve_other_callers_or_the_admin(
    slow_registry: tuple[RegistryServer, dict[str, str]],
    hanging_url: str,
    counting_teacher: CountingTeacher,
) -> None:
    registry, t = slow_registry
    limiter = registry.ctx.probe_limiter
    done: list[httpx.Response] = []

    def flood(token: str, alias: str) -> None:
        with registry.client() as http:
            done.append(http.post("/v1/teachers", json=_remote(alias, hanging_url),
                                  headers=bearer(token)))  # fmt: skip

    per_token = {"f1": MAX_ACTIVE + MAX_WAITING + 2, "f2": 2 * MAX_ACTIVE}
    threads = [
        threading.Thread(target=flood, args=(t[name], f"{name}-{n}"))
        for name, count in per_token.items()
        for n in range(count)
    ]
    for thread in threads:
        thread.start()
    general = REGISTRATION_PROBES - 1
    _wait_for(lambda: limiter.in_flight == general and limiter.waiting == 1 and len(done) == 2)
    try:
        # Two tokens of two running registrations each: three general slots, one waiting.
        assert (limiter.in_flight, limiter.waiting) == (general, 1)
        refused = list(done)  # f1's surplus past its turn queue, refused at once
        assert [r.status_code for r in refused] == [429, 429], [r.text for r in refused]
        assert all(error_of(r)["code"] == "caller_busy" for r in refused)
        assert all(int(r.headers["retry-after"]) > 0 for r in refused)
        with registry.client() as http:
            # The admin's reserved slot: answered before any flood probe has finished.
            admin = http.post("/v1/teachers", json=_remote("a1", counting_teacher.url + "/v1"),
                              headers=bearer(t["root"]))  # fmt: skip
            assert admin.status_code == 502, admin.text  # it got a slot and probed
            assert len(done) == len(refused)
            # Another token is not starved: it gets a slot in the first freed wave.
            legit = http.post("/v1/teachers", json=_remote("l1", counting_teacher.url + "/v1"),
                              headers=bearer(t["legit"]))  # fmt: skip
            assert legit.status_code == 502, legit.text
            assert len(done) - len(refused) <= general
        assert len(counting_teacher.requests) >= 2
        # The job workers' probe capacity is separate and untouched.
        assert registry.ctx.job_probe_limiter is not limiter
        assert registry.ctx.job_probe_limiter.in_flight == 0
    finally:
        for thread in threads:
            thread.join(120)
    statuses = sorted(r.status_code for r in done)
    assert statuses == [429] * 2 + [502] * (sum(per_token.values()) - 2)
    assert REGISTRATION_PROBES_PER_CALLER == MAX_ACTIVE


async def _fair_order() -> list[str]:
    """Which caller each freed slot went to, with one caller flooding the queue."""
    limiter = ProbeLimiter(2, 2, max_waiting=32, max_waiting_per_caller=8)
    flood, legit = ProbeCaller("token:flood"), ProbeCaller("token:legit")
    release = asyncio.Event()
    order: list[str] = []

    async def probe(caller: ProbeCaller) -> None:
        async with limiter.turn(caller):
            order.append(caller.key)
            await release.wait()

    tasks = [asyncio.create_task(probe(flood)) for _ in range(6)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(probe(legit)))  # arrives after four flood waiters
    await asyncio.sleep(0)
    assert (limiter.in_flight, limiter.waiting) == (2, 5)
    release.set()
    await asyncio.gather(*tasks)
    return order


def test_freed_slots_go_to_the_caller_with_fewest_in_flight() -> None:
    """Fair order, on the registry's own limiter: not first come, first served."""
    order = asyncio.run(_fair_order())
    assert order[2] == "token:legit", order  # the first freed slot, ahead of the flood
