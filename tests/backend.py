"""A test registry's database on either backend, reached the way the product reaches it.

Tests name a registry's database by the SQLite file it would be
(``directory / "registry.db"``); ``tests.pg_server.database_settings`` maps
that to the ``[server]`` keys of the active backend (``KILN_TEST_BACKEND``).
Here the same keys are opened with the product's own ``open_database``:

* ``open_registry_database(path)``: an Engine (dispose it), ``registry_database(path)``
  the same as a context manager;
* ``integrity(path)``: SQLite's ``PRAGMA integrity_check`` (``"ok"`` or the
  first problem); on PostgreSQL ``amcheck``'s ``bt_index_check`` over every
  B-tree index (the extension created by the superuser in that database),
  which raises on a corrupt index, else ``"ok"``;
* ``rows_text(path)``: every row of every table as text (a secret scan that
  holds on both backends; SQLite tests also scan the file's bytes);
* ``fetch(path, sql)`` / ``execute(path, sql)``: one read, or one committed
  write, in SQL both backends speak.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, select

from kiln_registry.config.database import PostgresDatabase
from kiln_registry.config.settings import ServerConfig
from kiln_registry.db.opening import open_database
from tests.pg_server import active_server, database_settings, selected_backend


def database_keys(path: Path) -> ServerConfig:
    """``[server]`` of the registry whose SQLite file would be ``path`` (database keys only)."""
    return ServerConfig.model_validate(database_settings(path.parent, path.name))


def open_registry_database(path: Path) -> Engine:
    """An Engine on the registry whose SQLite file would be ``path`` (created if missing)."""
    return open_database(database_keys(path))


@contextmanager
def registry_database(path: Path) -> Iterator[Engine]:
    engine = open_registry_database(path)
    try:
        yield engine
    finally:
        engine.dispose()


def integrity(path: Path) -> str:
    """``"ok"``, or the problem the backend's own checker reports (amcheck raises it)."""
    keys = database_keys(path)
    if not isinstance(keys.database, PostgresDatabase):
        with registry_database(path) as engine, engine.connect() as conn:
            return str(conn.exec_driver_sql("PRAGMA integrity_check").scalar_one())
    server = active_server()
    assert server is not None
    with server.admin(keys.database.name) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        indexes = conn.execute(
            "SELECT c.oid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_am a ON a.oid = c.relam JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE a.amname = 'btree' AND n.nspname = 'public'"
        ).fetchall()
        for (index,) in indexes:
            conn.execute("SELECT bt_index_check(%s::regclass, true)", (index,))
    return "ok"


def rows_text(path: Path) -> str:
    """Every row of every table of the database, as one text."""
    with registry_database(path) as engine, engine.connect() as conn:
        metadata = MetaData()
        metadata.reflect(conn)
        return "\n".join(
            repr(tuple(row))
            for table in metadata.sorted_tables
            for row in conn.execute(select(table))
        )


def is_postgres() -> bool:
    return selected_backend() == "postgres"


def fetch(path: Path, statement: str) -> list[tuple[Any, ...]]:
    """The rows of one SQL read (portable SQL) of the registry whose file would be ``path``."""
    with registry_database(path) as engine, engine.connect() as conn:
        return [tuple(row) for row in conn.exec_driver_sql(statement)]


def execute(path: Path, statement: str) -> None:
    """One SQL write (portable SQL), committed, in the product's write transaction."""
    with registry_database(path) as engine, engine.begin() as conn:
        conn.exec_driver_sql(statement)
