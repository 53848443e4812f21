"""Rows to wire: ``TeacherEntry`` and the off-policy manifest line of a stored teacher.

Owns how a ``TeacherRow`` is published: the public status (an internal
``launching`` row is ``unavailable``; a ``verified`` row without an identity
is ``legacy_unverified``), ``usable`` (verified with an identity, nothing
else), the spec fields that come from the identity after a successful probe
(model_id = served_model_id, max_top_k, vocab_size, tokenizer_hash =
tokenizer_vocab_sha256), the capabilities (null unless usable) and the
revision ``"sha256:" + identity digest``.

Pure: imports pydantic schemas, ``kiln_registry.identity`` and the row type;
never opens a session, a socket or FastAPI.
"""

from __future__ import annotations

import json

from kiln_registry.api.schemas import (
    LogitSourceCaps,
    TeacherEntry,
    TeacherIdentityV1,
    TeacherKind,
    TeacherSpec,
    TeacherStatus,
)
from kiln_registry.db.models import TeacherRow
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest

LEGACY_MESSAGE = (
    "this alias was migrated from an older registry without a verified identity; delete it"
    " and register it again with a credential_id (or a loopback URL) so both probes can run"
)
FIXTURE_MESSAGE = "fixture teacher: configured for tests and demos, never usable by a job"


def stored_identity(row: TeacherRow) -> TeacherIdentity | None:
    if row.identity_json is None:
        return None
    return TeacherIdentity.from_mapping(json.loads(row.identity_json))


def public_status(row: TeacherRow, identity: TeacherIdentity | None) -> TeacherStatus:
    if row.status == "launching":
        return TeacherStatus.unavailable
    status = TeacherStatus(row.status)
    if status is TeacherStatus.verified and identity is None:
        return TeacherStatus.legacy_unverified
    return status


def _status_message(row: TeacherRow, status: TeacherStatus) -> str | None:
    if row.status_message:
        return row.status_message
    if status is TeacherStatus.legacy_unverified:
        return LEGACY_MESSAGE
    if status is TeacherStatus.configured:
        return FIXTURE_MESSAGE
    return None


def _spec(row: TeacherRow, identity: TeacherIdentity | None) -> TeacherSpec:
    return TeacherSpec(
        alias=row.alias,
        kind=TeacherKind(row.kind),
        provider=row.provider,
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


def entry_from_row(row: TeacherRow) -> TeacherEntry:
    """The published ``TeacherEntry`` of one stored alias."""
    identity = stored_identity(row)
    status = public_status(row, identity)
    usable = status is TeacherStatus.verified and identity is not None
    return TeacherEntry(
        spec=_spec(row, identity),
        capabilities=_capabilities(row.alias, identity) if usable and identity else None,
        status=status,
        usable=usable,
        identity_revision=identity.revision() if identity else None,
        off_policy_manifest=off_policy_manifest(identity) if identity else None,
        status_message=_status_message(row, status),
    )
