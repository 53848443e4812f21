"""``kiln db upgrade --config kiln.toml``: bring the configured database to this release's schema.

``kiln serve`` creates a new database at head but refuses one behind head
unless started with ``--upgrade``; this command is the explicit step, run
once per release by whoever operates the database (several replicas and
workers then start on it unchanged).  It prints one JSON object: the
database (never a password) and its revision before and after.

Imports: standard library and kiln_registry (config, db); never the API.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kiln_registry.config.settings import check_startup_environment, load_config
from kiln_registry.db.engine import current_revision, database_label
from kiln_registry.db.opening import ensure_schema, open_database

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


def register(sub: SubParsers) -> None:
    db = sub.add_parser("db", help="create, upgrade or copy the registry database")
    commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = commands.add_parser(
        "upgrade", help="upgrade the configured database to this release's schema (one transaction)"
    )
    upgrade.add_argument("--config", type=Path, required=True, help="path to kiln.toml")
    upgrade.set_defaults(func=_upgrade)
