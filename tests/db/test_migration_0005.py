"""Revision 0005 (off-policy generation): the jobs table is rebuilt without losing a row.

An empty database upgrades to head; a populated one at 0004 keeps every job
and sequence (the rebuild copies ``job_sequences`` aside so dropping ``jobs``
cannot cascade into it), accepts the new kind, still cascades deletes, and a
downgrade removes only generation jobs and their rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

from kiln_registry.db.engine import head_revision, migrations_dir, open_engine, upgrade_to_head

JOB_COLUMNS = (
    "id, kind, status, teacher_alias, teacher_kind, teacher_url, teacher_model_id,"
    " teacher_created_at, identity_json, identity_digest, top_k, source, sequence_count,"
    " token_count, cancel_requested, attempts, scored_count, cache_hits, requests_sent, retries,"
    " created_at, updated_at"
)
NOW = "2026-12-01T00:00:00.000000Z"


def _job(job_id: str, kind: str = "teacher_scoring") -> tuple[object, ...]:
    return (job_id, kind, "succeeded", "t", "remote", "http://t", "m", NOW, "{}", "0" * 64, 2,
            "inline", 2, 3, 0, 1, 2, 0, 2, 0, NOW, NOW)  # fmt: skip


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = open_engine(tmp_path / "registry.db")
    yield eng
    eng.dispose()


def _alembic(engine: Engine, action: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        getattr(command, action)(config, revision)


def _rows(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        jobs = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY id").fetchall()
        seqs = conn.execute(
            "SELECT job_id, idx, seq_id, token_ids, token_sha256 FROM job_sequences"
            " ORDER BY job_id, idx"
        ).fetchall()
    finally:
        conn.close()
    return jobs, seqs


def test_an_empty_database_upgrades_to_0005(engine: Engine) -> None:
    assert upgrade_to_head(engine) == head_revision()
    with engine.begin() as conn:
        names = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master")}
    assert {"jobs", "job_sequences", "generation_cache"} <= names
    assert not any(name.startswith("_kiln_") for name in names)


def test_a_populated_database_at_0004_keeps_every_job_and_sequence(
    engine: Engine, tmp_path: Path
) -> None:
    _alembic(engine, "upgrade", "0004_access_control")
    with engine.begin() as conn:
        for job_id in ("job-a", "job-b"):
            conn.exec_driver_sql(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 22)})",
                                 _job(job_id))  # fmt: skip
            for idx in range(2):
                conn.exec_driver_sql(
                    "INSERT INTO job_sequences VALUES (?, ?, ?, ?, ?)",
                    (job_id, idx, f"s{idx}", b"\x01\x00\x00\x00", "f" * 64),
                )
    before = _rows(tmp_path / "registry.db")
    assert upgrade_to_head(engine) == head_revision()
    assert _rows(tmp_path / "registry.db") == before
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 22)})",
                             _job("job-g", "off_policy_generation"))  # fmt: skip
        conn.exec_driver_sql(
            "INSERT INTO job_sequences VALUES (?, ?, ?, ?, ?, ?)",
            ("job-g", 0, "p0", b"\x01\x00\x00\x00", "e" * 64, '[{"role":"user","content":"x"}]'),
        )
        conn.exec_driver_sql("DELETE FROM jobs WHERE id = 'job-a'")  # still cascades
        left = conn.exec_driver_sql("SELECT DISTINCT job_id FROM job_sequences").fetchall()
    assert sorted(r[0] for r in left) == ["job-b", "job-g"]
    _alembic(engine, "downgrade", "0004_access_control")
    jobs, seqs = _rows(tmp_path / "registry.db")
    assert [j[0] for j in jobs] == ["job-b"] and {s[0] for s in seqs} == {"job-b"}
