"""Revision 0012_ux2_worker_heartbeats (issue 30, item 6): an empty database upgrades with an
empty ``job_workers`` table; a populated one at 0011 keeps its jobs; the downgrade drops it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kiln_registry.db.engine import head_revision, open_engine, upgrade_to_head
from tests.db.test_migration_0005 import JOB_COLUMNS, _alembic, _job

pytestmark = pytest.mark.sqlite_only("reads the SQLite file's tables directly")

WORKER_COLUMNS = ["worker_id", "host", "pid", "slots", "started_at", "seen_at"]


def _read(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_an_empty_database_upgrades_with_an_empty_job_workers_table(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "registry.db")
    try:
        assert upgrade_to_head(engine) == head_revision()
    finally:
        engine.dispose()
    db = tmp_path / "registry.db"
    assert [row[1] for row in _read(db, "PRAGMA table_info(job_workers)")] == WORKER_COLUMNS
    assert _read(db, "SELECT count(*) FROM job_workers") == [(0,)]


def test_a_populated_database_at_0011_keeps_its_jobs_and_downgrades(tmp_path: Path) -> None:
    db = tmp_path / "registry.db"
    engine = open_engine(db)
    try:
        _alembic(engine, "upgrade", "0011_job_owner")
        with engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 22)})",
                                 _job("job-a"))  # fmt: skip
        before = _read(db, f"SELECT {JOB_COLUMNS}, owner FROM jobs")
        assert upgrade_to_head(engine) == head_revision()
        assert _read(db, f"SELECT {JOB_COLUMNS}, owner FROM jobs") == before
        assert _read(db, "SELECT count(*) FROM job_workers") == [(0,)]
        _alembic(engine, "downgrade", "0011_job_owner")
    finally:
        engine.dispose()
    assert _read(db, "SELECT name FROM sqlite_master WHERE name = 'job_workers'") == []
    assert _read(db, f"SELECT {JOB_COLUMNS}, owner FROM jobs") == before
