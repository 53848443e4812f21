"""``[server] database``: a SQLite file or a PostgreSQL server, named without a secret.

The key takes three spellings:

* a bare path (relative to kiln.toml) or ``sqlite:///path``: the embedded
  SQLite registry, the single-machine default;
* ``postgresql+psycopg://user@host:port/dbname`` (``postgresql://`` means the
  same): a PostgreSQL server shared by several registry replicas and job
  workers.  The URL must not carry a password: ``[server]
  database_password_env`` names the environment variable that holds it, read
  just before each new connection (``kiln_registry.db.engine``), never kept
  in the URL, a log line or an error.

``PostgresDatabase`` is the parsed, password-free form.  Only the query
parameters in ``ALLOWED_QUERY`` are accepted (TLS and timeouts); anything else
is refused, never passed through to libpq.  Nothing here opens a connection.

Imports: the standard library, pydantic and SQLAlchemy's URL parser.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

POSTGRES_DRIVER: Final = "postgresql+psycopg"
_POSTGRES_SCHEMES: Final = frozenset({"postgresql", POSTGRES_DRIVER})
SQLITE_PREFIX: Final = "sqlite:///"
ALLOWED_QUERY: Final = frozenset(
    {"sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "application_name"}
)
MAX_URL_CHARS: Final = 2048
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


class PostgresDatabase(BaseModel):
    """A PostgreSQL database by host, port, role and name; never a password."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(default=5432, ge=1, le=65535)
    username: str = Field(min_length=1, max_length=63)
    name: str = Field(min_length=1, max_length=63)
    query: tuple[tuple[str, str], ...] = ()

    def url(self, password: str | None = None) -> URL:
        """The SQLAlchemy URL; ``password`` only for the moment of connecting."""
        return URL.create(
            POSTGRES_DRIVER,
            username=self.username,
            password=password,
            host=self.host,
            port=self.port,
            database=self.name,
            query=dict(self.query),
        )

    def display(self) -> str:
        """``postgresql+psycopg://user@host:port/name``: safe to log (no password)."""
        return f"{POSTGRES_DRIVER}://{self.username}@{self.host}:{self.port}/{self.name}"


def _refuse(reason: str) -> ValueError:
    return ValueError(f"{reason}; write {POSTGRES_DRIVER}://USER@HOST:PORT/DBNAME")


def _check_name(value: str | None, what: str) -> str:
    if not value:
        raise _refuse(f"the PostgreSQL URL names no {what}")
    if len(value) > 63 or not set(value) <= _NAME_CHARS:
        raise _refuse(f"the PostgreSQL {what} must be 1..63 characters of A-Z a-z 0-9 _ - .")
    return value


def parse_postgres(text: str) -> PostgresDatabase:
    """``text`` as a ``PostgresDatabase``; ``ValueError`` (never echoing ``text``) if unusable."""
    if len(text) > MAX_URL_CHARS or any(ord(c) < 0x21 or c == "\x7f" for c in text):
        raise _refuse(f"the PostgreSQL URL must be at most {MAX_URL_CHARS} printable characters")
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise _refuse("the PostgreSQL URL cannot be parsed") from None
    if url.drivername not in _POSTGRES_SCHEMES:
        raise _refuse(f"the database driver {url.drivername!r} is not supported")
    if url.password is not None:
        # The message never repeats the URL: it holds the secret.
        raise ValueError(
            "the PostgreSQL URL carries a password; remove it and name the environment "
            "variable that holds it in [server] database_password_env"
        )
    unknown = sorted(set(url.query) - ALLOWED_QUERY)
    if unknown:
        raise _refuse(
            f"unknown PostgreSQL URL parameter(s) {', '.join(unknown)} "
            f"(allowed: {', '.join(sorted(ALLOWED_QUERY))})"
        )
    query: list[tuple[str, str]] = []
    for key in sorted(url.query):
        value = url.query[key]
        if not isinstance(value, str):
            raise _refuse(f"the PostgreSQL URL parameter {key} is given more than once")
        query.append((key, value))
    host = url.host or ""
    if not host or host.startswith("/"):
        raise _refuse("the PostgreSQL URL names no TCP host")
    return PostgresDatabase(
        host=host,
        port=url.port or 5432,
        username=_check_name(url.username, "user"),
        name=_check_name(url.database, "database name"),
        query=tuple(query),
    )


def database_value(value: object) -> object:
    """Before-validator of ``[server] database``: URLs parsed, bare paths passed on."""
    if not isinstance(value, str):
        return value
    if value.startswith(SQLITE_PREFIX):
        # SQLAlchemy's spelling: sqlite:///rel/path is relative, sqlite:////abs/path absolute.
        return value[len(SQLITE_PREFIX) :]
    scheme = value.split(":", 1)[0].lower() if "://" in value else ""
    if scheme in _POSTGRES_SCHEMES:
        return parse_postgres(value)
    if scheme == "sqlite":
        raise ValueError(f"a SQLite database URL is {SQLITE_PREFIX}PATH (a file, never in memory)")
    if scheme:
        raise ValueError(
            f"database URL scheme {scheme!r} is not supported; use a SQLite path, "
            f"{SQLITE_PREFIX}PATH or {POSTGRES_DRIVER}://USER@HOST:PORT/DBNAME"
        )
    return value
