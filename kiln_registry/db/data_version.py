"""A number that moves whenever another connection commits: the caches' coherence signal.

``open_version_reader(engine)`` returns a reader for the engine's dialect:

* SQLite: ``PRAGMA data_version`` on a dedicated read-only connection to the
  file (it moves on every commit by any other connection or process, and
  reading it never waits for a writer in WAL mode);
* PostgreSQL: the single row of ``kiln_data_version`` (revision
  ``0007_data_version``), incremented by a trigger inside every transaction
  that changes the tables the caches render from; read on a dedicated
  autocommit connection, so each read sees the latest commit of every replica.

``rows(sql)`` runs one bounded read on that same connection (the token table
loads its snapshot this way).  A reader is used under its owner's lock, one
thread at a time.  ``read()`` raises ``VersionUnreadable`` when the database
cannot be read; the owners then drop what they cached.

Imports: the standard library and SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from kiln_registry.db.postgres import BEGIN_OPTION


class VersionUnreadable(Exception):
    """The version (or a snapshot) could not be read; the caller drops its cache."""


class VersionReader(Protocol):
    def read(self) -> int | None: ...

    def rows(self, sql: str) -> list[tuple[Any, ...]]: ...

    def close(self) -> None: ...


class SqliteVersionReader:
    """``PRAGMA data_version`` on a read-only connection to one SQLite file."""

    def __init__(self, database: Path) -> None:
        self._database = database
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            uri = Path(self._database).absolute().as_uri() + "?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        return self._conn

    def read(self) -> int | None:
        try:
            row = self._connection().execute("PRAGMA data_version").fetchone()
        except sqlite3.Error as exc:
            raise VersionUnreadable(str(exc)) from None
        return int(row[0]) if row else None

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        try:
            return [tuple(row) for row in self._connection().execute(sql)]
        except sqlite3.Error as exc:
            raise VersionUnreadable(str(exc)) from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresVersionReader:
    """The ``kiln_data_version`` row, read on a dedicated autocommit connection."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None

    def _connection(self) -> Connection:
        if self._conn is None:
            # DEFERRED: never the advisory write lock (db.postgres); a read never waits.
            self._conn = self._engine.connect().execution_options(
                isolation_level="AUTOCOMMIT", **{BEGIN_OPTION: "DEFERRED"}
            )
        return self._conn

    def _run(self, sql: str) -> list[tuple[Any, ...]]:
        try:
            return [tuple(row) for row in self._connection().execute(text(sql))]
        except SQLAlchemyError as exc:
            self.close()  # a broken connection is replaced on the next read
            raise VersionUnreadable(type(exc).__name__) from None

    def read(self) -> int | None:
        found = self._run("SELECT version FROM kiln_data_version WHERE id = 1")
        return int(found[0][0]) if found else None

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self._run(sql)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                self._conn.close()
            self._conn = None


def open_version_reader(engine: Engine) -> VersionReader:
    """The reader for ``engine``'s database (nothing is connected until the first read)."""
    if engine.dialect.name == "sqlite":
        return SqliteVersionReader(Path(str(engine.url.database)))
    return PostgresVersionReader(engine)
