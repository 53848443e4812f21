"""Teacher registration, lookup, deletion and re-probing.

The rule this module exists for: an alias is persisted and published only
after both live probes pass, in one transaction together with its receipt.
Aliases are immutable (the database's primary key decides races).  Database
work runs in worker threads so a busy SQLite file never blocks the event
loop; no session is held while a teacher is probed.
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from kiln_registry.api.context import PROBE_TIMEOUT_S, RegistryContext
from kiln_registry.api.schemas import (
    DeleteTeacherResponse,
    LogitSourceCaps,
    ProbeReceipt,
    ReceiptsResponse,
    RegisterTeacherRequest,
    TeacherEntry,
    TeacherIdentityV1,
    TeacherKind,
    TeachersListResponse,
    TeacherSpec,
    TeacherStatus,
)
from kiln_registry.credentials.resolve import ResolvedTeacher, resolve_teacher_endpoint
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository, unit_of_work
from kiln_registry.errors import (
    AliasExists,
    IdentityRequired,
    KilnError,
    RegistrationInvalid,
    TeacherNotFound,
)
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.probe.client import probe_teacher
from kiln_registry.probe.report import ProbeReport, attached_report

OFF_POLICY_SCHEMA = "kiln.off-policy-distillation-manifest.v1"
LEGACY_MESSAGE = (
    "this alias was migrated from an older registry without a verified identity; delete it"
    " and register it again with a credential_id (or a loopback URL) so both probes can run"
)


def off_policy_manifest(identity: TeacherIdentity) -> str:
    """The exact first line of an identity-bound off-policy corpus."""
    head = '{"schema":"' + OFF_POLICY_SCHEMA + '","teacher_identity":'
    return head + identity.canonical_bytes().decode("utf-8") + "}"


def stored_identity(row: TeacherRow) -> TeacherIdentity | None:
    if row.identity_json is None:
        return None
    return TeacherIdentity.from_mapping(json.loads(row.identity_json))


def _public_status(row: TeacherRow, identity: TeacherIdentity | None) -> TeacherStatus:
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
        return "fixture teacher: configured for tests and demos, never usable by a job"
    return None


def entry_from_row(row: TeacherRow) -> TeacherEntry:
    identity = stored_identity(row)
    status = _public_status(row, identity)
    usable = status is TeacherStatus.verified and identity is not None
    spec = TeacherSpec(
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
    caps = None
    if usable and identity is not None:
        caps = LogitSourceCaps(
            teacher_id=row.alias,
            vocab_size=identity.vocab_size,
            max_top_k=identity.max_top_k,
            supports_full_vocab=False,
            supports_batched=True,
            tokenizer_hash=identity.tokenizer_vocab_sha256,
        )
    return TeacherEntry(
        spec=spec,
        capabilities=caps,
        status=status,
        usable=usable,
        identity_revision=identity.revision() if identity else None,
        off_policy_manifest=off_policy_manifest(identity) if identity else None,
        status_message=_status_message(row, status),
    )


def _resolve(ctx: RegistryContext, url: str, credential_id: str | None) -> ResolvedTeacher:
    return resolve_teacher_endpoint(
        url,
        credential_id,
        credentials=ctx.config.teachers.credentials,
        server_host=ctx.config.server.host,
    )


def _alias_free(ctx: RegistryContext, alias: str) -> None:
    with unit_of_work(ctx.sessions) as session:
        if TeacherRepository(session).get(alias) is not None:
            raise AliasExists(f"teacher alias {alias!r} is already registered")


async def _probe(
    ctx: RegistryContext, resolved: ResolvedTeacher, model_id: str, pinned: TeacherIdentity | None
) -> ProbeReport:
    started = time.monotonic()
    try:
        report = await probe_teacher(
            ctx.client(),
            completions_url=resolved.endpoint.completions_url,
            model_id=model_id,
            student=ctx.student,
            pinned=pinned,
            secret=resolved.secret,
            timeout_s=PROBE_TIMEOUT_S,
            limiter=ctx.probe_limiter,
        )
    except KilnError as exc:
        ctx.metrics.count_probe(exc.code, time.monotonic() - started)
        raise
    ctx.metrics.count_probe("passed", time.monotonic() - started)
    return report


def _persist_verified(
    ctx: RegistryContext,
    req: RegisterTeacherRequest,
    identity: TeacherIdentity,
    report: ProbeReport,
) -> TeacherEntry:
    row = TeacherRow(
        alias=req.alias,
        kind=req.kind.value,
        provider=req.provider,
        model_id=identity.served_model_id,
        url=req.url,
        credential_id=req.credential_id,
        notes=req.notes,
        adapter=req.adapter,
        identity_json=identity.canonical_bytes().decode("utf-8"),
        identity_digest=identity.digest(),
        status=TeacherStatus.verified.value,
    )
    with unit_of_work(ctx.sessions) as session:
        repo = TeacherRepository(session)
        repo.insert(row)
        repo.add_receipt(req.alias, "passed", identity.digest(), report.to_dict())
        return entry_from_row(row)


def _persist_fixture(ctx: RegistryContext, req: RegisterTeacherRequest) -> TeacherEntry:
    row = TeacherRow(
        alias=req.alias,
        kind=req.kind.value,
        provider=None,
        model_id=req.model_id,
        notes=req.notes,
        status=TeacherStatus.configured.value,
    )
    with unit_of_work(ctx.sessions) as session:
        TeacherRepository(session).insert(row)
        return entry_from_row(row)


async def register_teacher(ctx: RegistryContext, req: RegisterTeacherRequest) -> TeacherEntry:
    try:
        entry = await _register(ctx, req)
    except KilnError as exc:
        ctx.metrics.count_registration(exc.code)
        raise
    ctx.metrics.count_registration("registered")
    return entry


async def _register(ctx: RegistryContext, req: RegisterTeacherRequest) -> TeacherEntry:
    if req.kind is TeacherKind.fixture:
        return await run_in_threadpool(_persist_fixture, ctx, req)
    if req.kind is TeacherKind.local:
        raise RegistrationInvalid(
            "kind 'local' is not available in this build: register the launcher's endpoint as"
            " kind 'remote' with its loopback URL",
        )
    assert req.url is not None and req.model_id is not None  # enforced by the schema
    resolved = _resolve(ctx, req.url, req.credential_id)
    await run_in_threadpool(_alias_free, ctx, req.alias)
    report = await _probe(ctx, resolved, req.model_id, None)
    assert report.fingerprint is not None
    identity = verify_fingerprint(report.fingerprint)
    return await run_in_threadpool(_persist_verified, ctx, req, identity, report)


def _load_row(ctx: RegistryContext, alias: str) -> TeacherRow:
    with unit_of_work(ctx.sessions) as session:
        row = TeacherRepository(session).get(alias)
        if row is None:
            raise TeacherNotFound(f"teacher alias {alias!r} is not registered")
        session.expunge(row)
        return row


def list_teachers(ctx: RegistryContext) -> TeachersListResponse:
    with unit_of_work(ctx.sessions) as session:
        rows = TeacherRepository(session).list_all()
        return TeachersListResponse(teachers=[entry_from_row(r) for r in rows])


def get_teacher(ctx: RegistryContext, alias: str) -> TeacherEntry:
    return entry_from_row(_load_row(ctx, alias))


def delete_teacher(ctx: RegistryContext, alias: str) -> DeleteTeacherResponse:
    with unit_of_work(ctx.sessions) as session:
        if not TeacherRepository(session).delete(alias):
            raise TeacherNotFound(f"teacher alias {alias!r} is not registered")
    return DeleteTeacherResponse(alias=alias)


def require_identity(row: TeacherRow) -> TeacherIdentity:
    identity = stored_identity(row)
    if identity is None or row.status == TeacherStatus.legacy_unverified.value:
        raise IdentityRequired(
            f"teacher alias {row.alias!r} has no verified identity",
            hint="delete the alias and register it again with a credential_id and fresh probes",
        )
    return identity


def _store_receipt(
    ctx: RegistryContext, alias: str, report: ProbeReport, identity: TeacherIdentity
) -> None:
    with unit_of_work(ctx.sessions) as session:
        outcome = "passed" if report.passed else "failed"
        TeacherRepository(session).add_receipt(alias, outcome, identity.digest(), report.to_dict())


async def reprobe_teacher(ctx: RegistryContext, alias: str) -> dict[str, Any]:
    row = await run_in_threadpool(_load_row, ctx, alias)
    identity = require_identity(row)
    if row.url is None:
        raise IdentityRequired(f"teacher alias {alias!r} has no endpoint to probe")
    resolved = _resolve(ctx, row.url, row.credential_id)
    try:
        report = await _probe(ctx, resolved, identity.served_model_id, identity)
    except KilnError as exc:
        failed = attached_report(exc)
        if failed is not None:
            await run_in_threadpool(_store_receipt, ctx, alias, failed, identity)
        raise
    await run_in_threadpool(_store_receipt, ctx, alias, report, identity)
    return report.to_dict()


def list_receipts(ctx: RegistryContext, alias: str, limit: int = 100) -> ReceiptsResponse:
    with unit_of_work(ctx.sessions) as session:
        rows = TeacherRepository(session).list_receipts(alias, limit=limit)
        receipts = [
            ProbeReceipt(
                id=r.id,
                alias=r.alias,
                created_at=r.created_at,
                outcome="passed" if r.outcome == "passed" else "failed",
                identity_revision=f"sha256:{r.identity_digest}" if r.identity_digest else None,
                report=json.loads(r.report_json),
            )
            for r in rows
        ]
    return ReceiptsResponse(receipts=receipts)
