"""``teachers`` rows as the teachers layer reads and writes them.

Owns the registration fields a caller supplies (``TeacherRequest``, which the
API's ``RegisterTeacherRequest`` satisfies), the stored identity of a row
(``stored_identity``, through ``TeacherIdentity.from_canonical_json``), the
verified-identity requirement, the alias checks before a probe, and the small
row updates (insert, status, quiet delete) every operation shares, and
``persist_new``: a new alias with its receipts in one transaction.

Blocking: callers run these in worker threads.  Imports the database,
identity and vocabulary layers and ``auth.reserved``; never the API layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kiln_registry.auth.reserved import refuse_reserved
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import (
    RELEASE_NOTE,
    AliasExists,
    IdentityRequired,
    TeacherNotFound,
)
from kiln_registry.domain.vocabulary import TeacherKind, TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.probing import Receipt


class TeacherRequest(Protocol):
    """The caller-controlled registration fields (``api.schemas.RegisterTeacherRequest``)."""

    @property
    def alias(self) -> str: ...

    @property
    def kind(self) -> TeacherKind: ...

    @property
    def provider(self) -> str | None: ...

    @property
    def model_id(self) -> str | None: ...

    @property
    def url(self) -> str | None: ...

    @property
    def urls(self) -> tuple[str, ...] | None: ...

    @property
    def credential_id(self) -> str | None: ...

    @property
    def notes(self) -> str | None: ...

    @property
    def adapter(self) -> str | None: ...

    @property
    def launch_profile(self) -> str | None: ...


def stored_identity(row: TeacherRow) -> TeacherIdentity | None:
    """The row's identity, read back strictly, or None when it has none (fixture, legacy)."""
    if row.identity_json is None:
        return None
    return TeacherIdentity.from_canonical_json(row.identity_json)


def require_identity(row: TeacherRow) -> TeacherIdentity:
    """The verified identity of ``row``, or ``IdentityRequired``."""
    identity = stored_identity(row)
    if identity is None or row.status == TeacherStatus.legacy_unverified:
        raise IdentityRequired(
            f"teacher alias {row.alias!r} has no verified identity",
            hint=f"delete the alias and register it again with fresh probes {RELEASE_NOTE}",
        )
    return identity


def verified_fields(identity: TeacherIdentity) -> dict[str, str]:
    """The columns a verified identity sets: model id, canonical JSON and digest."""
    return {
        "model_id": identity.served_model_id,
        "identity_json": identity.canonical_bytes().decode("utf-8"),
        "identity_digest": identity.digest(),
    }


def load_row(ctx: TeacherServices, alias: str) -> TeacherRow:
    """The row of ``alias`` (detached from its session), or ``TeacherNotFound``."""
    with ctx.reading() as session:
        row = TeacherRepository(session).get(alias)
        if row is None:
            raise TeacherNotFound(f"teacher alias {alias!r} is not registered")
        session.expunge(row)
        return row


def alias_free(ctx: TeacherServices, alias: str) -> None:
    """Refuse a taken, reserved or over-the-cap alias before anything is probed."""
    with ctx.reading() as session:
        if TeacherRepository(session).get(alias) is not None:
            raise AliasExists(f"teacher alias {alias!r} is already registered")
        TeacherRepository(session).check_new_alias(alias, ctx.config.server.max_teachers)
        refuse_reserved(session, alias)


def persist_new(ctx: TeacherServices, row: TeacherRow, receipts: Sequence[Receipt]) -> TeacherRow:
    """Insert a new alias (with its replica rows) and its receipts in one transaction."""
    with ctx.writing() as session:
        refuse_reserved(session, row.alias)
        TeacherRepository(session).insert(row, max_teachers=ctx.config.server.max_teachers)
        for receipt in receipts:
            receipt.store(session, row.alias, row.identity_digest)
        return row


def insert_row(ctx: TeacherServices, row: TeacherRow) -> None:
    with ctx.writing() as session:
        TeacherRepository(session).insert(row, max_teachers=ctx.config.server.max_teachers)


def delete_quietly(ctx: TeacherServices, alias: str) -> None:
    with ctx.writing() as session:
        TeacherRepository(session).delete(alias)


def set_status(ctx: TeacherServices, alias: str, status: str, message: str | None) -> None:
    """Update the alias's status; nothing when it was deleted meanwhile."""
    try:
        with ctx.writing() as session:
            TeacherRepository(session).update_status(alias, status, message)
    except TeacherNotFound:
        pass  # deleted meanwhile: nothing left to describe
