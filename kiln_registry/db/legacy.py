"""Legacy registries on the database side: the pre-Alembic SQLite shape and imported entries.

This module owns:

* ``is_legacy_v0(conn)``: whether a database without ``alembic_version`` is
  exactly the pre-Alembic registry (one ``teachers`` table with the legacy
  columns, types, NOT NULLs and primary key, its automatic index, nothing
  else);
* ``check_legacy_rows(conn, where)``: the rows that revision ``0001_initial``
  will copy must have aliases the API can address and kinds the new schema
  allows, checked before anything changes, with a bounded scan;
* ``insert_legacy_entries(session, entries, source)``: the database half of
  the ``teachers.json`` import (each entry with the status and identity the
  file side derived; aliases already present are left alone, so a second run
  changes nothing, an alias imported before and deleted since is not
  added again: ``legacy_imports`` remembers it, and one the caller's
  ``refusal`` rule refuses is skipped and reported).

``api_key_env`` is never selected or passed through here: the SQLite
conversion never reads that column, and ``LegacyEntry`` has no such field.

Imports: the standard library, SQLAlchemy, ``kiln_registry.domain.aliases``,
``kiln_registry.db.models``, ``kiln_registry.db.repository`` and
``kiln_registry.domain`` (errors, text) only; never the
API, the engine module or Alembic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from kiln_registry.db.models import TEACHER_KINDS, TeacherRow
from kiln_registry.db.repository import LegacyImportRepository, TeacherRepository
from kiln_registry.domain.aliases import alias_problem
from kiln_registry.domain.errors import ConfigError
from kiln_registry.domain.text import SHOWN_CHARS, clipped_repr

LEGACY_BASE_REVISION: Final = "0000_legacy_base"
MAX_LEGACY_ROWS: Final = 10_000
# Also frozen into migrations/versions/0001_initial.py (a test keeps them equal).
LEGACY_STATUS_MESSAGE: Final = (
    "migrated from a legacy registry without a verified identity (its api_key_env, if any,"
    " was removed unread); delete this alias and register it again with a credential_id so"
    " both identity probes can run"
)
# PRAGMA table_info rows of the legacy DDL: (cid, name, type, notnull, default, pk).
LEGACY_V0_TABLE_INFO: Final = (
    (0, "alias", "TEXT", 0, None, 1),
    (1, "kind", "TEXT", 1, None, 0),
    (2, "provider", "TEXT", 0, None, 0),
    (3, "model_id", "TEXT", 0, None, 0),
    (4, "url", "TEXT", 0, None, 0),
    (5, "api_key_env", "TEXT", 0, None, 0),
    (6, "notes", "TEXT", 0, None, 0),
    (7, "spec_json", "TEXT", 1, None, 0),
    (8, "created_at", "TEXT", 1, None, 0),
)
_LEGACY_OBJECTS: Final = (("index", "sqlite_autoindex_teachers_1"), ("table", "teachers"))
_MAX_OBJECTS: Final = 16


# An imported entry without an authoritative identity (and without api_key_env).
LEGACY_NO_IDENTITY_MESSAGE: Final = (
    "imported from a Kiln teachers.json without an authoritative identity; delete this alias"
    " and register it again so both identity probes can run (a deleted alias stays reserved"
    " until an admin runs `kiln teachers release ALIAS`)"
)


@dataclass(frozen=True, slots=True)
class LegacyEntry:
    """One validated entry of a legacy registry file, never with a secret name.

    By default the entry is ``legacy_unverified`` without an identity (the
    shape of an entry that carried ``api_key_env``); the file side sets the
    status and identity Kiln would give a current-format entry.
    """

    alias: str
    kind: str
    provider: str | None = None
    model_id: str | None = None
    url: str | None = None
    credential_id: str | None = None
    notes: str | None = None
    adapter: str | None = None
    identity_json: str | None = None
    identity_digest: str | None = None
    status: str = "legacy_unverified"
    status_message: str | None = LEGACY_STATUS_MESSAGE


def _shown(value: object) -> str:
    return clipped_repr(value, SHOWN_CHARS)


def is_legacy_v0(conn: Connection) -> bool:
    """True when the schema is exactly the pre-Alembic registry's (see the module docstring)."""
    objects = conn.execute(
        text("SELECT type, name FROM sqlite_master ORDER BY type, name LIMIT :cap"),
        {"cap": _MAX_OBJECTS},
    ).all()
    if tuple((str(row[0]), str(row[1])) for row in objects) != _LEGACY_OBJECTS:
        return False
    info = conn.exec_driver_sql("PRAGMA table_info(teachers)").all()
    return tuple(tuple(row) for row in info) == LEGACY_V0_TABLE_INFO


def _row_problem(alias: object, kind: object) -> tuple[str, str] | None:
    # The API's alias rule (kiln_registry.domain.aliases): an alias outside it could
    # not be addressed, so not deleted, over the API.
    problem = alias_problem(alias)
    if problem is not None:
        return ("legacy.alias", f"alias {_shown(alias)}: {problem}")
    if not isinstance(kind, str) or kind not in TEACHER_KINDS:
        return (
            "legacy.kind",
            f"alias {alias!r} has kind {_shown(kind)}, not one of {', '.join(TEACHER_KINDS)}",
        )
    return None


def check_legacy_rows(conn: Connection, where: str) -> int:
    """Refuse legacy rows the conversion cannot carry; return how many rows there are.

    Reads only ``alias`` and ``kind``, at most ``MAX_LEGACY_ROWS + 1`` rows.
    """
    rows = conn.execute(
        text("SELECT alias, kind FROM teachers ORDER BY rowid LIMIT :cap"),
        {"cap": MAX_LEGACY_ROWS + 1},
    ).all()
    if len(rows) > MAX_LEGACY_ROWS:
        raise ConfigError(
            f"legacy database {where} has more than {MAX_LEGACY_ROWS} teachers",
            rule="legacy.too_many",
        )
    for alias, kind in rows:
        problem = _row_problem(alias, kind)
        if problem is not None:
            raise ConfigError(
                f"legacy database {where}: {problem[1]}; nothing was changed",
                rule=problem[0],
                hint="fix or delete that row with the release that wrote the database",
            )
    return len(rows)


def insert_legacy_entries(
    session: Session,
    entries: Sequence[LegacyEntry],
    source: str,
    on_progress: Callable[[int, int], None] | None = None,
    refusal: Callable[[str], str | None] | None = None,
) -> tuple[list[str], list[str], list[str], list[tuple[str, str]]]:
    """Add each entry; return the aliases imported, already present, deleted since
    import, and refused (with the reason).

    Runs in the caller's transaction and never commits.  An alias that is
    already registered (imported earlier, or registered again since) is
    left exactly as it is; one that an earlier import added and that was
    deleted since is skipped; one for which ``refusal(alias)`` gives a reason
    (reserved, a look-alike, an invisible character: the registration rules)
    is skipped and reported.  Every added alias is recorded as imported.
    ``on_progress(done, total)`` is called after each entry.
    """
    if len(entries) > MAX_LEGACY_ROWS:
        raise ConfigError(f"more than {MAX_LEGACY_ROWS} legacy entries", rule="legacy.too_many")
    repo, record = TeacherRepository(session), LegacyImportRepository(session)
    imported: list[str] = []
    present: list[str] = []
    deleted: list[str] = []
    refused: list[tuple[str, str]] = []
    for done, entry in enumerate(entries, 1):
        if repo.get(entry.alias) is not None:
            present.append(entry.alias)
        elif record.was_imported(entry.alias):
            deleted.append(entry.alias)
        elif refusal is not None and (reason := refusal(entry.alias)) is not None:
            refused.append((entry.alias, reason))
        else:
            repo.insert(_row(entry))
            record.record_import(entry.alias, source)
            imported.append(entry.alias)
        if on_progress is not None:
            on_progress(done, len(entries))
    return imported, present, deleted, refused


def _row(entry: LegacyEntry) -> TeacherRow:
    return TeacherRow(
        alias=entry.alias,
        kind=entry.kind,
        provider=entry.provider,
        model_id=entry.model_id,
        url=entry.url,
        credential_id=entry.credential_id,
        notes=entry.notes,
        adapter=entry.adapter,
        identity_json=entry.identity_json,
        identity_digest=entry.identity_digest,
        status=entry.status,
        status_message=entry.status_message,
    )
