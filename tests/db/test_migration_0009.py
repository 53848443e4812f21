"""Revision 0009 (64-bit counters) on SQLite and on a real PostgreSQL server.

A corpus over 2 GiB and a job of more than 2^31 tokens must publish: the job
repository stores and reads counters above 2^31 and 2^32 on both engines, a
populated database at 0008 keeps its rows through the upgrade, the models equal
the migrated schema on PostgreSQL too, and a downgrade to 0008 (with small
values) and back works.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, text

import kiln_registry.auth.models
import kiln_registry.jobs.core.models  # noqa: F401  (registers the job tables on the metadata)
from kiln_registry.config.database import parse_postgres
from kiln_registry.db.engine import head_revision, open_engine, session_factory, upgrade_to_head
from kiln_registry.db.models import metadata
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.repository import JobRepository
from tests.db.test_migration_0005 import JOB_COLUMNS, _alembic
from tests.db.test_migration_0005 import _job as old_job
from tests.jobs.test_store import _job
from tests.pg_server import PostgresServer

BIG = {
    "token_count": 2**32 + 3,
    "sequence_count": 2**31 + 1,
}
RESULT = {
    "scored_count": 2**31 + 7,
    "cache_hits": 2**32 + 9,
    "requests_sent": 2**31 + 11,
    "retries": 2**31 + 13,
    "result_bytes": 6 * 2**30 + 5,  # a 6 GiB corpus
}


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        eng = open_engine(tmp_path / "registry.db")
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = request.getfixturevalue("pg_database")
        eng = open_engine(
            parse_postgres(url),
            password_env=server.password_env,
            environ={server.password_env: server.password},
        )
    yield eng
    eng.dispose()


def test_counters_above_2_to_the_32_are_stored_and_read(engine: Engine) -> None:
    assert upgrade_to_head(engine) == head_revision()
    sessions = session_factory(engine)
    row = _job("job-big")
    for name, value in BIG.items():
        setattr(row, name, value)
    with unit_of_work(sessions) as session:
        JobRepository(session).insert(row, [])
    with unit_of_work(sessions) as session:
        claimed = JobRepository(session).claim_next("tok")
        assert claimed is not None and claimed.id == "job-big"
    with unit_of_work(sessions) as session:
        repo = JobRepository(session)
        assert repo.update_claimed("job-big", "tok", status="running")
        assert repo.finish("job-big", "tok", "succeeded", result_sha256="b" * 64, **RESULT)
    with unit_of_work(sessions) as session:
        stored = JobRepository(session).require("job-big")
        assert {name: getattr(stored, name) for name in BIG} == BIG
        assert {name: getattr(stored, name) for name in RESULT} == RESULT
    with engine.connect() as conn:
        # The logs' ids continue past 2^31 (their sequences are 64-bit on PostgreSQL).
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT setval('audit_events_id_seq', 3000000000)"))
        conn.execute(text("INSERT INTO audit_events (at, action, outcome) VALUES ('t', 'x', 'ok')"))
        if engine.dialect.name == "sqlite":
            conn.execute(text("UPDATE audit_events SET id = 3000000001"))
        conn.commit()
        assert conn.execute(text("SELECT max(id) FROM audit_events")).scalar_one() > 2**31


def test_a_populated_0008_database_upgrades_and_matches_the_models(engine: Engine) -> None:
    _alembic(engine, "upgrade", "0008_teacher_replicas")
    marks = ", ".join(f":c{i}" for i in range(len(old_job("job-old"))))
    with engine.begin() as conn:  # the columns of 0008, as a server of that release wrote
        values = {f"c{i}": v for i, v in enumerate(old_job("job-old"))}
        conn.execute(text(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({marks})"), values)
    assert upgrade_to_head(engine) == head_revision()
    with unit_of_work(session_factory(engine)) as session:
        assert JobRepository(session).require("job-old").token_count == 3
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, metadata)
    # kiln_data_version (revision 0007, PostgreSQL only) is read by raw SQL, not a model.
    assert [
        d for d in diff if not (d[0] == "remove_table" and d[1].name == "kiln_data_version")
    ] == []


def test_downgrade_to_0008_and_back(engine: Engine) -> None:
    assert upgrade_to_head(engine) == head_revision()
    _alembic(engine, "downgrade", "0008_teacher_replicas")
    assert upgrade_to_head(engine) == head_revision()
