"""Worker heartbeats and the queue's liveness view: is anyone going to run a queued job?

Each worker process (``kiln worker``, or the workers embedded in ``kiln serve``)
keeps one ``job_workers`` row (revision ``0012_ux2_worker_heartbeats``): written
at start, its ``seen_at`` renewed every ``[jobs] lease_heartbeat_s``, deleted on
a clean stop.  A row renewed within ``[jobs] lease_timeout_s`` is a live worker;
an older one is a worker that died without stopping (SIGKILL, a lost host), and
is deleted by the next beat of any worker once it is ``STALE_FACTOR`` timeouts
old (one bounded DELETE).  Time is judged on the database's clock
(``jobs.repository.database_time``), as leases are.

``queue_liveness`` is what ``/ready``, ``/metrics``, the job view and the
dashboard show: live workers, queued jobs and the age of the oldest queued one,
and the one sentence (``NO_WORKER``) a queued job carries while no worker is
alive.  Imports the standard library, SQLAlchemy, ``db.models`` and ``jobs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from kiln_registry.db.models import TIMESTAMP_FORMAT
from kiln_registry.domain.vocabulary import JobStatus
from kiln_registry.jobs.core.models import JobRow, WorkerRow
from kiln_registry.jobs.core.repository import database_time

STALE_FACTOR: Final = 10  # a dead worker's row is dropped after ten lease timeouts
NO_WORKER: Final = "no worker has claimed this job; start `kiln worker`"


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """What a worker records about itself."""

    worker_id: str
    host: str
    pid: int
    slots: int


@dataclass(frozen=True, slots=True)
class QueueLiveness:
    """Live workers, queued jobs and how long the oldest queued job has waited."""

    live_workers: int
    queued: int
    oldest_queued_age_s: float | None

    @property
    def stalled(self) -> bool:
        """Jobs wait and no worker is alive to claim them."""
        return self.live_workers == 0 and self.queued > 0

    def warning(self) -> str | None:
        """The operator's sentence while jobs wait for a worker that is not there."""
        if not self.stalled:
            return None
        return f"{self.queued} job(s) queued and no live job worker: start `kiln worker`"


class WorkerBeats:
    """Heartbeat rows within the caller's session and transaction."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def beat(self, worker: WorkerSlot, *, timeout_s: float) -> None:
        """Renew (or create) this worker's row; drop rows dead for ``STALE_FACTOR`` timeouts."""
        now = database_time(self._session)
        renewed = self._session.execute(
            update(WorkerRow).where(WorkerRow.worker_id == worker.worker_id).values(seen_at=now)
        )
        if not getattr(renewed, "rowcount", 0):
            row = {
                "worker_id": worker.worker_id, "host": worker.host, "pid": worker.pid,
                "slots": worker.slots, "started_at": now, "seen_at": now,
            }  # fmt: skip
            self._session.execute(insert(WorkerRow).values(**row))
        cutoff = database_time(self._session, -timeout_s * STALE_FACTOR)
        self._session.execute(delete(WorkerRow).where(WorkerRow.seen_at < cutoff))

    def forget(self, worker_id: str) -> None:
        """A clean stop: this worker is gone at once, not after a timeout."""
        self._session.execute(delete(WorkerRow).where(WorkerRow.worker_id == worker_id))

    def live_count(self, *, timeout_s: float) -> int:
        cutoff = database_time(self._session, -timeout_s)
        query = select(func.count()).select_from(WorkerRow).where(WorkerRow.seen_at >= cutoff)
        return int(self._session.scalar(query) or 0)


def _age_s(created_at: str | None) -> float | None:
    if created_at is None:
        return None
    then = datetime.strptime(created_at, TIMESTAMP_FORMAT).replace(tzinfo=UTC)
    return max(0.0, round((datetime.now(UTC) - then).total_seconds(), 3))


def queue_liveness(session: Session, *, timeout_s: float) -> QueueLiveness:
    """Live workers and the queue's backlog, in two indexed reads."""
    queued = JobRow.status == JobStatus.queued
    count, oldest = session.execute(
        select(func.count(), func.min(JobRow.created_at)).where(queued)
    ).one()
    return QueueLiveness(
        live_workers=WorkerBeats(session).live_count(timeout_s=timeout_s),
        queued=int(count or 0),
        oldest_queued_age_s=_age_s(oldest),
    )


def waiting_note(status: str, live_workers: int | None) -> str | None:
    """``NO_WORKER`` for a queued job while no worker is alive, else None."""
    if status == JobStatus.queued and live_workers == 0:
        return NO_WORKER
    return None
