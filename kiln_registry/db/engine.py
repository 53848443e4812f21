"""Engine, sessions and schema upgrades for the registry's SQLite file.

This module owns how the registry opens its database and brings the schema
to the newest Alembic revision:

* ``open_engine(path)`` returns an Engine on one SQLite file whose every
  connection runs in WAL mode with foreign keys on, a 5 s busy timeout and
  ``synchronous=FULL``.  FULL rather than NORMAL: in WAL mode NORMAL may lose
  the last commits on power loss, and the registry writes rarely, so
  durability of "alias registered" wins over commit latency.
* pysqlite's legacy transaction control is switched off
  (``isolation_level = None``) and the engine's ``begin`` event emits the
  BEGIN itself, so SELECTs and DDL are really inside the transaction
  (transactional DDL, working SAVEPOINTs).  The BEGIN is ``IMMEDIATE`` by
  default: a transaction takes the write lock up front and waits up to the
  busy timeout for it, instead of failing with "database is locked" when a
  read transaction later tries to write.  A connection may opt into a
  deferred BEGIN with the execution option ``kiln_sqlite_begin="DEFERRED"``.
* ``upgrade_to_head(engine)`` checks the file's shape, refuses a revision
  this release does not know, then runs every pending revision inside ONE
  transaction on one connection.  A pre-Alembic (legacy) registry is
  recognised by its exact schema, its rows checked, stamped
  ``0000_legacy_base`` and upgraded in that same transaction; a crash leaves
  either the legacy file or the fully migrated one.
* Every connection runs with ``secure_delete`` on, so deleted rows and
  dropped tables (the legacy ``api_key_env`` column above all) are zeroed
  rather than left in free pages.  After an upgrade the WAL is checkpointed
  and truncated, so no copy of an old page lingers in ``-wal``; after a
  legacy conversion the file is also VACUUMed.
* ``session_factory(engine)`` builds the Session factory that
  ``repository.unit_of_work`` uses.

The Alembic scripts live in the repository's top-level ``migrations/`` (env,
template, ``versions/``); the build maps that folder into the package as
``kiln_registry.migrations`` (``package-dir`` in ``pyproject.toml``), so a
wheel carries them inside the package and an editable install resolves the
same name to the source folder.  ``migrations_dir()`` asks the import system
where that package is and refuses clearly when the scripts are missing.

Imports: the standard library, SQLAlchemy, Alembic, ``kiln_registry``'s
errors and ``kiln_registry.db.legacy``; never the API, probe or launcher layers.
"""

from __future__ import annotations

import importlib.util
import logging
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Final, Literal

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.database import PostgresDatabase
from kiln_registry.db.legacy import LEGACY_BASE_REVISION, check_legacy_rows, is_legacy_v0
from kiln_registry.db.postgres import BEGIN_OPTION as BEGIN_OPTION
from kiln_registry.db.postgres import open_postgres, table_names
from kiln_registry.db.space import needs_conversion
from kiln_registry.domain.errors import ConfigError

log = logging.getLogger("kiln_registry.db")

BUSY_TIMEOUT_MS: Final = 5000
_BEGIN_MODES: Final = {"IMMEDIATE": "BEGIN IMMEDIATE", "DEFERRED": "BEGIN DEFERRED"}
_MAX_TABLES: Final = 1000
_MAX_VERSION_ROWS: Final = 100
DatabaseShape = Literal["empty", "alembic", "legacy_v0", "unknown"]


def migrations_dir() -> Path:
    """The folder of ``kiln_registry.migrations`` (see the module docstring)."""
    spec = importlib.util.find_spec("kiln_registry.migrations")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]).resolve() if locations else Path("kiln_registry/migrations")
    if not (path / "env.py").is_file():
        raise ConfigError(
            f"the Alembic scripts are not at {path}",
            rule="db.migrations_missing",
            hint="reinstall kiln-registry; its package data is incomplete",
        )
    return path


def _on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    # Hand BEGIN to SQLAlchemy (see _on_begin); pysqlite now never begins
    # or commits on its own, so PRAGMAs below run outside any transaction.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # Before WAL, which writes the header of a new file: a new database is created with
        # incremental auto-vacuum (db.space); an older one is converted by upgrade_to_head.
        cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise ConfigError(
                f"SQLite refused WAL mode (journal_mode is {mode[0] if mode else None!r})",
                rule="db.wal",
                hint="put the database on a local file system that supports WAL",
            )
        cursor.execute("PRAGMA foreign_keys = ON")
        enabled = cursor.execute("PRAGMA foreign_keys").fetchone()
        if enabled is None or enabled[0] != 1:
            raise ConfigError(
                "this SQLite build cannot enforce foreign keys", rule="db.foreign_keys"
            )
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA secure_delete = ON")
    finally:
        cursor.close()


def _on_begin(connection: Connection) -> None:
    mode = connection.get_execution_options().get(BEGIN_OPTION, "IMMEDIATE")
    statement = _BEGIN_MODES.get(mode)
    if statement is None:
        raise ConfigError(
            f"execution option {BEGIN_OPTION}={mode!r} is not one of {sorted(_BEGIN_MODES)}",
            rule="db.begin_mode",
        )
    connection.exec_driver_sql(statement)


def open_engine(
    location: str | Path | PostgresDatabase,
    *,
    password_env: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Engine:
    """An Engine on a SQLite file (a path) or a PostgreSQL database.

    SQLite: the file is created if absent; its parent directory must exist.
    PostgreSQL: ``password_env`` names the variable read at each new
    connection (``environ``, default ``os.environ``).  Either way one
    connection is opened at once, so an unusable database fails here with a
    ``ConfigError`` naming it (never the password).
    """
    if isinstance(location, PostgresDatabase):
        return open_postgres(location, password_env=password_env, environ=environ)
    if password_env is not None:
        raise ConfigError("a password variable applies only to PostgreSQL", rule="db.password_env")
    return _open_sqlite(Path(location))


def database_label(engine: Engine) -> str:
    """What error messages call the database: the SQLite path or the password-free URL."""
    if engine.dialect.name == "sqlite":
        return str(engine.url.database)
    return engine.url.render_as_string(hide_password=True)


def _open_sqlite(db_path: Path) -> Engine:
    if not db_path.parent.is_dir():
        raise ConfigError(
            f"database directory {db_path.parent} does not exist",
            rule="db.path",
            hint="create the directory or point the registry at another database path",
        )
    if db_path.exists() and not db_path.is_file():
        raise ConfigError(f"database path {db_path} is not a regular file", rule="db.path")
    # URL.create keeps the path literal: no query-string or URI parsing.
    # hide_parameters: a failed statement's error text (logged, chained into
    # KilnErrors) names the SQL but never echoes the values bound to it.
    engine = create_engine(
        URL.create("sqlite+pysqlite", database=str(db_path)), hide_parameters=True
    )
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        engine.dispose()
        raise ConfigError(
            f"cannot open SQLite database {db_path}: {exc.orig}", rule="db.open"
        ) from exc
    except ConfigError as exc:  # from _on_connect, which cannot see the path
        engine.dispose()
        raise ConfigError(
            f"database {db_path}: {exc.message}", rule=exc.rule, hint=exc.hint
        ) from exc
    except BaseException:
        engine.dispose()
        raise
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


@contextmanager
def read_connection(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn:
        conn = conn.execution_options(**{BEGIN_OPTION: "DEFERRED"})
        try:
            yield conn
        finally:
            conn.rollback()


def _table_names(conn: Connection) -> list[str] | None:
    """User tables in ``conn``'s main schema; None when there are absurdly many."""
    if conn.dialect.name != "sqlite":
        names = table_names(conn, _MAX_TABLES)
        return None if len(names) > _MAX_TABLES else names
    rows = conn.execute(
        text(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name LIMIT :cap"
        ),
        {"cap": _MAX_TABLES + 1},
    ).all()
    if len(rows) > _MAX_TABLES:
        return None
    return [str(row[0]) for row in rows]


def _version_rows(conn: Connection) -> list[str]:
    rows = conn.execute(
        text("SELECT version_num FROM alembic_version LIMIT :cap"),
        {"cap": _MAX_VERSION_ROWS + 1},
    ).all()
    return [str(row[0]) for row in rows]


def detect_database_shape(conn: Connection) -> DatabaseShape:
    """Classify the database behind ``conn`` before any migration touches it.

    ``empty``: no user tables (or only an empty ``alembic_version``).
    ``alembic``: ``alembic_version`` holds a revision.  ``legacy_v0``: exactly
    the pre-Alembic ``teachers`` table and nothing else (``is_legacy_v0``).  ``unknown``:
    anything else, which the registry must not touch.
    """
    tables = _table_names(conn)
    if tables is None:
        return "unknown"
    if "alembic_version" in tables:
        if _version_rows(conn):
            return "alembic"
        return "empty" if tables == ["alembic_version"] else "unknown"
    if not tables:
        return "empty"
    if tables == ["teachers"] and conn.dialect.name == "sqlite" and is_legacy_v0(conn):
        return "legacy_v0"
    return "unknown"


def _alembic_config(script_location: Path, conn: Connection | None = None) -> Config:
    config = Config()
    # Config values go through configparser interpolation: escape '%'.
    config.set_main_option("script_location", str(script_location).replace("%", "%%"))
    if conn is not None:
        config.attributes["connection"] = conn
    return config


def _known_revisions(script: ScriptDirectory) -> set[str]:
    return {rev.revision for rev in script.walk_revisions()}


def _refuse_unusable(conn: Connection, script: ScriptDirectory, where: str) -> DatabaseShape:
    """Raise unless ``conn``'s database is one the upgrade may touch; return its shape."""
    shape = detect_database_shape(conn)
    if shape == "unknown":
        raise ConfigError(
            f"unrecognised database {where}: it has tables but no Alembic revision "
            "and is not a known registry layout",
            rule="db.unrecognised",
            hint="point the registry at its own database file, or at a new path",
        )
    if shape == "alembic":
        unknown = sorted(set(_version_rows(conn)) - _known_revisions(script))
        if unknown:
            raise ConfigError(
                f"database {where} is at revision {', '.join(unknown)}, "
                "which this kiln-registry does not know (written by a newer release?)",
                rule="db.newer_revision",
                hint="run the kiln-registry release that wrote it, or restore a backup",
            )
    return shape


def usable_shape(engine: Engine) -> DatabaseShape:
    """The database's shape; ``ConfigError`` for an unrecognised one or an unknown revision."""
    script = ScriptDirectory.from_config(_alembic_config(migrations_dir()))
    with read_connection(engine) as conn:
        return _refuse_unusable(conn, script, database_label(engine))


def _stamp_legacy(conn: Connection, config: Config, where: str) -> None:
    """Check a legacy registry's rows, then mark it as the legacy base revision."""
    secure = conn.exec_driver_sql("PRAGMA secure_delete").scalar()
    if secure != 1:  # _on_connect set it; the conversion must not leave free pages behind
        raise ConfigError(f"database {where}: secure_delete is off", rule="db.secure_delete")
    count = check_legacy_rows(conn, where)
    command.stamp(config, LEGACY_BASE_REVISION)
    log.info("converting legacy registry %s (%d teachers) to the current schema", where, count)


def _checkpoint(engine: Engine, *, vacuum: bool) -> None:
    """Optionally VACUUM, then copy the WAL into the file and truncate it to zero bytes."""
    raw = engine.raw_connection()
    try:
        # The DBAPI connection has no implicit transactions (_on_connect),
        # so VACUUM and the checkpoint run outside any BEGIN, as they must.
        dbapi = raw.driver_connection
        assert isinstance(dbapi, sqlite3.Connection)
        if vacuum:
            dbapi.execute("VACUUM")
        row = dbapi.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        raw.close()
    if row is None or row[0] != 0:
        log.warning(
            "database %s: the WAL could not be checkpointed now (another connection is busy); "
            "SQLite will checkpoint it later",
            engine.url.database,
        )


def upgrade_to_head(engine: Engine, *, script_location: Path | None = None) -> str:
    """Bring the database to the newest revision in ONE transaction; return that revision.

    ``script_location`` defaults to ``migrations_dir()`` (tests pass a copy).
    Refuses (``ConfigError``) an unrecognised database, a legacy one whose
    rows cannot be carried, and one at a revision the scripts do not know.
    If any revision fails, everything rolls back: the file stays at the
    revision (or legacy shape) it had.  Afterwards the WAL is checkpointed.
    """
    location = script_location if script_location is not None else migrations_dir()
    script = ScriptDirectory.from_config(_alembic_config(location))
    where = database_label(engine)
    # engine.begin(): BEGIN IMMEDIATE (PostgreSQL: the advisory write lock) now,
    # so two starting servers cannot both see "at 0001" and both upgrade;
    # COMMIT only if all succeeded.
    with engine.begin() as conn:
        shape = _refuse_unusable(conn, script, where)
        config = _alembic_config(location, conn)
        if shape == "legacy_v0":
            _stamp_legacy(conn, config, where)
        command.upgrade(config, "head")
        revision = MigrationContext.configure(conn).get_current_revision()
        convert = engine.dialect.name == "sqlite" and needs_conversion(conn)
    if revision is None:
        raise ConfigError(f"database {where} has no revision after upgrade", rule="db.upgrade")
    if engine.dialect.name == "sqlite":
        # VACUUM also turns on incremental auto-vacuum in a file made before it (db.space).
        _checkpoint(engine, vacuum=shape == "legacy_v0" or convert)
    return revision


def upgrade_connection(conn: Connection, *, script_location: Path | None = None) -> str:
    """Run every pending revision on ``conn`` inside the caller's open transaction.

    For a caller that does more in that same transaction (``db.copy`` creates
    the schema of an empty database and fills it, committing once).  The
    caller has checked the database's shape; nothing is committed here.
    """
    location = script_location if script_location is not None else migrations_dir()
    command.upgrade(_alembic_config(location, conn), "head")
    revision = MigrationContext.configure(conn).get_current_revision()
    if revision is None:
        raise ConfigError("the database has no revision after upgrade", rule="db.upgrade")
    return revision


def current_revision(engine: Engine) -> str | None:
    """The database's Alembic revision, or None when it has none (e.g. empty)."""
    with read_connection(engine) as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision(script_location: Path | None = None) -> str:
    """The single head of the script directory (a test keeps the history linear)."""
    location = script_location if script_location is not None else migrations_dir()
    head = ScriptDirectory.from_config(_alembic_config(location)).get_current_head()
    if head is None:
        raise ConfigError(f"no Alembic revisions under {location}", rule="db.migrations_missing")
    return head
