"""Revision 0010_job_output: ``jobs.output`` (issue 26).

An empty database upgrades to head with the column; a populated one at 0009
keeps every job and sequence, each job arriving with ``output`` NULL (it writes
its corpus only, as before); a downgrade to 0009 drops the column and keeps
the jobs, and the upgrade runs again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from kiln_registry.db.engine import open_engine
from tests.db.test_migration_0005 import JOB_COLUMNS, _alembic, _job

REVISION = "0010_job_output"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = open_engine(tmp_path / "registry.db")
    yield eng
    eng.dispose()


def _columns(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(jobs)")]
    finally:
        conn.close()


def _dump(path: Path, extra: str = "") -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        jobs = conn.execute(f"SELECT {JOB_COLUMNS}{extra} FROM jobs ORDER BY id").fetchall()
        seqs = conn.execute("SELECT * FROM job_sequences ORDER BY job_id, idx").fetchall()
    finally:
        conn.close()
    return [*jobs, *seqs]


def test_an_empty_database_upgrades_to_0010(engine: Engine, tmp_path: Path) -> None:
    _alembic(engine, "upgrade", REVISION)
    assert "output" in _columns(tmp_path / "registry.db")


def test_a_populated_database_at_0009_keeps_its_jobs(engine: Engine, tmp_path: Path) -> None:
    _alembic(engine, "upgrade", "0009_bigint_counters")
    with engine.begin() as conn:
        for job_id in ("job-a", "job-b"):
            conn.exec_driver_sql(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 22)})",
                                 _job(job_id))  # fmt: skip
            conn.exec_driver_sql("INSERT INTO job_sequences (job_id, idx, seq_id, token_ids,"
                                 " token_sha256) VALUES (?, 0, 's0', ?, ?)",
                                 (job_id, b"\x01\x00\x00\x00", "f" * 64))  # fmt: skip
    db = tmp_path / "registry.db"
    before = _dump(db)
    _alembic(engine, "upgrade", REVISION)
    assert _dump(db) == before
    outputs = [row[-1] for row in _dump(db, ", output")[:2]]
    assert outputs == [None, None]
    _alembic(engine, "downgrade", "0009_bigint_counters")
    assert "output" not in _columns(db) and _dump(db) == before
    _alembic(engine, "upgrade", REVISION)
    assert "output" in _columns(db)
