"""``kiln registry import --config kiln.toml PATH``: import a legacy ``teachers.json``.

Owns the argument parsing and the JSON summary on stdout.  The work is
``kiln_registry.legacy.registry.import_legacy_registry`` against the
configured database, upgraded to head first (a legacy SQLite registry is
converted by that upgrade).  The summary names aliases and counts only,
never a value of the removed ``api_key_env``.  Bad input raises
``KilnError`` (``kiln`` prints one line and exits 2).

Imports: standard library and kiln_registry (config, db, legacy_registry);
never the API, probe or launcher layers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kiln_registry.config.loader import load_config
from kiln_registry.db.engine import session_factory
from kiln_registry.db.opening import ensure_schema, open_database
from kiln_registry.legacy.registry import import_legacy_registry
from kiln_registry.observability.progress import ProgressBar

SubParsers = Any  # argparse's _SubParsersAction is private


def _import(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    engine = open_database(config.server)
    try:
        # Importing is maintenance the operator asked for: a legacy SQLite
        # registry is converted (upgraded) first, as before.
        revision = ensure_schema(engine, upgrade=True)
        # A bar over the entries on a terminal (stderr); nothing on a pipe.
        with ProgressBar("kiln registry import", unit="entries") as bar:
            result = import_legacy_registry(
                args.path, session_factory(engine), bar.update_to, server=config.server
            )
    finally:
        engine.dispose()
    summary = {
        "path": str(result.path),
        "database_revision": revision,
        "imported": list(result.imported),
        "already_present": list(result.already_present),
        "refused": [{"alias": alias, "reason": why} for alias, why in result.refused],
        "api_key_env_removed_from": result.stripped_entries,
        "rewritten": result.rewritten,
    }
    sys.stdout.write(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return 0


def register(sub: SubParsers) -> None:
    registry = sub.add_parser("registry", help="maintain the registry database")
    commands = registry.add_subparsers(dest="registry_command", required=True)
    imp = commands.add_parser(
        "import",
        help="import a legacy teachers.json (api_key_env is removed unread; the aliases stay"
        " legacy_unverified until registered again)",
    )
    imp.add_argument("--config", type=Path, required=True, help="path to kiln.toml")
    imp.add_argument("path", type=Path, help="the legacy teachers.json")
    imp.set_defaults(func=_import)
