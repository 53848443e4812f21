"""Read-only counts behind the ``/metrics`` gauges (one short read transaction).

``registry_counts`` returns teachers and jobs by status (every status, zero
included) and the device leases held, each with one grouped
``SELECT``; like the other repositories, the SQL lives here and nowhere in
the API.  Imports SQLAlchemy, ``db.models``, ``jobs.core.models`` and
``kiln_registry.domain.vocabulary``.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.vocabulary import JobStatus, TeacherStatus
from kiln_registry.jobs.core.models import DeviceLeaseRow, JobRow


def _grouped(session: Session, column: InstrumentedAttribute[str]) -> dict[str, int]:
    rows = session.execute(select(column, func.count()).group_by(column)).all()
    return {str(key): int(count) for key, count in rows}


def registry_counts(session: Session) -> tuple[dict[str, int], dict[str, int], int]:
    """``(teachers by status, jobs by status, device leases held)``."""
    teachers = dict.fromkeys([s.value for s in TeacherStatus], 0)
    teachers |= _grouped(session, TeacherRow.status)
    jobs = dict.fromkeys([s.value for s in JobStatus], 0) | _grouped(session, JobRow.status)
    leases = int(session.scalar(select(func.count()).select_from(DeviceLeaseRow)) or 0)
    return teachers, jobs, leases
