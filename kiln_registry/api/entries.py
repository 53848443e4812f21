"""Rows to wire: ``TeacherEntry`` and the off-policy manifest line of a stored teacher.

Owns how a ``TeacherRow`` is published, as Kiln's ``teacher_entry``
(``crates/kiln-server/src/api/teachers.rs``) does: the public status (an
internal ``launching`` row is ``unavailable``; a ``verified`` row without an
identity is ``legacy_unverified``; a verified row with a live problem, see
``api.live_status``, is ``unavailable`` with that problem as its
``status_message``), ``usable`` (verified with an identity and no live
problem, or a ``configured`` fixture: Kiln lets a job name a fixture), the
spec fields that come from the identity after a successful probe (model_id =
served_model_id, max_top_k, vocab_size, tokenizer_hash =
tokenizer_vocab_sha256), the capabilities (only for a usable identity; a
fixture registered without bounds has none, as in Kiln) and the revision
``"sha256:" + identity digest``.

Pure: imports pydantic schemas, ``kiln_registry.identity``, the row type and
``teachers.rows.stored_identity`` (the one stored-identity reader);
never opens a session, a socket or FastAPI.
"""

from __future__ import annotations

from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.errors import RELEASE_NOTE
from kiln_registry.domain.vocabulary import TeacherStatus as StoredStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.teachers.rows import stored_identity
from kiln_registry.wire.teachers import (
    LogitSourceCaps,
    RemoteProvider,
    ReplicaStatus,
    TeacherEntry,
    TeacherIdentityV1,
    TeacherKind,
    TeacherReplica,
    TeacherSpec,
    TeacherStatus,
)

LEGACY_MESSAGE = (
    "this alias was migrated from an older registry without a verified identity; delete it"
    " and register it again with a credential_id (or a loopback URL) so both probes can run"
    f" {RELEASE_NOTE}"
)


def public_status(
    row: TeacherRow, identity: TeacherIdentity | None, problem: str | None = None
) -> TeacherStatus:
    if row.status == StoredStatus.launching:
        return TeacherStatus.unavailable
    status = TeacherStatus(row.status)
    if status is TeacherStatus.verified and identity is None:
        return TeacherStatus.legacy_unverified
    if status is TeacherStatus.verified and problem is not None:
        return TeacherStatus.unavailable
    return status


def _status_message(row: TeacherRow, status: TeacherStatus, problem: str | None) -> str | None:
    if row.status_message:
        # Messages stored before issue 15 (some frozen into migrations) say "register it
        # again" without the release step a deleted alias now needs.
        stored = row.status_message
        if "register it again" in stored and "kiln teachers release" not in stored:
            return f"{stored} {RELEASE_NOTE}"
        return stored
    if status is TeacherStatus.legacy_unverified:
        return LEGACY_MESSAGE
    if status is TeacherStatus.unavailable:
        return problem
    return None


def _spec(row: TeacherRow, identity: TeacherIdentity | None) -> TeacherSpec:
    return TeacherSpec(
        alias=row.alias,
        kind=TeacherKind(row.kind),
        provider=RemoteProvider(row.provider) if row.provider else None,
        model_id=identity.served_model_id if identity else (row.model_id or ""),
        max_top_k=identity.max_top_k if identity else None,
        vocab_size=identity.vocab_size if identity else None,
        supports_full_vocab=False if identity else None,
        tokenizer_hash=identity.tokenizer_vocab_sha256 if identity else None,
        identity=TeacherIdentityV1.model_validate(identity.to_dict()) if identity else None,
        url=row.url,
        credential_id=row.credential_id,
        notes=row.notes,
        adapter=row.adapter,
    )


def _capabilities(alias: str, identity: TeacherIdentity) -> LogitSourceCaps:
    return LogitSourceCaps(
        teacher_id=alias,
        vocab_size=identity.vocab_size,
        max_top_k=identity.max_top_k,
        supports_full_vocab=False,
        supports_batched=True,
        tokenizer_hash=identity.tokenizer_vocab_sha256,
    )


def entry_from_row(row: TeacherRow, problem: str | None = None) -> TeacherEntry:
    """The published ``TeacherEntry`` of one stored alias.

    ``problem`` is the live check's finding (``api.live_status``), or None.
    """
    identity = stored_identity(row)
    status = public_status(row, identity, problem)
    verified = status is TeacherStatus.verified and identity is not None
    return TeacherEntry(
        spec=_spec(row, identity),
        capabilities=_capabilities(row.alias, identity) if verified and identity else None,
        status=status,
        usable=verified or status is TeacherStatus.configured,
        identity_revision=identity.revision() if identity else None,
        off_policy_manifest=off_policy_manifest(identity) if identity else None,
        status_message=_status_message(row, status, problem),
        replicas=_replicas(row),
    )


def _replicas(row: TeacherRow) -> list[TeacherReplica] | None:
    """A replica-set alias's endpoints (registry extension); None for one URL (Kiln's shape)."""
    if not row.replicas:
        return None
    return [
        TeacherReplica(
            url=r.url,
            status=ReplicaStatus(r.status),
            status_message=r.status_message or None,
            checked_at=r.checked_at,
        )
        for r in row.replicas
    ]
