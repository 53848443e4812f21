"""open_engine pragmas and transactions, upgrade_to_head's checks and its single transaction."""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from kiln_registry.db.engine import (
    current_revision,
    detect_database_shape,
    head_revision,
    migrations_dir,
    open_engine,
    upgrade_to_head,
)
from kiln_registry.domain.errors import ConfigError
from tests.db.test_legacy_sqlite import LEGACY_DDL

BROKEN_REVISION = '''"""A revision that fails halfway, for the single-transaction test."""

import sqlalchemy as sa
from alembic import op

revision = "0999_broken"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("half_done", sa.Column("id", sa.Integer(), primary_key=True))
    op.execute("INSERT INTO half_done (id) VALUES (1)")
    raise RuntimeError("migration failed halfway")


def downgrade() -> None:
    op.drop_table("half_done")
'''


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "registry.db"


@pytest.fixture
def engine(db_path: Path) -> Iterator[Engine]:
    eng = open_engine(db_path)
    yield eng
    eng.dispose()


def _sqlite(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection, to set up or inspect files behind the engine's back."""
    return sqlite3.connect(path, isolation_level=None, timeout=0)


def _tables(path: Path) -> list[str]:
    conn = _sqlite(path)
    try:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall()
    finally:
        conn.close()
    return [row[0] for row in rows]


def _schema(path: Path) -> list[tuple[str, str]]:
    conn = _sqlite(path)
    try:
        rows = conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        conn.close()
    return [(row[0], row[1]) for row in rows]


def test_every_connection_has_wal_foreign_keys_and_timeouts(engine: Engine, db_path: Path) -> None:
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    assert db_path.is_file()


def test_transactions_begin_immediate_and_hold_the_write_lock(
    engine: Engine, db_path: Path
) -> None:
    other = _sqlite(db_path)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))  # autobegin: BEGIN IMMEDIATE
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            conn.rollback()
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_ddl_is_transactional(engine: Engine, db_path: Path) -> None:
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE scratch (x INTEGER)")
        raise RuntimeError("roll back the CREATE TABLE")
    assert "scratch" not in _tables(db_path)


def test_open_engine_refuses_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        open_engine(tmp_path / "absent" / "registry.db")
    assert info.value.rule == "db.path"
    assert "absent" in info.value.message


def test_open_engine_refuses_a_directory(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(ConfigError) as info:
        open_engine(tmp_path / "dir.db")
    assert info.value.rule == "db.path"


def test_open_engine_refuses_a_file_that_is_not_sqlite(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.db"
    bogus.write_bytes(b"this is not a database\n" * 200)
    with pytest.raises(ConfigError) as info:
        open_engine(bogus)
    assert info.value.rule == "db.open"
    assert str(bogus) in info.value.message


def test_open_engine_refuses_a_database_without_wal() -> None:
    # An in-memory database is the one real SQLite target that cannot do WAL.
    with pytest.raises(ConfigError) as info:
        open_engine(":memory:")
    assert info.value.rule == "db.wal"
    assert "database :memory:" in info.value.message
    assert "journal_mode is 'memory'" in info.value.message


def test_upgrade_an_empty_database(engine: Engine, db_path: Path) -> None:
    assert current_revision(engine) is None
    assert upgrade_to_head(engine) == head_revision()
    assert current_revision(engine) == head_revision()
    assert {"alembic_version", "teachers", "probe_receipts"} <= set(_tables(db_path))


def test_upgrade_twice_is_a_no_op(engine: Engine, db_path: Path) -> None:
    upgrade_to_head(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO teachers (alias, kind, status, created_at, updated_at) "
            "VALUES ('kept', 'fixture', 'configured', 't', 't')"
        )
    before = _schema(db_path)
    assert upgrade_to_head(engine) == head_revision()
    assert _schema(db_path) == before
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT alias FROM teachers").scalars().all() == ["kept"]


def test_concurrent_upgrades_of_one_file_both_succeed(db_path: Path) -> None:
    engines = [open_engine(db_path), open_engine(db_path)]
    results: list[str | BaseException] = []
    barrier = threading.Barrier(len(engines))

    def run(eng: Engine) -> None:
        barrier.wait()
        try:
            results.append(upgrade_to_head(eng))
        except BaseException as exc:  # collected and asserted below
            results.append(exc)

    threads = [threading.Thread(target=run, args=(eng,)) for eng in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for eng in engines:
        eng.dispose()
    assert results == [head_revision(), head_revision()]


def test_refuses_a_database_from_a_newer_revision(engine: Engine, db_path: Path) -> None:
    upgrade_to_head(engine)
    raw = _sqlite(db_path)
    raw.execute("UPDATE alembic_version SET version_num = '9999_future'")
    raw.close()
    before = _schema(db_path)
    with pytest.raises(ConfigError) as info:
        upgrade_to_head(engine)
    assert info.value.rule == "db.newer_revision"
    assert "9999_future" in info.value.message
    assert _schema(db_path) == before
    assert current_revision(engine) == "9999_future"


def test_refuses_an_unrecognised_non_empty_database(engine: Engine, db_path: Path) -> None:
    raw = _sqlite(db_path)
    raw.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    raw.close()
    with pytest.raises(ConfigError) as info:
        upgrade_to_head(engine)
    assert info.value.rule == "db.unrecognised"
    assert "unrecognised database" in info.value.message
    assert str(db_path) in info.value.message
    assert _tables(db_path) == ["invoices"]


@pytest.mark.parametrize(
    ("statements", "shape"),
    [
        ([], "empty"),
        (["CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"], "empty"),
        (
            [
                "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
                "CREATE TABLE teachers (alias TEXT)",
            ],
            "unknown",
        ),
        (
            [
                "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)",
                "INSERT INTO alembic_version VALUES ('0001_initial')",
            ],
            "alembic",
        ),
        ([LEGACY_DDL], "legacy_v0"),
        ([LEGACY_DDL, "CREATE TABLE extra (x)"], "unknown"),
        ([LEGACY_DDL.replace("api_key_env", "api_key")], "unknown"),
    ],
)
def test_detect_database_shape(
    engine: Engine, db_path: Path, statements: list[str], shape: str
) -> None:
    raw = _sqlite(db_path)
    for statement in statements:
        raw.execute(statement)
    raw.close()
    with engine.connect() as conn:
        assert detect_database_shape(conn) == shape


def _scripts_with_broken_revision(tmp_path: Path) -> Path:
    scripts = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    broken = BROKEN_REVISION.replace("{down}", head_revision())
    (scripts / "versions" / "0999_broken.py").write_text(broken, encoding="utf-8")
    return scripts


def test_a_failing_revision_rolls_back_the_whole_upgrade(
    engine: Engine, db_path: Path, tmp_path: Path
) -> None:
    scripts = _scripts_with_broken_revision(tmp_path)
    with pytest.raises(RuntimeError, match="halfway"):
        upgrade_to_head(engine, script_location=scripts)
    # 0001 ran first in the same transaction: it is gone too.
    assert _tables(db_path) == []
    assert current_revision(engine) is None


def test_a_failing_revision_leaves_a_populated_database_at_its_revision(
    engine: Engine, db_path: Path, tmp_path: Path
) -> None:
    upgrade_to_head(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO teachers (alias, kind, status, created_at, updated_at) "
            "VALUES ('kept', 'fixture', 'configured', 't', 't')"
        )
    before = _schema(db_path)
    scripts = _scripts_with_broken_revision(tmp_path)
    with pytest.raises(RuntimeError, match="halfway"):
        upgrade_to_head(engine, script_location=scripts)
    assert current_revision(engine) == head_revision()
    assert "half_done" not in _tables(db_path)
    assert _schema(db_path) == before
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT alias FROM teachers").scalars().all() == ["kept"]
