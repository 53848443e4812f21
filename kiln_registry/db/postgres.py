"""The PostgreSQL engine: the same transaction rules as the SQLite one.

The registry's code relies on SQLite's write discipline: a transaction that
may write BEGINs IMMEDIATE and so runs alone among writers, while readers
(``BEGIN DEFERRED``) never wait.  On PostgreSQL the same discipline is one
transaction-scoped advisory lock (``pg_advisory_xact_lock(WRITE_LOCK_KEY)``),
taken by the engine's ``begin`` event unless the connection asked for a
deferred BEGIN, and released by COMMIT or ROLLBACK.  Every invariant that
holds because writers are serialised on SQLite (the alias look-alike check
and the ``max_teachers`` cap, claims, leases, upgrades) therefore holds on
PostgreSQL across every replica and worker sharing the database.  Row-level
concurrency beyond that (``FOR UPDATE SKIP LOCKED`` claims) is still
available to the code that wants it.

The password is never part of the URL or the engine: ``do_connect`` reads
the named environment variable just before each new connection.  A
connection's ``lock_timeout`` bounds the wait for the write lock, as SQLite's
busy timeout does.  A connection left idle inside a transaction for
``IDLE_IN_TRANSACTION_MS`` (a frozen, partitioned or wedged client; the registry
never waits on anything inside a transaction) is ended by the server, so its
write lock cannot stop every other replica and worker for longer than that.

Imports: the standard library, SQLAlchemy, ``config.database`` and the errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError

from kiln_registry.config.database import PostgresDatabase
from kiln_registry.domain.errors import ConfigError

# The execution option both engines honour: "DEFERRED" for a read transaction.
BEGIN_OPTION: Final = "kiln_sqlite_begin"
# Any fixed 64-bit number, the same in every process: "kiln" in ASCII.
WRITE_LOCK_KEY: Final = 0x6B696C6E
LOCK_TIMEOUT_MS: Final = 30_000
IDLE_IN_TRANSACTION_MS: Final = 20_000  # below LOCK_TIMEOUT_MS: waiters outlast a frozen holder
CONNECT_TIMEOUT_S: Final = 10
POOL_SIZE: Final = 8
_MAX_ERROR_CHARS: Final = 300


def _read_password(name: str, environ: Mapping[str, str] | None) -> str:
    value = (os.environ if environ is None else environ).get(name)
    if not value:
        raise ConfigError(
            f"environment variable {name} (database_password_env) is not set or empty",
            rule="db.password_env",
            hint=f"export {name} with the PostgreSQL role's password before starting",
        )
    return value


def _on_begin(connection: Connection) -> None:
    mode = connection.get_execution_options().get(BEGIN_OPTION, "IMMEDIATE")
    if mode == "DEFERRED":
        return
    if mode != "IMMEDIATE":
        raise ConfigError(
            f"execution option {BEGIN_OPTION}={mode!r} is not one of DEFERRED, IMMEDIATE",
            rule="db.begin_mode",
        )
    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")


def _scrub(message: str, secret: str | None) -> str:
    first = message.strip().splitlines()[0] if message.strip() else "no detail"
    if secret:
        first = first.replace(secret, "***")
    return first[:_MAX_ERROR_CHARS]


def open_postgres(
    database: PostgresDatabase,
    *,
    password_env: str | None,
    environ: Mapping[str, str] | None = None,
) -> Engine:
    """An Engine on ``database``; one connection is opened now to prove it works."""
    if password_env is not None:
        _read_password(password_env, environ)  # fail before any network I/O
    engine = create_engine(
        database.url(),
        hide_parameters=True,
        pool_pre_ping=True,
        pool_size=POOL_SIZE,
        connect_args={
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": f"-c lock_timeout={LOCK_TIMEOUT_MS} -c timezone=UTC"
            f" -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
        },
    )

    @event.listens_for(engine, "do_connect")
    def _password(_d: Any, _r: Any, _args: Any, params: dict[str, Any]) -> None:
        if password_env is not None:
            params["password"] = _read_password(password_env, environ)

    event.listen(engine, "begin", _on_begin)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            conn.rollback()
    except DBAPIError as exc:
        engine.dispose()
        secret = (os.environ if environ is None else environ).get(password_env or "")
        raise ConfigError(
            f"cannot connect to PostgreSQL database {database.display()}: "
            f"{_scrub(str(exc.orig), secret)}",
            rule="db.open",
            hint="check the server, the role, database_password_env and the URL's parameters",
        ) from None
    except BaseException:
        engine.dispose()
        raise
    return engine


def table_names(conn: Connection, cap: int) -> list[str]:
    """Tables in the connection's current schema (at most ``cap`` + 1, sorted)."""
    rows = conn.execute(
        text(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = current_schema() "
            "ORDER BY tablename LIMIT :cap"
        ),
        {"cap": cap + 1},
    ).all()
    return [str(row[0]) for row in rows]
