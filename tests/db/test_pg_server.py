"""The suite's own PostgreSQL server (tests/pg_server.py) and the backend switch.

A real ``postgres`` started by the session fixture: it runs as a non-root user,
authenticates with SCRAM (the password only from ``KILN_TEST_PG_PASSWORD``),
hands out fresh databases and drops them with their connections.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest
import sqlalchemy
from psycopg.rows import TupleRow

from tests import pg_server
from tests.pg_server import PASSWORD_ENV, PostgresServer, PostgresUnavailable


def _connect(server: PostgresServer, url: str, password: str) -> psycopg.Connection[TupleRow]:
    dbname = url.rsplit("/", 1)[-1]
    return psycopg.connect(host=server.host, port=server.port, user=server.user,
                           password=password, dbname=dbname, connect_timeout=10)  # fmt: skip


def _database_exists(server: PostgresServer, url: str) -> bool:
    with server.admin() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (url.rsplit("/", 1)[-1],)
        ).fetchone()
    assert row is not None
    return bool(row[0])


def test_server_runs_as_a_non_root_user_with_fsync_and_passwords(
    postgres_server: PostgresServer,
) -> None:
    assert postgres_server.process is not None
    status = Path(f"/proc/{postgres_server.process.pid}/status").read_text(encoding="ascii")
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert uids and all(uid != "0" for uid in uids)
    with postgres_server.admin() as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'listen_addresses', 'port')"
        ).fetchall()
        methods = conn.execute("SELECT DISTINCT auth_method FROM pg_hba_file_rules").fetchall()
    assert dict(rows) == {
        "fsync": "on",
        "listen_addresses": "127.0.0.1",
        "port": str(postgres_server.port),
    }
    assert methods == [("scram-sha-256",)]  # no trust: every connection needs the password


def test_fresh_database_reached_with_the_password_from_the_env_var(
    pg_database: str, postgres_server: PostgresServer
) -> None:
    assert pg_database.startswith(f"postgresql+psycopg://kiln@127.0.0.1:{postgres_server.port}/")
    assert postgres_server.password_env == PASSWORD_ENV
    password = os.environ[PASSWORD_ENV]
    with _connect(postgres_server, pg_database, password) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
        assert tables == (0,)
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba), rolsuper FROM pg_database, pg_roles "
            "WHERE datname = current_database() AND rolname = current_user"
        ).fetchone()
        assert owner == ("kiln", False)
        conn.execute("CREATE TABLE t (x integer)")  # the owner may create in public


def test_sqlalchemy_url_connects_with_the_password_passed_separately(pg_database: str) -> None:
    engine = sqlalchemy.create_engine(
        pg_database, connect_args={"password": os.environ[PASSWORD_ENV]}
    )
    try:
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT current_user")).scalar() == "kiln"
    finally:
        engine.dispose()


@pytest.mark.parametrize("password", ["wrong-password", ""])
def test_wrong_or_missing_password_is_refused(
    pg_database: str, postgres_server: PostgresServer, password: str
) -> None:
    with pytest.raises(psycopg.OperationalError, match="password"):
        _connect(postgres_server, pg_database, password).close()


def test_drop_database_ends_open_connections(postgres_server: PostgresServer) -> None:
    url = postgres_server.new_database("drop me")
    assert "/kiln_drop_me_" in url
    conn = _connect(postgres_server, url, postgres_server.password)
    try:
        postgres_server.drop_database(url)
        assert not _database_exists(postgres_server, url)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()
    postgres_server.drop_database(url)  # already gone: fine


def test_database_settings_under_postgres(
    postgres_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_server, "_BACKEND_AT_IMPORT", "postgres")
    with postgres_server.test_scope():
        first = pg_server.database_settings(tmp_path / "a")
        assert pg_server.database_settings(tmp_path / "a") == first  # same path, same database
        other = pg_server.database_settings(tmp_path / "b")
        assert other["database"] != first["database"]
        assert first["database_password_env"] == PASSWORD_ENV
        assert first["state_dir"] == str(tmp_path / "a")
        assert _database_exists(postgres_server, first["database"])
    assert not _database_exists(postgres_server, first["database"])
    assert not _database_exists(postgres_server, other["database"])


def test_database_settings_under_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_server, "_BACKEND_AT_IMPORT", "sqlite")
    assert pg_server.database_settings(tmp_path) == {"database": str(tmp_path / "registry.db")}


def test_unknown_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_server, "_BACKEND_AT_IMPORT", "mysql")
    with pytest.raises(ValueError, match=r"KILN_TEST_BACKEND='mysql'.*sqlite, postgres"):
        pg_server.selected_backend()


def test_bin_dir_is_the_highest_version_and_absence_names_the_script(tmp_path: Path) -> None:
    for version in ("9", "15", "16"):
        (tmp_path / version / "bin").mkdir(parents=True)
        (tmp_path / version / "bin" / "initdb").write_bytes(b"")
    (tmp_path / "17").mkdir()  # no initdb: not an installation
    assert pg_server.find_bin_dir(tmp_path) == tmp_path / "16" / "bin"
    with pytest.raises(PostgresUnavailable, match=r"scripts/install-test-deps\.sh"):
        pg_server.find_bin_dir(tmp_path / "missing")
