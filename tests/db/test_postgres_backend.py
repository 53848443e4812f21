"""The PostgreSQL backend below the API: the URL, the password, the schema gate, the write lock.

Real parts: the suite's own PostgreSQL server (tests/pg_server.py), engines
opened the way ``kiln serve`` opens them, the ``kiln`` CLI as a subprocess.
The password must never appear in any output; every test that could echo it
searches for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from kiln_registry.config.database import PostgresDatabase, database_value, parse_postgres
from kiln_registry.config.loader import check_startup_environment
from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.data_version import open_version_reader
from kiln_registry.db.engine import (
    BEGIN_OPTION,
    current_revision,
    head_revision,
    open_engine,
    upgrade_to_head,
)
from kiln_registry.db.opening import ensure_schema, open_database, require_head
from kiln_registry.domain.errors import ConfigError
from tests.pg_server import PostgresServer
from tests.scaleout.support import pg_config

REPO = Path(__file__).resolve().parents[2]
OLDER = "0005_off_policy_generation"


def _kiln(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", *args],
        cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("postgresql+psycopg://kiln:hunter2-secret@db:5432/kiln", "carries a password"),
        ("postgresql://kiln@db/kiln?sslmode=require&options=-c%20x", "unknown PostgreSQL URL"),
        ("postgresql+psycopg://db:5432/kiln", "names no user"),
        ("postgresql+psycopg://kiln@db:5432/", "names no database name"),
        ("postgresql+psycopg://kiln@/kiln?host=/run/pg", "unknown PostgreSQL URL parameter"),
        ("postgresql+asyncpg://kiln@db/kiln", "not supported"),
        ("mysql://kiln@db/kiln", "scheme 'mysql' is not supported"),
        ("sqlite://", "sqlite:///PATH"),
    ],
)
def test_bad_database_urls_are_refused_without_echoing_them(value: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as caught:
        database_value(value)
    assert "hunter2" not in str(caught.value)


def test_database_spellings() -> None:
    parsed = database_value("postgresql://kiln@db.internal:6543/registry?sslmode=verify-full")
    assert parsed == PostgresDatabase(
        host="db.internal", port=6543, username="kiln", name="registry",
        query=(("sslmode", "verify-full"),),
    )  # fmt: skip
    assert parsed.display() == "postgresql+psycopg://kiln@db.internal:6543/registry"
    assert database_value("sqlite:////var/lib/kiln/registry.db") == "/var/lib/kiln/registry.db"
    assert database_value("sqlite:///rel/registry.db") == "rel/registry.db"
    assert database_value("plain/path.db") == "plain/path.db"


def test_config_rules_for_the_database_keys(tmp_path: Path) -> None:
    student = tmp_path / "student"
    base = {"student": {"model_path": str(student)}}
    url = "postgresql+psycopg://kiln@127.0.0.1:5432/kiln"
    with pytest.raises(ValueError, match="state_dir is required"):
        KilnConfig.model_validate({**base, "server": {"database": url}})
    with pytest.raises(ValueError, match="applies only to a PostgreSQL"):
        KilnConfig.model_validate(
            {**base, "server": {"database": str(tmp_path / "r.db"), "database_password_env": "X"}}
        )
    config = KilnConfig.model_validate(
        {
            **base,
            "server": {
                "database": url,
                "database_password_env": "KILN_DB_PASSWORD",
                "state_dir": str(tmp_path),
            },
        }
    )
    assert config.server.state_path == tmp_path and config.server.sqlite_path is None
    with pytest.raises(ConfigError, match="KILN_DB_PASSWORD") as caught:
        check_startup_environment(config, {})
    assert caught.value.rule == "secret.unset" or caught.value.rule
    sqlite = KilnConfig.model_validate({**base, "server": {"database": str(tmp_path / "r.db")}})
    assert sqlite.server.state_path == tmp_path


def test_wrong_or_missing_password_is_refused_without_the_secret(
    pg_database: str, postgres_server: PostgresServer
) -> None:
    location = parse_postgres(pg_database)
    wrong = "Wr0ng-Passw0rd-" + "x" * 8
    with pytest.raises(ConfigError) as caught:
        open_engine(location, password_env="KILN_T_PW", environ={"KILN_T_PW": wrong})
    assert caught.value.rule == "db.open"
    assert wrong not in str(caught.value) and postgres_server.password not in str(caught.value)
    assert location.display() in str(caught.value)
    with pytest.raises(ConfigError, match="KILN_T_PW") as unset:
        open_engine(location, password_env="KILN_T_PW", environ={})
    assert unset.value.rule == "db.password_env"


def test_the_password_is_read_at_each_connection_and_never_kept(
    pg_database: str, postgres_server: PostgresServer
) -> None:
    environ = {"KILN_T_PW": postgres_server.password}
    engine = open_engine(parse_postgres(pg_database), password_env="KILN_T_PW", environ=environ)
    try:
        assert postgres_server.password not in repr(engine) + str(engine.url)
        assert postgres_server.password not in engine.url.render_as_string(hide_password=False)
        engine.dispose()
        environ["KILN_T_PW"] = "rotated-but-wrong"  # the next connection reads the new value
        with pytest.raises(Exception) as caught, engine.connect():
            pass
        assert "password" in str(caught.value).lower()
        environ["KILN_T_PW"] = postgres_server.password
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_schema_gate_creates_refuses_and_upgrades(
    tmp_path: Path, pg_database: str, postgres_server: PostgresServer, tiny_model: object
) -> None:
    engine = open_engine(parse_postgres(pg_database), password_env=postgres_server.password_env)
    try:
        with pytest.raises(ConfigError) as empty:
            require_head(engine)
        assert empty.value.rule == "db.revision"
        assert ensure_schema(engine, upgrade=False) == head_revision()  # empty: created
        assert require_head(engine) == head_revision()
        with engine.begin() as conn:  # pretend an older release wrote it
            conn.execute(
                text("UPDATE alembic_version SET version_num = '0005_off_policy_generation'")
            )
        with pytest.raises(ConfigError) as behind:
            ensure_schema(engine, upgrade=False)
        assert behind.value.rule == "db.behind_head" and "kiln db upgrade" in behind.value.hint
    finally:
        engine.dispose()


def test_kiln_db_upgrade_and_serve_gate_on_postgres(
    tmp_path: Path, pg_database: str, postgres_server: PostgresServer, tiny_model: object
) -> None:
    config = pg_config(tmp_path, url=pg_database, student=tiny_model.path)  # type: ignore[attr-defined]
    first = _kiln("db", "upgrade", "--config", str(config))
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary == {"database": pg_database, "revision_before": None,
                       "revision": head_revision()}  # fmt: skip
    again = _kiln("db", "upgrade", "--config", str(config))
    assert json.loads(again.stdout)["revision_before"] == head_revision()
    unset = _kiln("db", "upgrade", "--config", str(config), env={postgres_server.password_env: ""})
    assert unset.returncode == 2 and postgres_server.password_env in unset.stderr
    for result in (first, again, unset):
        assert postgres_server.password not in result.stdout + result.stderr


def test_sqlite_behind_head_is_refused_until_upgraded(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "registry.db")
    try:
        upgrade_to_head(engine)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE alembic_version SET version_num = '0005_off_policy_generation'")
            )
        with pytest.raises(ConfigError) as behind:
            ensure_schema(engine, upgrade=False)
        assert behind.value.rule == "db.behind_head"
    finally:
        engine.dispose()


def test_writers_are_serialised_readers_are_not(
    pg_database: str, postgres_server: PostgresServer
) -> None:
    engine = open_engine(parse_postgres(pg_database), password_env=postgres_server.password_env)
    try:
        upgrade_to_head(engine)
        order: list[str] = []
        holding = threading.Event()

        def first_writer() -> None:
            with engine.begin() as conn:
                conn.execute(text("SELECT 1"))
                holding.set()
                time.sleep(0.5)
                order.append("first commits")

        thread = threading.Thread(target=first_writer)
        thread.start()
        assert holding.wait(10)
        reader = engine.connect().execution_options(**{BEGIN_OPTION: "DEFERRED"})
        with reader.begin():
            reader.execute(text("SELECT 1"))
            order.append("reader ran")
        reader.close()
        with engine.begin() as conn:  # waits for the advisory lock
            conn.execute(text("SELECT 1"))
            order.append("second writer ran")
        thread.join(10)
        assert order == ["reader ran", "first commits", "second writer ran"]
    finally:
        engine.dispose()


def test_the_data_version_moves_for_registry_writes_only(
    pg_database: str, postgres_server: PostgresServer
) -> None:
    engine = open_engine(parse_postgres(pg_database), password_env=postgres_server.password_env)
    reader = open_version_reader(engine)
    try:
        upgrade_to_head(engine)
        before = reader.read()
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO reserved_aliases (alias, reserved_at) VALUES ('x', 't')")
            )
        moved = reader.read()
        assert before is not None and moved is not None and moved > before
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM device_leases"))  # a job table: no bump
        assert reader.read() == moved
    finally:
        reader.close()
        engine.dispose()


def test_open_database_from_the_config(
    tmp_path: Path, pg_database: str, postgres_server: PostgresServer, tiny_model: object
) -> None:
    from kiln_registry.config.loader import load_config

    config = load_config(pg_config(tmp_path, url=pg_database, student=tiny_model.path))  # type: ignore[attr-defined]
    engine = open_database(config.server)
    try:
        assert ensure_schema(engine, upgrade=False) == head_revision()
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_a_missing_state_dir_is_created_private(
    tmp_path: Path, pg_database: str, postgres_server: PostgresServer, tiny_model: object
) -> None:
    from kiln_registry.config.loader import load_config

    path = pg_config(tmp_path, url=pg_database, student=tiny_model.path)  # type: ignore[attr-defined]
    state = tmp_path / "new" / "state"
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            f'state_dir = "{tmp_path}"', f'state_dir = "{state}"'
        ),
        encoding="utf-8",
    )
    engine = open_database(load_config(path).server)
    engine.dispose()
    assert state.is_dir() and (state.stat().st_mode & 0o777) == 0o700
