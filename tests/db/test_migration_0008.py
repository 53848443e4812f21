"""Revision 0008 (teacher replica sets) on SQLite and on a real PostgreSQL server.

An empty database upgrades to head with ``teacher_replicas``; a populated one
at 0007 keeps its teachers; a replica row goes with its alias (ON DELETE
CASCADE); on PostgreSQL a write to the table bumps ``kiln_data_version``; a
downgrade to 0007 drops the table (and its trigger) and upgrades again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from kiln_registry.config.database import parse_postgres
from kiln_registry.db.engine import head_revision, open_engine, upgrade_to_head
from tests.db.test_migration_0005 import _alembic
from tests.pg_server import PostgresServer

NOW = "2026-12-01T00:00:00.000000Z"
TEACHER = (
    "INSERT INTO teachers (alias, kind, url, status, created_at, updated_at)"
    " VALUES ('set', 'remote', 'http://127.0.0.1:1/v1', 'verified', :now, :now)"
)
REPLICA = (
    "INSERT INTO teacher_replicas (alias, idx, url, status, checked_at)"
    " VALUES ('set', :idx, :url, 'verified', :now)"
)


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


def _count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _version(engine: Engine) -> int | None:
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT version FROM kiln_data_version")).scalar_one())


def test_replicas_table_cascades_and_bumps_the_data_version(engine: Engine) -> None:
    _alembic(engine, "upgrade", "0007_data_version")
    with engine.begin() as conn:
        conn.execute(text(TEACHER), {"now": NOW})
    assert upgrade_to_head(engine) == head_revision()
    assert _count(engine, "teachers") == 1 and _count(engine, "teacher_replicas") == 0
    before = _version(engine)
    with engine.begin() as conn:
        for idx in range(2):
            conn.execute(text(REPLICA), {"idx": idx, "url": f"http://127.0.0.1:{idx + 1}/v1",
                                         "now": NOW})  # fmt: skip
    if before is not None:
        assert (_version(engine) or 0) > before
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM teachers WHERE alias = 'set'"))
    assert _count(engine, "teacher_replicas") == 0


def test_downgrade_to_0007_and_back(engine: Engine) -> None:
    assert upgrade_to_head(engine) == head_revision()
    _alembic(engine, "downgrade", "0007_data_version")
    with engine.connect() as conn:
        names = set(engine.dialect.get_table_names(conn))
    assert "teacher_replicas" not in names and "teachers" in names
    assert upgrade_to_head(engine) == head_revision()
    assert _count(engine, "teacher_replicas") == 0
