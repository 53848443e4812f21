"""Opening the configured database and deciding what its schema revision allows.

Every command that touches the registry's database opens it here:

* ``open_database(server)``: the SQLite file (its folder created, private to
  the user, on a first run) or the PostgreSQL database of ``[server]``
  (``database``, ``database_password_env``);
* ``ensure_schema(engine, upgrade=...)``: an empty database is created at
  head; one at head is used as it is; one behind head (or a legacy SQLite
  registry) is upgraded only when the operator asked (``kiln db upgrade``,
  ``kiln serve --upgrade``), otherwise refused with the command to run.  A
  revision this release does not know is always refused.
* ``require_head(engine)``: for processes that never change the schema
  (``kiln worker``, the offline job commands): the database must exist and
  be exactly at head.

Imports: the standard library, SQLAlchemy and ``kiln_registry.db``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from sqlalchemy import Engine

from kiln_registry.config.database import PostgresDatabase
from kiln_registry.db.engine import (
    current_revision,
    database_label,
    head_revision,
    open_engine,
    upgrade_to_head,
    usable_shape,
)
from kiln_registry.domain.errors import ConfigError

UPGRADE_HINT = "run `kiln db upgrade --config kiln.toml` (or start `kiln serve --upgrade`)"


class DatabaseKeys(Protocol):
    """The ``[server]`` keys that name the database (``ServerConfig`` has them)."""

    @property
    def database(self) -> Path | PostgresDatabase: ...

    @property
    def database_password_env(self) -> str | None: ...

    @property
    def state_path(self) -> Path: ...


def open_database(server: DatabaseKeys, *, create: bool = True) -> Engine:
    """An Engine on the configured database; ``create=False`` refuses a missing SQLite file.

    With PostgreSQL the ``state_dir`` folder is created (mode 0700) if missing.
    """
    location = server.database
    if isinstance(location, PostgresDatabase):
        # The files every process keeps (signing key, results) live in state_dir.
        server.state_path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return open_engine(location, password_env=server.database_password_env)
    if not location.exists() and not create:
        raise ConfigError(
            f"database {location} does not exist",
            rule="db.path",
            hint="start `kiln serve` (or run `kiln db upgrade`) once to create it",
        )
    if create and not location.parent.exists():
        location.parent.mkdir(mode=0o700, parents=True)
    return open_engine(location)


def ensure_schema(engine: Engine, *, upgrade: bool) -> str:
    """The database's revision after creating or (when allowed) upgrading it."""
    shape = usable_shape(engine)  # refuses an unrecognised database or a newer revision
    revision = current_revision(engine) if shape == "alembic" else None
    head = head_revision()
    if revision == head:
        return head
    if shape == "empty" or upgrade:
        return upgrade_to_head(engine)
    where = database_label(engine)
    found = "a legacy registry" if shape == "legacy_v0" else f"at revision {revision}"
    raise ConfigError(
        f"database {where} is {found}, behind this release's schema {head}",
        rule="db.behind_head",
        hint=UPGRADE_HINT,
    )


def require_head(engine: Engine) -> str:
    """Refuse a database that is not exactly at head (this process never migrates)."""
    usable_shape(engine)  # a newer revision or a foreign database: its own, clearer refusal
    revision = current_revision(engine)
    head = head_revision()
    if revision != head:
        raise ConfigError(
            f"database {database_label(engine)} is at revision {revision or 'none'}, "
            f"not this release's schema {head}",
            rule="db.revision",
            hint=UPGRADE_HINT,
        )
    return revision
