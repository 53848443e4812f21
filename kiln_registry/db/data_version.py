"""A number that moves whenever another connection commits: the caches' coherence signal.

``open_version_reader(engine)`` returns a reader for the engine's dialect:

* SQLite: ``PRAGMA data_version`` on a dedicated read-only connection to the
  file (it moves on every commit by any other connection or process, and
  reading it never waits for a writer in WAL mode);
* PostgreSQL: the single row of ``kiln_data_version`` (revision
  ``0007_data_version``), incremented by a trigger inside every transaction
  that changes the tables the caches render from; read on a dedicated
  autocommit driver connection, so each read sees the latest commit of every
  replica.

Within ``version_scope()`` (one read-only API request: the token check and
the entry lookup) a PostgreSQL version is read once and reused: the request
then sees the database as of its first read, which happened after the
request arrived, so a change committed before the request arrived is always
seen, at the cost of one round trip instead of two.  Outside a scope every
read goes to the database.

``rows(sql)`` runs one bounded read on that same connection (the token table
loads its snapshot this way).  A reader is used under its owner's lock, one
thread at a time.  ``read()`` raises ``VersionUnreadable`` when the database
cannot be read; the owners then drop what they cached.

Imports: the standard library and SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine

_PG_VERSION = "SELECT version FROM kiln_data_version WHERE id = 1"


_SCOPE: ContextVar[dict[str, int | None] | None] = ContextVar("kiln_data_version", default=None)


@contextlib.contextmanager
def version_scope() -> Iterator[None]:
    """Reads of one database's version inside share the first one (see the module docstring)."""
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


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
    """The ``kiln_data_version`` row, read on a dedicated autocommit driver connection.

    The hot path (every cached lookup and token check) is one prepared
    SELECT on a psycopg connection held outside the pool: no SQLAlchemy
    statement machinery, no transaction, never the advisory write lock.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._key = engine.url.render_as_string(hide_password=True)
        self._raw: Any = None

    def _driver(self) -> Any:
        if self._raw is None:
            self._raw = self._engine.raw_connection()
            self._raw.driver_connection.autocommit = True
        return self._raw.driver_connection

    def _run(self, sql: str, *, prepare: bool = False) -> list[tuple[Any, ...]]:
        try:
            with self._driver().cursor() as cursor:
                cursor.execute(sql, prepare=prepare)
                return [tuple(row) for row in cursor.fetchall()]
        except Exception as exc:  # any driver or pool failure: drop the connection
            self.close()
            raise VersionUnreadable(type(exc).__name__) from None

    def read(self) -> int | None:
        memo = _SCOPE.get()
        if memo is not None and self._key in memo:
            return memo[self._key]
        found = self._run(_PG_VERSION, prepare=True)
        version = int(found[0][0]) if found else None
        if memo is not None:
            memo[self._key] = version
        return version

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self._run(sql)

    def close(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.invalidate()  # never back into the pool in autocommit mode


def open_version_reader(engine: Engine) -> VersionReader:
    """The reader for ``engine``'s database (nothing is connected until the first read)."""
    if engine.dialect.name == "sqlite":
        return SqliteVersionReader(Path(str(engine.url.database)))
    return PostgresVersionReader(engine)
