"""The shared state of one claimed job: environment, claim, progress and outcome writes.

``JobEnvironment`` is what the workers need from the running registry (built
by the app's lifespan, so this package never imports the API).  ``ClaimedJob``
holds one job under its claim token and owns the short transactions that
change it: every update is conditional on the token (``ClaimLost`` when the
job is no longer this worker's), ``renew`` pushes the job's lease forward
(the worker's heartbeat), and ending a job releases its device lease in the
same transaction.  Call the blocking methods from a thread.

Imports: standard library, httpx (the type), SQLAlchemy, ``kiln_registry``'s
config, db, identity and probe types, and ``jobs``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.repository import unit_of_work
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.core.lease_repository import DeviceLeases
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.repository import JobRepository, clip_message
from kiln_registry.jobs.core.signing import CorpusSigner
from kiln_registry.probe.client import ProbeLimiter
from kiln_registry.probe.verify import StudentView

JOB_PROBE_TIMEOUT_S: Final = 60.0


@dataclass
class JobEnvironment:
    """What workers need from the running registry."""

    config: KilnConfig
    sessions: sessionmaker[Session]
    http: httpx.AsyncClient
    teacher_tls: ssl.SSLContext
    student: StudentView | None
    probe_limiter: ProbeLimiter
    # Metrics hooks (observability.metrics): a probe's (outcome, seconds, rule), and one
    # sequence written to a corpus (from the cache?, seconds its teacher requests took).
    count_probe: Callable[[str, float, str | None], None] | None = None
    count_sequence: Callable[[bool, float | None], None] | None = None
    probe_timeout_s: float = JOB_PROBE_TIMEOUT_S
    # The corpus-signing key; ``JobWorkers.start`` loads (or first creates) it.
    signer: CorpusSigner | None = None


class JobCancelled(Exception):
    """Cancellation was requested; the job ends ``cancelled``."""


class ClaimLost(Exception):
    """The job is no longer this worker's (requeued or cancelled elsewhere)."""


@dataclass
class Progress:
    """Counters shown by the API, and verified scores not yet committed to the cache."""

    scored: int = 0
    cache_hits: int = 0
    requests: int = 0
    retries: int = 0
    pending: list[tuple[str, Any]] = field(default_factory=list)  # (sha, the kind's result)
    flushed_at: float = field(default_factory=time.monotonic)

    def counters(self) -> dict[str, int]:
        return {
            "scored_count": self.scored,
            "cache_hits": self.cache_hits,
            "requests_sent": self.requests,
            "retries": self.retries,
        }


class ClaimedJob:
    """One job held under its claim token."""

    def __init__(self, env: JobEnvironment, job: JobRow, cancel: asyncio.Event) -> None:
        assert job.claim_token is not None
        self.env = env
        self.job = job
        self.token: str = job.claim_token
        self.cancel = cancel
        self.identity = TeacherIdentity.from_canonical_json(job.identity_json)
        self.progress = Progress()
        # Monotonic time until which the lease is surely still this worker's.
        self.lease_until = time.monotonic() + env.config.jobs.lease_timeout_s
        self.lost = False  # set by the heartbeat when the lease was taken over

    def renew(self) -> bool | None:
        """Heartbeat: extend the lease; None when it was lost, else the durable cancel flag."""
        timeout = self.env.config.jobs.lease_timeout_s
        started = time.monotonic()
        with unit_of_work(self.env.sessions) as session:
            flag = JobRepository(session).renew_lease(self.job.id, self.token, timeout)
        if flag is not None:
            self.lease_until = started + timeout
        return flag

    @property
    def devices(self) -> tuple[str, ...]:
        return self.env.config.jobs.devices

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise JobCancelled(self.job.id)

    def check_lease(self) -> None:
        """``ClaimLost`` unless the lease surely stays ours for one more heartbeat."""
        margin = self.env.config.jobs.lease_heartbeat_s
        if self.lost or time.monotonic() + margin >= self.lease_until:
            raise ClaimLost(self.job.id)

    def update(self, **values: object) -> None:
        with unit_of_work(self.env.sessions) as session:
            if not JobRepository(session).update_claimed(self.job.id, self.token, **values):
                raise ClaimLost(self.job.id)

    def finish(self, status: str, **values: object) -> bool:
        """End the job (terminal ``status``) and release its lease, in one transaction."""
        with unit_of_work(self.env.sessions) as session:
            done = JobRepository(session).finish(self.job.id, self.token, status, **values)
            DeviceLeases(session, self.devices).release(self.job.id, self.token)
            return done

    def fail(self, code: str, rule: str | None, message: str) -> None:
        self.finish(
            "failed",
            error_code=code,
            error_rule=rule,
            error_message=clip_message(message),
            **self.progress.counters(),
        )

    def requeue(self) -> None:
        """Shutdown mid-job: back to ``queued`` (phase a again at the next start)."""
        with unit_of_work(self.env.sessions) as session:
            JobRepository(session).release_claim(self.job.id, self.token)
            DeviceLeases(session, self.devices).release(self.job.id, self.token)

    def free_devices(self) -> int:
        with unit_of_work(self.env.sessions) as session:
            return DeviceLeases(session, self.devices).free_count()

    def lease(self, now: str) -> str | None:
        """Phase c: take a free device and record it; None when all are held."""
        with unit_of_work(self.env.sessions) as session:
            device = DeviceLeases(session, self.devices).acquire(self.job.id, self.token)
            if device is None:
                return None
            if not JobRepository(session).update_claimed(
                self.job.id, self.token, device=device, leased_at=now
            ):
                raise ClaimLost(self.job.id)
            return device
