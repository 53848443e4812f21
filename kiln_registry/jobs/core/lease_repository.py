"""Exclusive device leases, one job per ``[jobs] devices`` entry of a host: their SQL.

A lease is a ``device_leases`` row whose primary key is ``(host, device)``
(the host name of the worker that took it), so two jobs can never hold one
device of one host: the second INSERT violates the key and the caller tries
the next device.  Workers on different hosts have their own devices.
Leases are taken only after a job's probes pass (phase c) and released when
the job ends, in the same transaction as the job's final state where
possible.  A lease whose job is no longer held under the claim that took it
(the job ended, was requeued or its lease expired and was taken over) is an
orphan: ``release_orphans`` drops those, at a worker's start and whenever
expired jobs are requeued.

Imports: the standard library, SQLAlchemy, ``kiln_registry.db`` and
``jobs.core.models``.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from sqlalchemy import and_, delete, exists, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kiln_registry.db.models import utc_timestamp
from kiln_registry.db.repository import is_unique_violation
from kiln_registry.domain.vocabulary import ACTIVE_JOB_STATUSES
from kiln_registry.jobs.core.models import DeviceLeaseRow, JobRow


class DeviceLeases:
    """Lease operations within the caller's session and transaction."""

    def __init__(self, session: Session, devices: Sequence[str], host: str | None = None) -> None:
        self._session = session
        self._devices = tuple(devices)
        self.host = socket.gethostname() if host is None else host

    def held(self) -> dict[str, str]:
        """Device -> job id for every current lease on this host (configured devices only)."""
        query = select(DeviceLeaseRow.device, DeviceLeaseRow.job_id).where(
            DeviceLeaseRow.host == self.host
        )
        rows = self._session.execute(query).all()
        return {device: job for device, job in rows if device in self._devices}

    def free_count(self) -> int:
        return len(self._devices) - len(self.held())

    def acquire(self, job_id: str, claim_token: str) -> str | None:
        """Lease the first free device to ``job_id``; None when every device is held."""
        held = self.held()
        for device in self._devices:
            if device in held:
                continue
            row = DeviceLeaseRow(
                host=self.host, device=device, job_id=job_id, claim_token=claim_token,
                acquired_at=utc_timestamp(),
            )  # fmt: skip
            try:
                with self._session.begin_nested():
                    self._session.add(row)
            except IntegrityError as exc:  # the primary key (host, device) is taken
                if not is_unique_violation(exc):
                    raise
                continue
            return device
        return None

    def release(self, job_id: str, claim_token: str) -> int:
        """Drop the leases held by this claim; the count released."""
        result = self._session.execute(
            delete(DeviceLeaseRow).where(
                DeviceLeaseRow.job_id == job_id, DeviceLeaseRow.claim_token == claim_token
            )
        )
        return int(getattr(result, "rowcount", 0))

    def release_orphans(self) -> int:
        """Drop every lease (any host) whose job is no longer active under its claim token."""
        holder = exists().where(
            and_(
                JobRow.id == DeviceLeaseRow.job_id,
                JobRow.claim_token == DeviceLeaseRow.claim_token,
                JobRow.status.in_(ACTIVE_JOB_STATUSES),
            )
        )
        result = self._session.execute(
            delete(DeviceLeaseRow).where(~holder).execution_options(synchronize_session=False)
        )
        return int(getattr(result, "rowcount", 0))

    def count(self) -> int:
        return len(self._session.execute(select(DeviceLeaseRow.device)).all())
