"""Phase (d) over a replica-set alias: sequences spread over verified replicas, with fencing.

A job on an alias registered with ``urls`` proves every replica the registry
lists as ``verified`` in phase (b) (both probes, pinned to the job's
identity; ``jobs.runner``), and only the replicas that passed enter the
``ReplicaPool``: one ``TeacherWire`` and ``ScoringTarget`` each (the same
pinned identity, model id and K).  Sequences go round-robin to the replicas
still standing.  A replica is FENCED for the rest of the job when a request
to it fails after the retries of ``jobs.scoring.target`` (transport failures, 503)
or an answer does not verify against the pinned identity (a changed
fingerprint above all): the sequence is sent again to another replica, and
``ReplicaScoringPipeline`` re-requests, before writing it, every result of a
fenced replica that was not yet written to the corpus (results are written
in input order), including one that arrives after the fence.  So the corpus
only holds answers verified against the one pinned identity, from replicas
standing when the answer was written.  The job fails closed
(``job.replicas_exhausted``, every fence reason named) only when no replica
remains.

A fence is also recorded on the alias's ``teacher_replicas`` row
(``unavailable``, "fenced by job ..."), so the entry shows it and later jobs
skip the replica until a re-probe proves it again.

Imports: standard library, numpy, SQLAlchemy's session type,
``kiln_registry.db``/``domain``/``identity``/``credentials``, ``probe.wire``
and ``jobs``; no API or FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from sqlalchemy.orm import Session

from kiln_registry.credentials.resolve import ResolvedTeacher
from kiln_registry.db.models import TeacherReplicaRow, TeacherRow, utc_timestamp
from kiln_registry.domain.errors import KilnError, ProbeFailed
from kiln_registry.domain.text import clipped
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.core.repository import SequenceItem
from kiln_registry.jobs.core.state import ClaimedJob
from kiln_registry.jobs.scoring.cache import ScoredSequence
from kiln_registry.jobs.scoring.pipeline import ScoringPipeline, _tokens
from kiln_registry.jobs.scoring.target import ScoringTarget, score_sequence
from kiln_registry.probe.wire import TeacherWire

log = logging.getLogger("kiln_registry.jobs")

EXHAUSTED_RULE: Final = "job.replicas_exhausted"
REASON_CHARS: Final = 300

FenceHook = Callable[[int, str], None]  # (replica index, reason): e.g. record it on the alias


REPLICA_VERIFIED: Final = "verified"


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


def mark_replica_fenced(session: Session, alias: str, idx: int, job_id: str, reason: str) -> None:
    """The replica is ``unavailable``: fenced by ``job_id`` for ``reason`` (no secret)."""
    replica = session.get(TeacherReplicaRow, (alias, idx))
    if replica is None:
        return  # the alias was deleted meanwhile
    replica.status = "unavailable"
    replica.status_message = clipped(f"fenced by job {job_id}: {reason}", 2 * REASON_CHARS)
    replica.checked_at = utc_timestamp()


@dataclass
class Replica:
    """One proved replica of the job's alias."""

    idx: int
    resolved: ResolvedTeacher
    target: ScoringTarget | None = None
    fenced: str | None = None


class ReplicaPool:
    """The proved replicas of one job: round-robin choice, fencing, one wire each."""

    def __init__(
        self,
        replicas: Sequence[tuple[int, ResolvedTeacher]],
        *,
        alias: str,
        identity: TeacherIdentity,
        model_id: str,
        k: int,
        tls: ssl.SSLContext,
        max_idle: int,
        on_fence: FenceHook,
    ) -> None:
        if not replicas:
            raise ValueError("a replica pool needs at least one proved replica")
        self.alias = alias
        self.replicas = [Replica(idx, resolved) for idx, resolved in replicas]
        self._spec = (identity, model_id, k)
        self._tls, self._max_idle = tls, max_idle
        self._on_fence = on_fence
        self._next = 0
        self._stack = contextlib.AsyncExitStack()
        self.fences: list[str] = []

    async def __aenter__(self) -> ReplicaPool:
        identity, model_id, k = self._spec
        for replica in self.replicas:
            url = replica.resolved.endpoint.completions_url
            wire = await self._stack.enter_async_context(
                TeacherWire(url, tls=self._tls, max_idle=self._max_idle)
            )
            replica.target = ScoringTarget(
                wire=wire, model_id=model_id, secret=replica.resolved.secret,
                identity=identity, k=k,
            )  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def first_target(self) -> ScoringTarget:
        target = self.replicas[0].target
        assert target is not None, "enter the pool first"
        return target

    def is_fenced(self, idx: int) -> bool:
        return any(r.idx == idx and r.fenced is not None for r in self.replicas)

    def standing(self) -> list[Replica]:
        return [r for r in self.replicas if r.fenced is None]

    async def fence(self, replica: Replica, exc: KilnError) -> None:
        """Take ``replica`` out of the job; the hook records why (never a secret)."""
        if replica.fenced is not None:
            return
        reason = clipped(str(exc), REASON_CHARS)
        replica.fenced = reason
        self.fences.append(f"replica {replica.idx}: {reason}")
        log.warning("alias %r: replica %d fenced: %s", self.alias, replica.idx, reason)
        await asyncio.to_thread(self._on_fence, replica.idx, reason)

    def _choose(self) -> Replica | None:
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

    async def score(
        self,
        tokens: np.ndarray[Any, Any],
        on_request: Callable[[], None],
        on_retry: Callable[[], None],
    ) -> tuple[ScoredSequence, int]:
        """Score on a standing replica, fencing each that fails; (result, replica index)."""
        for _ in range(len(self.replicas) + 1):  # every failed attempt fences one replica
            replica = self._choose()
            if replica is None:
                break
            assert replica.target is not None, "enter the pool first"
            try:
                result = await score_sequence(
                    replica.target, tokens, on_request=on_request, on_retry=on_retry
                )
            except KilnError as exc:
                await self.fence(replica, exc)
                continue
            return result, replica.idx
        raise self.exhausted()


class ReplicaScoringPipeline(ScoringPipeline):
    """``ScoringPipeline`` whose requests go to a ``ReplicaPool``; fenced results redone."""

    def __init__(self, claimed: ClaimedJob, pool: ReplicaPool) -> None:
        super().__init__(claimed, pool.first_target())
        self.pool = pool
        self._origin: dict[int, int] = {}  # row idx -> replica idx, until the row is written

    async def _request(self, row: SequenceItem) -> ScoredSequence:
        result, origin = await self.pool.score(_tokens(row), self.count_request, self.count_retry)
        self._origin[row.idx] = origin
        return result

    async def _settle(self, row: SequenceItem, result: ScoredSequence) -> ScoredSequence:
        """The row's result from a replica not fenced now; else requested again."""
        for _ in range(len(self.pool.replicas) + 1):  # each redo follows one more fence
            if not self.pool.is_fenced(self._origin.pop(row.idx)):
                return result
            result = await self._one(row)
        raise self.pool.exhausted()
