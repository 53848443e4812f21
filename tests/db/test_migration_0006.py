"""Revision 0006 (worker leases): lease columns on ``jobs``, device leases keyed per host.

An empty database upgrades through 0006; a populated one at 0005 keeps every
job and sequence (the columns are added in place, nothing cascades), an
active job arrives without a lease (so recovery requeues it), the old device
leases are gone and the new key admits one device name on two hosts.  A
downgrade to 0005 keeps every job and sequence too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from kiln_registry.db.engine import open_engine, session_factory
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.repository import JobRepository
from tests.db.test_migration_0005 import JOB_COLUMNS, _alembic, _job

NOW = "2026-12-01T00:00:00.000000Z"
LEASE = "INSERT INTO device_leases ({}) VALUES ({})"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = open_engine(tmp_path / "registry.db")
    yield eng
    eng.dispose()


def _columns(path: Path, table: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def _dump(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        jobs = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY id").fetchall()
        seqs = conn.execute("SELECT * FROM job_sequences ORDER BY job_id, idx").fetchall()
    finally:
        conn.close()
    return jobs, seqs


def test_an_empty_database_upgrades_to_0006(engine: Engine, tmp_path: Path) -> None:
    _alembic(engine, "upgrade", "0006_worker_leases")
    db = tmp_path / "registry.db"
    assert {"lease_owner", "lease_expires_at"} <= set(_columns(db, "jobs"))
    assert _columns(db, "device_leases")[:2] == ["host", "device"]


def test_a_populated_database_at_0005_keeps_its_jobs_and_requeues_the_active_one(
    engine: Engine, tmp_path: Path
) -> None:
    _alembic(engine, "upgrade", "0005_off_policy_generation")
    with engine.begin() as conn:
        for job_id in ("job-a", "job-b"):
            conn.exec_driver_sql(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 22)})",
                                 _job(job_id))  # fmt: skip
            conn.exec_driver_sql("INSERT INTO job_sequences (job_id, idx, seq_id, token_ids,"
                                 " token_sha256) VALUES (?, 0, 's0', ?, ?)",
                                 (job_id, b"\x01\x00\x00\x00", "f" * 64))  # fmt: skip
        conn.exec_driver_sql("UPDATE jobs SET status = 'running', claim_token = 'tok'"
                             " WHERE id = 'job-a'")  # fmt: skip
        conn.exec_driver_sql(LEASE.format("device, job_id, claim_token, acquired_at", "?, ?, ?, ?"),
                             ("cpu", "job-a", "tok", NOW))  # fmt: skip
    db = tmp_path / "registry.db"
    before = _dump(db)
    _alembic(engine, "upgrade", "0006_worker_leases")
    assert _dump(db) == before
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM device_leases").scalar() == 0
        leases = ("host, device, job_id, claim_token, acquired_at", "?, ?, ?, ?, ?")
        for host in ("host-1", "host-2"):  # one device name on two hosts
            conn.exec_driver_sql(LEASE.format(*leases), (host, "cpu", "job-a", "tok", NOW))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.exec_driver_sql(LEASE.format(*leases), ("host-1", "cpu", "job-b", "t2", NOW))
    with unit_of_work(session_factory(engine)) as session:
        assert JobRepository(session).requeue_expired() == ["job-a"]  # no lease: expired
    _alembic(engine, "downgrade", "0005_off_policy_generation")
    jobs, seqs = _dump(db)
    assert [j[0] for j in jobs] == ["job-a", "job-b"] and len(seqs) == 2
    assert "lease_owner" not in _columns(db, "jobs")
