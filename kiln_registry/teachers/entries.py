"""Reads to wire: the ``TeacherEntry`` of a stored teacher (``teachers.views.TeacherRead``).

The read side (the identity parsed once, the kind's live checks, the public
status, ``usable`` and the status message) is ``teachers.views``; this module
maps it onto Kiln's ``teacher_entry`` shape
(``crates/kiln-server/src/api/teachers.rs``): the spec fields that come from
the identity after a successful probe (model_id = served_model_id, max_top_k,
vocab_size, tokenizer_hash = tokenizer_vocab_sha256), the capabilities (only
for a usable identity; a fixture registered without bounds has none, as in
Kiln), the revision ``"sha256:" + identity digest`` and the off-policy
manifest line.

Pure: imports pydantic schemas, ``kiln_registry.identity``, the row type and
``teachers.views``; never opens a session, a socket or FastAPI.
"""

from __future__ import annotations

from kiln_registry.db.models import TeacherRow
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.teachers.views import TeacherRead, published
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


def entry_from_read(read: TeacherRead, problem: str | None = None) -> TeacherEntry:
    """The published ``TeacherEntry`` of one stored alias.

    ``problem`` is the live checks' finding now (``TeacherRead.problem``), or None.
    """
    row, identity = read.row, read.identity
    shown = published(read, problem)
    return TeacherEntry(
        spec=_spec(row, identity),
        capabilities=_capabilities(row.alias, identity) if shown.verified and identity else None,
        status=TeacherStatus(shown.status.value),
        usable=shown.usable,
        identity_revision=identity.revision() if identity else None,
        off_policy_manifest=off_policy_manifest(identity) if identity else None,
        status_message=shown.message,
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
