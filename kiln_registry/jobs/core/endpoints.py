"""The proved teacher endpoints of one job: one URL, or a replica set spread with fencing.

Every job kind's phase (d) sends its requests through ``JobTeachers.call``.
For an alias registered with one URL the job has one endpoint, and a request
that fails fails the job as the kind's pipeline says.  A job on an alias
registered with ``urls`` proves every replica the registry lists as
``verified`` in phase (b) (both probes, pinned to the job's identity,
concurrently; ``jobs.runner``), and only the replicas that passed enter the
pool: one ``TeacherWire`` each.  Requests go round-robin to the replicas
still standing, whatever the job's kind.  A replica is FENCED for the rest of
the job when a request to it fails after the kind's retries (transport
failures, 503) or an answer does not verify against the pinned identity (a
changed fingerprint above all): the row is sent again to another replica,
and ``settle`` re-requests, before the row is written, every result of a
fenced replica that was not yet written to the corpus (results are written
in input order), including one that arrives after the fence.  So the corpus
only holds answers verified against the one pinned identity, from replicas
standing when the answer was written.  The job fails closed
(``job.replicas_exhausted``, every fence reason named) only when no replica
remains.

A fence is also recorded on the alias's ``teacher_replicas`` row through the
caller's hook (``jobs.core.registry_repository.fence_replica``), so the entry shows
it and later jobs skip the replica until a re-probe proves it again.  Every such
write finishes before the pool is left, even one whose request was cancelled when
another failure ended the job: the job's end is never recorded before its fences.

Imports: standard library, ``kiln_registry.db.models``/``domain``/
``credentials``, ``probe.wire``; no job kind, API or FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from kiln_registry.credentials.resolve import ResolvedTeacher
from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.errors import KilnError, ProbeFailed
from kiln_registry.domain.text import clipped
from kiln_registry.probe.client import SecretSource
from kiln_registry.probe.wire import TeacherWire

log = logging.getLogger("kiln_registry.jobs")

EXHAUSTED_RULE: Final = "job.replicas_exhausted"
REASON_CHARS: Final = 300
REPLICA_VERIFIED: Final = "verified"

FenceHook = Callable[[int, str], None]  # (replica index, reason): e.g. record it on the alias
ResultT = TypeVar("ResultT")


def verified_replicas(row: TeacherRow) -> list[tuple[int, str]]:
    """The (index, URL) of every replica the registry lists as verified; [] for one URL."""
    if not row.replicas:
        return []
    found = [(r.idx, r.url) for r in row.replicas if r.status == REPLICA_VERIFIED]
    if not found:
        raise ProbeFailed(
            f"no replica of alias {row.alias!r} is verified in the registry",
            rule=EXHAUSTED_RULE,
            hint="re-probe the alias (POST /v1/teachers/{alias}/probe) once its replicas"
            " serve the registered identity, then submit the job again",
        )
    return found


@dataclass
class Endpoint:
    """One proved endpoint of the job: ``idx`` is its replica index (None for one URL)."""

    slot: int
    idx: int | None
    resolved: ResolvedTeacher
    wire: TeacherWire | None = None
    fenced: str | None = None

    @property
    def secret(self) -> SecretSource | None:
        return self.resolved.secret

    def open_wire(self) -> TeacherWire:
        assert self.wire is not None, "enter JobTeachers first"
        return self.wire


class JobTeachers:
    """The job's proved endpoints: one wire each; round-robin and fencing over replicas."""

    def __init__(
        self,
        proved: Sequence[tuple[int | None, ResolvedTeacher]],
        *,
        alias: str,
        tls: ssl.SSLContext,
        max_idle: int,
        on_fence: FenceHook,
    ) -> None:
        if not proved:
            raise ValueError("a job needs at least one proved endpoint")
        self.alias = alias
        self.endpoints = [Endpoint(slot, idx, res) for slot, (idx, res) in enumerate(proved)]
        self.pooled = proved[0][0] is not None  # a replica set (fencing), else one URL
        self._tls, self._max_idle = tls, max_idle
        self._on_fence = on_fence
        self._next = 0
        self._origin: dict[int, int] = {}  # row key -> endpoint slot, until the row is written
        self._stack = contextlib.AsyncExitStack()
        self._fence_writes: list[asyncio.Future[None]] = []  # one per replica at most
        self.fences: list[str] = []

    async def __aenter__(self) -> JobTeachers:
        for endpoint in self.endpoints:
            url = endpoint.resolved.endpoint.completions_url
            endpoint.wire = await self._stack.enter_async_context(
                TeacherWire(url, tls=self._tls, max_idle=self._max_idle)
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            # A request cancelled by another's failure leaves its fence's write running.
            for outcome in await asyncio.gather(*self._fence_writes, return_exceptions=True):
                if isinstance(outcome, Exception):
                    log.error("alias %r: a fence was not recorded: %s", self.alias,
                              type(outcome).__name__)  # fmt: skip
        finally:
            await self._stack.aclose()

    def standing(self) -> list[Endpoint]:
        return [e for e in self.endpoints if e.fenced is None]

    async def fence(self, endpoint: Endpoint, exc: KilnError) -> None:
        """Take a replica out of the job; the hook records why (never a secret)."""
        if endpoint.fenced is not None or endpoint.idx is None:
            return
        reason = clipped(str(exc), REASON_CHARS)
        endpoint.fenced = reason
        self.fences.append(f"replica {endpoint.idx}: {reason}")
        log.warning("alias %r: replica %d fenced: %s", self.alias, endpoint.idx, reason)
        write = asyncio.ensure_future(asyncio.to_thread(self._on_fence, endpoint.idx, reason))
        self._fence_writes.append(write)
        await asyncio.shield(write)  # cancelled, the write still ends (``__aexit__`` waits)

    def _choose(self) -> Endpoint | None:
        standing = self.standing()
        if not standing:
            return None
        self._next = (self._next + 1) % len(standing)
        return standing[self._next]

    def exhausted(self) -> ProbeFailed:
        return ProbeFailed(
            f"no verified replica of alias {self.alias!r} remains: {'; '.join(self.fences)}",
            rule=EXHAUSTED_RULE,
            hint="bring the replicas back with the pinned identity, re-probe the alias"
            " (POST /v1/teachers/{alias}/probe), then submit the job again",
        )

    async def call(self, key: int, request: Callable[[Endpoint], Awaitable[ResultT]]) -> ResultT:
        """``request`` on the one endpoint, or on a standing replica, fencing each that
        fails; the answering replica is remembered for ``key`` until ``settle``."""
        if not self.pooled:
            return await request(self.endpoints[0])
        for _ in range(len(self.endpoints) + 1):  # every failed attempt fences one replica
            endpoint = self._choose()
            if endpoint is None:
                break
            try:
                result = await request(endpoint)
            except KilnError as exc:
                await self.fence(endpoint, exc)
                continue
            self._origin[key] = endpoint.slot
            return result
        raise self.exhausted()

    async def settle(
        self, key: int, result: ResultT, again: Callable[[], Awaitable[ResultT]]
    ) -> ResultT:
        """The row's result from a replica not fenced now; else requested ``again``."""
        if not self.pooled:
            return result
        for _ in range(len(self.endpoints) + 1):  # each redo follows one more fence
            if self.endpoints[self._origin.pop(key)].fenced is None:
                return result
            result = await again()
        raise self.exhausted()
