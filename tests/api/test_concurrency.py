"""Fifty concurrent registrations of one alias: exactly one succeeds.

The decision (documented in ``teachers.registration``): nothing is reserved before
the probes pass, so the ``teachers`` primary key decides which of the
registrations that passed their probes wins; the others get
``teacher_alias_exists`` (409).  Registrations beyond the probe limiter's two
in-flight slots get ``teacher_identity_probe_busy`` (503, ``Retry-After: 5``)
without touching the teacher; retried, they get 409.

A gate in front of the reference teacher holds the discovery requests until
the expected number arrived, so the probes really overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.client import ProbeLimiter
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.model import ReferenceTeacher
from tests.api.support import RegistryServer, remote
from tests.helpers import serve_app

CONCURRENT = 50
GATE_DEADLINE_S = 10.0
Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]


class Gate:
    """ASGI wrapper: the first ``n`` completion requests wait until all ``n`` arrived."""

    def __init__(self, app: ASGI, n: int) -> None:
        self.app, self.n, self.arrived = app, n, 0
        self.event: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/completions" and self.arrived < self.n:
            self.event = self.event or asyncio.Event()
            self.arrived += 1
            if self.arrived == self.n:
                self.event.set()
            with contextlib.suppress(TimeoutError):  # a missing request must not hang the test
                await asyncio.wait_for(self.event.wait(), GATE_DEADLINE_S)
        await self.app(scope, receive, send)


async def _register_all(url: str, body: dict[str, object]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=CONCURRENT + 5)
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False, limits=limits) as http:
        return list(await asyncio.gather(*(http.post("/v1/teachers", json=body)
                                           for _ in range(CONCURRENT))))  # fmt: skip


def _outcomes(responses: list[httpx.Response]) -> Counter[tuple[int, str]]:
    counts: Counter[tuple[int, str]] = Counter()
    for response in responses:
        code = "ok" if response.status_code == 200 else response.json()["error"]["code"]
        counts[(response.status_code, code)] += 1
        if response.status_code == 503:
            assert response.headers["retry-after"] == "5"
    return counts


def _only_one_row(registry: RegistryServer) -> None:
    with registry.client() as http:
        teachers = http.get("/v1/teachers").json()["teachers"]
        receipts = http.get("/v1/teachers/same/receipts").json()["receipts"]
    assert [t["spec"]["alias"] for t in teachers] == ["same"]
    assert len(receipts) == 1


def test_fifty_concurrent_registrations_with_the_default_limiter(
    registry: RegistryServer, reference: tuple[ReferenceTeacher, TeacherIdentity]
) -> None:
    gated = Gate(create_reference_app(reference[0], api_key_env=None), n=2)
    with serve_app(gated) as url:
        responses = asyncio.run(_register_all(registry.url, remote("same", url)))
    counts = _outcomes(responses)
    assert counts[(200, "ok")] == 1, counts
    assert set(counts) <= {(200, "ok"), (409, "teacher_alias_exists"),
                           (503, "teacher_identity_probe_busy")}, counts  # fmt: skip
    assert counts[(503, "teacher_identity_probe_busy")] >= 1
    _only_one_row(registry)


def test_fifty_passed_probes_race_to_the_primary_key(
    registry: RegistryServer, reference: tuple[ReferenceTeacher, TeacherIdentity]
) -> None:
    registry.ctx.probe_limiter = ProbeLimiter(max_in_flight=CONCURRENT)
    gated = Gate(create_reference_app(reference[0], api_key_env=None), n=CONCURRENT)
    with serve_app(gated) as url:
        responses = asyncio.run(_register_all(registry.url, remote("same", url)))
    assert gated.arrived == CONCURRENT  # every registration passed the early lookup
    counts = _outcomes(responses)
    assert counts == {(200, "ok"): 1, (409, "teacher_alias_exists"): CONCURRENT - 1}, counts
    # All fifty probes passed: the INSERT, not a lookup, turned 49 of them away.
    assert registry.ctx.metrics.probe_counts() == {"passed": CONCURRENT}
    _only_one_row(registry)
