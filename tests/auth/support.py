"""Helpers for the access-control tests: tokens written straight to a registry database.

``create_token`` opens the registry whose SQLite file would be ``database``
(on the active test backend: tests/backend.py), upgrading it as ``kiln
tokens create`` does; ``make_tokens`` creates one token per scope plus an
``all`` token holding every non-admin scope; ``bearer`` is the header dict for a token.
"""

from __future__ import annotations

from pathlib import Path

from kiln_registry.auth.repository import TokenRepository
from kiln_registry.auth.tokens import SCOPES
from kiln_registry.db.engine import session_factory, upgrade_to_head
from kiln_registry.db.repository import unit_of_work
from tests.backend import open_registry_database


def create_token(database: Path, name: str, scopes: set[str], days: int | None = None) -> str:
    engine = open_registry_database(database)
    try:
        upgrade_to_head(engine)
        with unit_of_work(session_factory(engine)) as session:
            return TokenRepository(session).create(name, frozenset(scopes), days)
    finally:
        engine.dispose()


def make_tokens(database: Path) -> dict[str, str]:
    """scope -> a token holding only that scope (``admin`` holds admin)."""
    return {scope: create_token(database, f"t-{scope}", {scope}) for scope in SCOPES}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}
