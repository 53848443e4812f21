"""``kiln tokens create|list|revoke``: API tokens, written straight to the database.

These commands run on the registry host with the server's ``kiln.toml``: they
open (and upgrade) the configured database, so they work whether or not the
server runs, and a running server sees a revocation on its next request.
``create`` prints the token once, on stdout (the only time it exists; only
its SHA-256 digest is stored); ``list`` never shows a token.  Each create and
revoke is written to the audit log in the same transaction (no token name
acting: the caller is whoever can write the database).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from kiln_registry.auth.repository import AuditBounds, AuditRepository, TokenRepository
from kiln_registry.auth.tokens import SCOPES, check_scopes
from kiln_registry.config.loader import load_config
from kiln_registry.db.engine import session_factory
from kiln_registry.db.opening import ensure_schema, open_database
from kiln_registry.db.repository import unit_of_work
from kiln_registry.domain.text import quoted

SubParsers = Any  # argparse's _SubParsersAction is private


def _sessions(config_path: Path) -> Any:
    config = load_config(config_path)
    engine = open_database(config.server)
    try:
        ensure_schema(engine, upgrade=False)
    except BaseException:
        engine.dispose()
        raise
    return engine, session_factory(engine)


def _audit(session: Session, config_path: Path, action: str, name: str) -> None:
    """One audit row, kept within ``[server] audit_max_events`` / ``audit_retain_days``."""
    server = load_config(config_path).server
    bounds = AuditBounds(
        max_events=server.audit_max_events,
        retain_days=server.audit_retain_days,
        keep_days=server.audit_keep_days,
    )
    AuditRepository(session, bounds).record(
        token_name=None, action=action, target=name, outcome="ok"
    )


def _create(args: argparse.Namespace) -> int:
    scopes = check_scopes(args.scope)
    engine, sessions = _sessions(args.config)
    try:
        with unit_of_work(sessions) as session:
            token = TokenRepository(session).create(args.name, scopes, args.expires_in)
            _audit(session, args.config, "token.create", args.name)
    finally:
        engine.dispose()
    if args.json:
        doc = {"name": args.name, "scopes": sorted(scopes), "token": token}
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        sys.stderr.write(f"token {args.name!r} ({', '.join(sorted(scopes))}); shown only once:\n")
        sys.stdout.write(token + "\n")
    return 0


def _list(args: argparse.Namespace) -> int:
    engine, sessions = _sessions(args.config)
    try:
        with unit_of_work(sessions) as session:
            rows: list[dict[str, Any]] = [
                {
                    "name": r.name,
                    "scopes": r.scopes.split(),
                    "created_at": r.created_at,
                    "expires_at": r.expires_at,
                    "last_used_at": r.last_used_at,
                }
                for r in TokenRepository(session).list_all()
            ]
    finally:
        engine.dispose()
    if args.json:
        sys.stdout.write(json.dumps({"tokens": rows}, indent=2) + "\n")
        return 0
    for row in rows:
        print(
            f"{row['name']}\t{','.join(row['scopes'])}\tcreated {row['created_at']}"
            f"\texpires {row['expires_at'] or 'never'}\tlast used {row['last_used_at'] or 'never'}"
        )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    engine, sessions = _sessions(args.config)
    try:
        with unit_of_work(sessions) as session:
            TokenRepository(session).revoke(args.name)
            _audit(session, args.config, "token.revoke", args.name)
    finally:
        engine.dispose()
    print(f"revoked {args.name}")
    return 0


def _days(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 3650:
        raise argparse.ArgumentTypeError(f"{quoted(text, 16)} is not a number of days in 1..3650")
    return int(text)


def register(sub: SubParsers) -> None:
    group = sub.add_parser("tokens", help="create, list and revoke API tokens").add_subparsers(
        dest="tokens_command", required=True, metavar="COMMAND"
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, required=True, help="the server's kiln.toml")
    common.add_argument("--json", action="store_true", help="print one JSON document")
    p = group.add_parser("create", help="create a token (printed once)", parents=[common])
    p.add_argument("--name", required=True, help="a name for the token (letters, digits, ._-)")
    p.add_argument(
        "--scope", action="append", choices=SCOPES, required=True, help="repeat for more"
    )
    p.add_argument("--expires-in", type=_days, metavar="DAYS", help="expire after DAYS days")
    p.set_defaults(func=_create)
    p = group.add_parser("list", help="list tokens (never the tokens themselves)", parents=[common])
    p.set_defaults(func=_list)
    p = group.add_parser("revoke", help="revoke a token at once", parents=[common])
    p.add_argument("name")
    p.set_defaults(func=_revoke)
