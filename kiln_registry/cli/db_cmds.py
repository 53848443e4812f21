"""``kiln db upgrade --config kiln.toml``: bring the configured database to this release's schema.

``kiln serve`` creates a new database at head but refuses one behind head
unless started with ``--upgrade``; this command is the explicit step, run
once per release by whoever operates the database (several replicas and
workers then start on it unchanged).  It prints one JSON object: the
database (never a password) and its revision before and after.

``kiln db copy --from SRC --to DST`` moves a registry into a new, empty
database (a SQLite registry onto PostgreSQL above all; ``kiln_registry.db.copy``
has the rules).  SRC and DST are spelled as ``[server] database`` is
(relative paths from the current directory); a PostgreSQL password comes
only from the variable named by ``--from-password-env``/``--to-password-env``.
It prints one JSON summary: both databases (no password), the revision and
the rows per table.

Imports: standard library and kiln_registry (config, db); never the API.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from kiln_registry.cli.argtypes import env_name
from kiln_registry.config.database import PostgresDatabase
from kiln_registry.config.loader import check_startup_environment, load_config
from kiln_registry.db.copy import copy_database, parse_location
from kiln_registry.db.engine import current_revision, database_label, open_engine
from kiln_registry.db.opening import ensure_schema, open_database, require_head
from kiln_registry.domain.errors import ConfigError

SubParsers = Any  # argparse's _SubParsersAction is private


def _upgrade(args: argparse.Namespace) -> int:
    import os

    config = load_config(args.config)
    check_startup_environment(config, os.environ)
    engine = open_database(config.server)
    try:
        before = current_revision(engine)
        after = ensure_schema(engine, upgrade=True)
        label = database_label(engine)
    finally:
        engine.dispose()
    summary = {"database": label, "revision_before": before, "revision": after}
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


def _open_side(value: str, password_env: str | None, *, flag: str, source: bool) -> Engine:
    location = parse_location(value, flag=flag, cwd=Path.cwd())
    if isinstance(location, PostgresDatabase):
        return open_engine(location, password_env=password_env)
    if password_env is not None:
        raise ConfigError(
            f"{flag}-password-env applies only to a PostgreSQL database", rule="db.password_env"
        )
    if source and not location.is_file():
        # open_engine would create an empty file; the source must be an existing registry.
        raise ConfigError(f"{flag}: database {location} does not exist", rule="db.path")
    return open_engine(location)


def _copy(args: argparse.Namespace) -> int:
    source = _open_side(args.source, args.from_password_env, flag="--from", source=True)
    try:
        require_head(source)  # before the target is opened (a SQLite target is created)
        target = _open_side(args.target, args.to_password_env, flag="--to", source=False)
        try:
            summary = copy_database(source, target)
        finally:
            target.dispose()
    finally:
        source.dispose()
    sys.stdout.write(json.dumps(summary.as_json(), indent=2) + "\n")
    return 0


def register(sub: SubParsers) -> None:
    db = sub.add_parser("db", help="create, upgrade or copy the registry database")
    commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = commands.add_parser(
        "upgrade", help="upgrade the configured database to this release's schema (one transaction)"
    )
    upgrade.add_argument("--config", type=Path, required=True, help="path to kiln.toml")
    upgrade.set_defaults(func=_upgrade)
    copy = commands.add_parser(
        "copy", help="copy a registry database into a new, empty one (e.g. SQLite to PostgreSQL)"
    )
    copy.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="DATABASE",
        help="the registry to read: a SQLite path, sqlite:///PATH or a "
        "postgresql+psycopg:// URL (no password in it)",
    )
    copy.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="DATABASE",
        help="the empty database to create the schema in and fill",
    )
    copy.add_argument(
        "--from-password-env",
        type=env_name,
        metavar="NAME",
        help="environment variable holding the source PostgreSQL password",
    )
    copy.add_argument(
        "--to-password-env",
        type=env_name,
        metavar="NAME",
        help="environment variable holding the target PostgreSQL password",
    )
    copy.set_defaults(func=_copy)
