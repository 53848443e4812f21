"""Revision 0011_job_owner (job ownership) on SQLite: an empty database upgrades,
a populated one at 0010 keeps its jobs (owner NULL: admin only), and a database made
before it is converted to incremental auto-vacuum by the upgrade (issue 27 item 8)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kiln_registry.db.engine import head_revision, open_engine, upgrade_to_head
from tests.db.test_migration_0005 import JOB_COLUMNS, _alembic, _job

pytestmark = pytest.mark.sqlite_only("the SQLite file's pragmas and columns")


def _read(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_an_empty_database_upgrades_with_owner_and_incremental_vacuum(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "registry.db")
    try:
        assert upgrade_to_head(engine) == head_revision()
    finally:
        engine.dispose()
    columns = [row[1] for row in _read(tmp_path / "registry.db", "PRAGMA table_info(jobs)")]
    assert "owner" in columns
    assert _read(tmp_path / "registry.db", "PRAGMA auto_vacuum") == [(2,)]


def test_a_populated_database_at_0010_keeps_its_jobs_and_is_converted(tmp_path: Path) -> None:
    db = tmp_path / "registry.db"
    conn = sqlite3.connect(db)  # made as before: auto_vacuum NONE
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    engine = open_engine(db)
    try:
        _alembic(engine, "upgrade", "0010_job_output")
        with engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 22)})",
                                 _job("job-a"))  # fmt: skip
        assert _read(db, "PRAGMA auto_vacuum") == [(0,)]
        before = _read(db, f"SELECT {JOB_COLUMNS} FROM jobs")
        assert upgrade_to_head(engine) == head_revision()
    finally:
        engine.dispose()
    assert _read(db, f"SELECT {JOB_COLUMNS} FROM jobs") == before
    assert _read(db, "SELECT owner FROM jobs") == [(None,)]
    assert _read(db, "PRAGMA auto_vacuum") == [(2,)]
