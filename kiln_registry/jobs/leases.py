"""Exclusive device leases: one job per ``[jobs] devices`` entry, enforced by SQLite.

A lease is a ``device_leases`` row whose primary key is the device name, so
two jobs can never hold one device: the second INSERT violates the key and
the caller tries the next device.  Leases are taken only after a job's
probes pass (phase c) and released when the job ends, in the same
transaction as the job's final state where possible.  At start-up every
lease is dropped, because the jobs holding them are requeued (one registry
server per database file).

Imports: the standard library, SQLAlchemy, ``kiln_registry.db`` and
``jobs.models``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kiln_registry.db.models import utc_timestamp
from kiln_registry.jobs.models import DeviceLeaseRow


class DeviceLeases:
    """Lease operations within the caller's session and transaction."""

    def __init__(self, session: Session, devices: Sequence[str]) -> None:
        self._session = session
        self._devices = tuple(devices)

    def held(self) -> dict[str, str]:
        """Device -> job id for every current lease (configured devices only)."""
        rows = self._session.execute(select(DeviceLeaseRow.device, DeviceLeaseRow.job_id)).all()
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
                device=device, job_id=job_id, claim_token=claim_token, acquired_at=utc_timestamp()
            )
            try:
                with self._session.begin_nested():
                    self._session.add(row)
            except IntegrityError as exc:
                if not isinstance(exc.orig, sqlite3.IntegrityError):
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

    def release_all(self) -> int:
        """Start-up recovery: drop every lease (their jobs are requeued)."""
        result = self._session.execute(delete(DeviceLeaseRow))
        return int(getattr(result, "rowcount", 0))

    def count(self) -> int:
        return len(self._session.execute(select(DeviceLeaseRow.device)).all())
