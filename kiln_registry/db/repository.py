"""Data access for teachers and probe receipts: the only place registry SQL is built.

``TeacherRepository`` wraps a caller's ``Session`` and NEVER commits or
rolls back the outer transaction; ``unit_of_work(factory)`` is the one place
that does (the API's request-scoped dependency and the CLI both use it).

Alias immutability is the ``teachers`` primary key, not a check-then-insert:
two concurrent registrations of one alias both reach the INSERT, and the
loser's constraint violation is translated to ``AliasExists`` here, inside a
SAVEPOINT so that the caller's transaction stays usable.

Every list is bounded by an explicit limit checked before the query runs.
Rows hold no secrets (a ``credential_id`` is a name), so nothing here needs
redaction; callers must still keep secrets out of ``notes``, status messages
and receipt reports.

Imports: the standard library, SQLAlchemy, ``kiln_registry.db.models`` and
``kiln_registry.domain`` (aliases, errors, text) only.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, cast

from sqlalchemy import CursorResult, Insert, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.db.models import (
    LEGACY_IMPORT_OUTCOMES,
    RECEIPT_OUTCOMES,
    TEACHER_KINDS,
    TEACHER_STATUSES,
    LegacyImportRow,
    LegacyImportStatusRow,
    ProbeReceiptRow,
    TeacherRow,
    utc_timestamp,
)
from kiln_registry.domain.alias_skeleton import alias_hazard, alias_skeleton
from kiln_registry.domain.errors import (
    AliasExists,
    InputError,
    RegistrationInvalid,
    TeacherLimitReached,
    TeacherNotFound,
)
from kiln_registry.domain.text import clipped

MAX_LIST_LIMIT: Final = 10_000
DEFAULT_MAX_TEACHERS: Final = 10_000  # [server] max_teachers
MAX_RECEIPT_LIMIT: Final = 1_000
MAX_REPORT_BYTES: Final = 1 << 20
MAX_STATUS_MESSAGE_CHARS: Final = 2_000
_PG_UNIQUE_VIOLATION: Final = "23505"
_UNIQUE_ERRORS: Final = frozenset({"SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"})


def _check_limit(limit: int, ceiling: int, name: str) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= ceiling:
        raise InputError(f"{name} must be an integer from 1 to {ceiling}", rule="db.limit")


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise RegistrationInvalid(
            f"{field} {value!r} is not one of {', '.join(allowed)}", rule=f"teacher.{field}"
        )


def is_unique_violation(exc: IntegrityError) -> bool:
    """A primary-key or unique violation, on SQLite or PostgreSQL (SQLSTATE 23505)."""
    orig = exc.orig
    if isinstance(orig, sqlite3.IntegrityError):
        return getattr(orig, "sqlite_errorname", None) in _UNIQUE_ERRORS
    return getattr(orig, "sqlstate", None) == _PG_UNIQUE_VIOLATION


def add_unless_duplicate(session: Session, row: object) -> bool:
    """Add ``row`` in a savepoint and flush it; False when a unique key already holds it.

    A unique or primary-key violation rolls back the savepoint only (the
    caller's transaction goes on); any other integrity error propagates.
    """
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError as exc:
        if not is_unique_violation(exc):
            raise
        return False
    return True


def insert_ignoring_duplicates(session: Session, model: type[Any]) -> Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` into ``model`` in the session's dialect."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model).on_conflict_do_nothing()
    return sqlite.insert(model).on_conflict_do_nothing()


def _report_json(report: Mapping[str, Any]) -> str:
    """Canonical-ish JSON of a receipt report, refused above ``MAX_REPORT_BYTES``."""
    try:
        encoded = json.dumps(
            report, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InputError(f"probe receipt report is not JSON: {exc}", rule="db.receipt") from exc
    if len(encoded.encode("utf-8")) > MAX_REPORT_BYTES:
        raise InputError(
            f"probe receipt report exceeds {MAX_REPORT_BYTES} bytes", rule="db.receipt_size"
        )
    return encoded


def _clip(message: str | None) -> str | None:
    return None if message is None else clipped(message, MAX_STATUS_MESSAGE_CHARS)


class TeacherRepository:
    """Teachers and their probe receipts, within the caller's session and transaction."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def insert(self, row: TeacherRow, *, max_teachers: int = DEFAULT_MAX_TEACHERS) -> None:
        """Add a new alias; ``AliasExists`` if it (or its NFKC case-fold) is registered.

        The fold comparison and the ``max_teachers`` cap run in the caller's
        write transaction, so two racing registrations cannot both pass them.
        """
        _check_choice("kind", row.kind, TEACHER_KINDS)
        _check_choice("status", row.status, TEACHER_STATUSES)
        self.check_new_alias(row.alias, max_teachers)
        # An unset mapped attribute reads as None until flush; both
        # timestamps get the same instant rather than two column defaults.
        if row.created_at is None:
            row.created_at = utc_timestamp()
        if row.updated_at is None:
            row.updated_at = row.created_at
        if not add_unless_duplicate(self._session, row):
            raise AliasExists(f"teacher alias {row.alias!r} is already registered")

    def get(self, alias: str) -> TeacherRow | None:
        return self._session.get(TeacherRow, alias)

    def check_new_alias(self, alias: str, max_teachers: int = DEFAULT_MAX_TEACHERS) -> None:
        """Refuse an alias with invisible characters, a look-alike of a registered alias
        (same ``alias_skeleton``), or any new alias past the cap."""
        hazard = alias_hazard(alias)
        if hazard is not None:
            raise RegistrationInvalid(
                f"teacher alias {alias!r}: {hazard}",
                rule="alias.invisible",
                hint="use visible characters only, with no white space at either end",
            )
        existing = list(self._session.scalars(select(TeacherRow.alias).limit(max_teachers + 1)))
        if len(existing) >= max_teachers:
            raise TeacherLimitReached(
                f"the registry holds {max_teachers} aliases, its [server] max_teachers limit",
                hint="delete unused aliases or raise [server] max_teachers",
            )
        skeleton = alias_skeleton(alias)
        for other in existing:
            if other != alias and alias_skeleton(other) == skeleton:
                raise AliasExists(
                    f"teacher alias {alias!r} differs from the registered {other!r} only by"
                    " case, Unicode compatibility form or look-alike characters",
                    rule="alias.lookalike",
                )

    def list_all(self, limit: int = MAX_LIST_LIMIT, after: str | None = None) -> list[TeacherRow]:
        """Up to ``limit`` teachers, ordered by alias (those after ``after`` when given)."""
        _check_limit(limit, MAX_LIST_LIMIT, "limit")
        query = select(TeacherRow).order_by(TeacherRow.alias).limit(limit)
        if after is not None:
            query = query.where(TeacherRow.alias > after)
        return list(self._session.scalars(query))

    def delete(self, alias: str) -> bool:
        """Remove an alias (its receipts stay); False if it was not registered."""
        result = self._session.execute(
            delete(TeacherRow).where(TeacherRow.alias == alias),
            execution_options={"synchronize_session": "fetch"},
        )
        return cast("CursorResult[Any]", result).rowcount > 0

    def update_status(self, alias: str, status: str, message: str | None) -> None:
        """Set the alias's status and message; ``TeacherNotFound`` if it is not registered.

        Messages longer than ``MAX_STATUS_MESSAGE_CHARS`` are clipped.
        """
        _check_choice("status", status, TEACHER_STATUSES)
        result = self._session.execute(
            update(TeacherRow)
            .where(TeacherRow.alias == alias)
            .values(status=status, status_message=_clip(message), updated_at=utc_timestamp()),
            execution_options={"synchronize_session": "fetch"},
        )
        if cast("CursorResult[Any]", result).rowcount == 0:
            raise TeacherNotFound(f"teacher alias {alias!r} is not registered")

    def add_receipt(
        self,
        alias: str,
        outcome: str,
        identity_digest: str | None,
        report: Mapping[str, Any],
    ) -> int:
        """Record one probe outcome and return the receipt's id."""
        if outcome not in RECEIPT_OUTCOMES:
            raise InputError(
                f"receipt outcome {outcome!r} is not one of {', '.join(RECEIPT_OUTCOMES)}",
                rule="db.receipt_outcome",
            )
        receipt = ProbeReceiptRow(
            alias=alias,
            outcome=outcome,
            identity_digest=identity_digest,
            report_json=_report_json(report),
        )
        self._session.add(receipt)
        self._session.flush()
        return receipt.id

    def list_receipts(
        self, alias: str, limit: int = 100, before: tuple[str, int] | None = None
    ) -> list[ProbeReceiptRow]:
        """The alias's newest ``limit`` receipts, newest first.

        ``before`` is the ``(created_at, id)`` of the last receipt of the previous page.
        """
        _check_limit(limit, MAX_RECEIPT_LIMIT + 1, "limit")
        query = (
            select(ProbeReceiptRow)
            .where(ProbeReceiptRow.alias == alias)
            .order_by(ProbeReceiptRow.created_at.desc(), ProbeReceiptRow.id.desc())
            .limit(limit)
        )
        if before is not None:
            created, last = before
            older = ProbeReceiptRow.created_at < created
            same = (ProbeReceiptRow.created_at == created) & (ProbeReceiptRow.id < last)
            query = query.where(older | same)
        return list(self._session.scalars(query))


class LegacyImportRepository:
    """The record of ``teachers.json`` imports, within the caller's transaction.

    ``imported`` aliases are remembered after the alias is deleted, so the
    next start-up import does not add it again; ``status`` is the outcome of
    the last start-up import (one row), which ``GET /ready`` reports.
    """

    def __init__(self, session: Session) -> None:
        self._session = session

    def was_imported(self, alias: str) -> bool:
        return self._session.get(LegacyImportRow, alias) is not None

    def record_import(self, alias: str, source: str) -> None:
        self._session.add(LegacyImportRow(alias=alias, source=source))

    def set_status(self, source: str, outcome: str, rule: str | None, message: str) -> None:
        """Replace the last start-up outcome (message clipped like a status message)."""
        if outcome not in LEGACY_IMPORT_OUTCOMES:
            raise InputError(f"legacy import outcome {outcome!r} is unknown", rule="db.legacy")
        clipped = _clip(message) or ""
        row = LegacyImportStatusRow(
            id=1, source=source, outcome=outcome, rule=rule, message=clipped
        )
        row.checked_at = utc_timestamp()
        self._session.merge(row)

    def clear_status(self) -> None:
        self._session.execute(delete(LegacyImportStatusRow))

    def status(self) -> LegacyImportStatusRow | None:
        return self._session.get(LegacyImportStatusRow, 1)


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One transaction: commit when the block succeeds, roll back when it raises."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
