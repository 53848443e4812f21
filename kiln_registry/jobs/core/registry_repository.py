"""The jobs' SQL on rows outside the queue: a replica's fence and the ``/metrics`` counts.

``fence_replica`` marks an alias's ``teacher_replicas`` row ``unavailable``
("fenced by job ..."), so the entry shows it and later jobs skip the replica
until a re-probe proves it again.  ``registry_counts`` returns teachers and
jobs by status (every status, zero included) and the device leases held,
each with one grouped ``SELECT``.  Like the other repositories these take the
caller's session and never commit.

Imports: SQLAlchemy, ``kiln_registry.db.models``, ``domain`` and ``jobs.core.models``.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from kiln_registry.db.models import TeacherReplicaRow, TeacherRow, utc_timestamp
from kiln_registry.domain.text import clipped
from kiln_registry.domain.vocabulary import JobStatus, TeacherStatus
from kiln_registry.jobs.core.models import DeviceLeaseRow, JobRow

FENCE_REASON_CHARS: Final = 300  # a fence's reason as recorded on the replica (x2)


def fence_replica(session: Session, alias: str, idx: int, job_id: str, reason: str) -> None:
    """The alias's replica is ``unavailable``: fenced by ``job_id`` for ``reason`` (no secret)."""
    replica = session.get(TeacherReplicaRow, (alias, idx))
    if replica is None:
        return  # the alias was deleted meanwhile
    replica.status = "unavailable"
    replica.status_message = clipped(f"fenced by job {job_id}: {reason}", 2 * FENCE_REASON_CHARS)
    replica.checked_at = utc_timestamp()


def _grouped(session: Session, column: InstrumentedAttribute[str]) -> dict[str, int]:
    rows = session.execute(select(column, func.count()).group_by(column)).all()
    return {str(key): int(count) for key, count in rows}


def registry_counts(session: Session) -> tuple[dict[str, int], dict[str, int], int]:
    """``(teachers by status, jobs by status, device leases held)`` behind the ``/metrics``
    gauges: every status (zero included), each with one grouped ``SELECT``."""
    teachers = dict.fromkeys([s.value for s in TeacherStatus], 0)
    teachers |= _grouped(session, TeacherRow.status)
    jobs = dict.fromkeys([s.value for s in JobStatus], 0) | _grouped(session, JobRow.status)
    leases = int(session.scalar(select(func.count()).select_from(DeviceLeaseRow)) or 0)
    return teachers, jobs, leases
