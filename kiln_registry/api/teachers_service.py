"""Teacher registration, lookup, deletion, re-probing and receipts.

The rule this module exists for: an alias is persisted and published only
after both live probes (and the cap probe) pass, in one transaction together
with its receipt.  Nothing is written before that, so a registration that
fails or whose server dies mid-probe leaves no trace.  Aliases are
immutable: the ``teachers`` primary key decides races (the early lookup only
spares a teacher a pointless probe); the loser gets ``AliasExists``.
Concurrent probes are capped by the context's ``ProbeLimiter``; a request
over the cap gets ``ProbeBusy`` (503, Retry-After) without touching the
teacher.

Kind ``local`` (launched by the registry) is delegated to
``kiln_registry.local.service``, imported inside the functions because it
builds on this module.

Database work runs in worker threads (reads BEGIN DEFERRED, writes BEGIN
IMMEDIATE) so a busy SQLite file never blocks the event loop; no session is
held while a teacher is probed.  Probe reports are scrubbed of the current
values of every configured secret variable before they are stored or
returned.  Imports the API context, schemas and entries, the credential,
probe and database layers; never FastAPI.
"""

from __future__ import annotations

import json
import ssl
import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from kiln_registry.api.context import RegistryContext
from kiln_registry.api.entries import entry_from_row, stored_identity
from kiln_registry.api.live_status import NO_CHECKS, ReadChecks, assess
from kiln_registry.api.paging import (
    DEFAULT_PAGE,
    decode_cursor,
    decode_key,
    encode_cursor,
    encode_key,
)
from kiln_registry.api.schemas import (
    DeleteTeacherResponse,
    ProbeOutcome,
    ProbeReceipt,
    ProbeReportPublic,
    ReceiptsResponse,
    RegisterTeacherRequest,
    TeacherEntry,
    TeacherKind,
    TeachersListResponse,
    TeacherStatus,
)
from kiln_registry.api.teacher_guard import check_teacher_host
from kiln_registry.auth.reserved import ReservedAliases, refuse_reserved
from kiln_registry.credentials.redaction import redact_text
from kiln_registry.credentials.resolve import ResolvedTeacher, resolve_teacher_endpoint
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import (
    RELEASE_NOTE,
    AliasExists,
    IdentityRequired,
    KilnError,
    ProbeBusy,
    ProbeFailed,
    RegistrationInvalid,
    TeacherNotFound,
)
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.probe.client import probe_teacher, untrusted_certificate
from kiln_registry.probe.report import ProbeReport, attach_report, attached_report

MAX_CHAIN_DEPTH = 8
REPROBE_FAILED = "re-probe failed"


def _resolve(ctx: RegistryContext, url: str, credential_id: str | None) -> ResolvedTeacher:
    check_teacher_host(url, ctx.config.server.teacher_hosts)  # before any probe (issue 15)
    return resolve_teacher_endpoint(
        url,
        credential_id,
        credentials=ctx.config.teachers.credentials,
        server_host=ctx.config.server.host,
    )


def _cert_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error somewhere in ``exc``'s cause chain."""
    seen: BaseException | None = exc
    for _ in range(MAX_CHAIN_DEPTH):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _explain_tls(exc: KilnError, resolved: ResolvedTeacher) -> KilnError:
    cert = _cert_failure(exc)
    if cert is None or not isinstance(exc, ProbeFailed):
        return exc
    better = untrusted_certificate(resolved.endpoint.origin, cert)
    report = attached_report(exc)
    if report is not None:
        attach_report(better, report)
    return better


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
            timeout_s=ctx.config.server.probe_timeout_s,
            limiter=ctx.probe_limiter,
        )
    except KilnError as exc:
        ctx.metrics.count_probe(exc.code, time.monotonic() - started, exc.rule)
        better = _explain_tls(exc, resolved)
        if better is exc:
            raise
        raise better from exc
    ctx.metrics.count_probe("passed", time.monotonic() - started)
    return report


def _scrub(value: Any, names: frozenset[str]) -> Any:
    if isinstance(value, str):
        return redact_text(value, names)
    if isinstance(value, dict):
        return {key: _scrub(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrub(item, names) for item in value]
    return value


def public_report(ctx: RegistryContext, report: ProbeReport) -> dict[str, Any]:
    """The report's receipt form with every current secret value redacted.

    The probe never puts a secret in a report; this is the second line, for a
    teacher that reflects what it was sent into a field the probe quotes.
    """
    scrubbed: dict[str, Any] = _scrub(report.to_dict(), ctx.config.secret_env_names())
    return scrubbed


def _alias_free(ctx: RegistryContext, alias: str) -> None:
    with ctx.reading() as session:
        if TeacherRepository(session).get(alias) is not None:
            raise AliasExists(f"teacher alias {alias!r} is already registered")
        TeacherRepository(session).check_new_alias(alias, ctx.config.server.max_teachers)
        refuse_reserved(session, alias)


def _persist(ctx: RegistryContext, row: TeacherRow, receipt: dict[str, Any] | None) -> TeacherEntry:
    with ctx.writing() as session:
        refuse_reserved(session, row.alias)
        repo = TeacherRepository(session)
        repo.insert(row, max_teachers=ctx.config.server.max_teachers)
        if receipt is not None:
            repo.add_receipt(row.alias, "passed", row.identity_digest, receipt)
        return entry_of(ctx, row)


def _verified_row(req: RegisterTeacherRequest, identity: TeacherIdentity) -> TeacherRow:
    return TeacherRow(
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


def _fixture_row(req: RegisterTeacherRequest) -> TeacherRow:
    return TeacherRow(
        alias=req.alias,
        kind=req.kind.value,
        provider=None,
        model_id=req.model_id,
        notes=req.notes,
        status=TeacherStatus.configured.value,
    )


async def register_teacher(ctx: RegistryContext, req: RegisterTeacherRequest) -> TeacherEntry:
    """Probe, then persist and publish; count the outcome for ``/metrics``."""
    try:
        entry = await _register(ctx, req)
    except KilnError as exc:
        ctx.metrics.count_registration(exc.code, exc.rule)
        raise
    ctx.metrics.count_registration("registered")
    return entry


async def _register(ctx: RegistryContext, req: RegisterTeacherRequest) -> TeacherEntry:
    if req.kind is TeacherKind.fixture:
        return await run_in_threadpool(_persist, ctx, _fixture_row(req), None)
    if req.kind is TeacherKind.local:
        from kiln_registry.local import service as local  # local imports this module

        return await local.register_local(ctx, req)
    if req.url is None or req.model_id is None:  # the schema enforces both for 'remote'
        raise RegistrationInvalid("url and model_id are required for kind 'remote'")
    resolved = _resolve(ctx, req.url, req.credential_id)
    await run_in_threadpool(_alias_free, ctx, req.alias)
    report = await _probe(ctx, resolved, req.model_id, None)
    identity = _passed_identity(report)
    row = _verified_row(req, identity)
    return await run_in_threadpool(_persist, ctx, row, public_report(ctx, report))


def _passed_identity(report: ProbeReport) -> TeacherIdentity:
    if not report.passed or report.fingerprint is None:
        raise ProbeFailed("the probe passed without an identity", rule="probe.internal")
    return verify_fingerprint(report.fingerprint)


def _load_row(ctx: RegistryContext, alias: str) -> TeacherRow:
    with ctx.reading() as session:
        row = TeacherRepository(session).get(alias)
        if row is None:
            raise TeacherNotFound(f"teacher alias {alias!r} is not registered")
        session.expunge(row)
        return row


def _live(ctx: RegistryContext, row: TeacherRow) -> tuple[str | None, ReadChecks]:
    """The live problem fixed for this process, and the per-read checks (``live_status``)."""
    identity = stored_identity(row)
    if row.status != TeacherStatus.verified.value or identity is None:
        return None, NO_CHECKS
    return assess(ctx.config, ctx.student, row, identity)


def entry_of(ctx: RegistryContext, row: TeacherRow) -> TeacherEntry:
    """The entry of ``row`` with every live check applied now (nothing is written)."""
    fixed, checks = _live(ctx, row)
    return entry_from_row(row, fixed or checks.problem(ctx.config))


def list_teachers(
    ctx: RegistryContext, limit: int = DEFAULT_PAGE, cursor: str | None = None
) -> TeachersListResponse:
    """One page of aliases in alias order; ``next_cursor`` names the next page, if any."""
    after = decode_cursor(cursor) if cursor is not None else None
    with ctx.reading() as session:
        rows = TeacherRepository(session).list_all(limit + 1, after=after)
        page = [entry_of(ctx, r) for r in rows[:limit]]
    more = encode_cursor(rows[limit - 1].alias) if len(rows) > limit else None
    return TeachersListResponse(teachers=page, next_cursor=more)


def get_teacher(ctx: RegistryContext, alias: str) -> TeacherEntry:
    return entry_of(ctx, _load_row(ctx, alias))


def _render_teacher(ctx: RegistryContext, alias: str) -> bytes:
    cache = ctx.entry_cache()
    seen = cache.version()  # read BEFORE the row: a later commit invalidates the copy
    row = _load_row(ctx, alias)
    fixed, checks = _live(ctx, row)
    problem = fixed or checks.problem(ctx.config)
    body = entry_from_row(row, problem).model_dump_json(by_alias=True).encode("utf-8")
    if fixed is not None:
        cache.put(alias, body, seen, NO_CHECKS)  # cannot change while this process runs
    elif problem is None:
        cache.put(alias, body, seen, checks)  # served while its per-read checks pass
    return body


async def teacher_json(ctx: RegistryContext, alias: str) -> bytes:
    """The ``TeacherEntry`` JSON of ``alias``: from the coherent cache, else the database.

    A cached body is served only while its per-read checks (``live_status.ReadChecks``:
    a credential variable, an adapter directory) still pass; otherwise it is rendered
    again, showing ``unavailable`` and what changed.
    """
    body = cached_teacher_json(ctx, alias)
    if body is not None:
        return body
    return await run_in_threadpool(_render_teacher, ctx, alias)


def cached_teacher_json(ctx: RegistryContext, alias: str) -> bytes | None:
    """The cached ``TeacherEntry`` JSON of ``alias`` while its per-read checks pass, or None.

    Never touches the database beyond the cache's version read; ``api.fast_lookup``
    serves it without the router.
    """
    hit = ctx.entry_cache().get_checked(alias)
    if hit is not None:
        body, checks = hit
        if isinstance(checks, ReadChecks) and checks.problem(ctx.config) is None:
            return body
    return None


def delete_teacher(ctx: RegistryContext, alias: str) -> DeleteTeacherResponse:
    """Stop the alias's local teacher, if one runs here, then remove the alias."""
    from kiln_registry.local import service as local  # local imports this module

    cap = ctx.config.server.max_reserved_aliases
    with ctx.reading() as session:  # a full reservation table refuses before anything stops
        ReservedAliases(session).require_room(cap)
    local.stop_before_delete(ctx, alias)
    with ctx.writing() as session:
        if not TeacherRepository(session).delete(alias):
            raise TeacherNotFound(f"teacher alias {alias!r} is not registered")
        ReservedAliases(session).reserve(alias, limit=cap)  # until an admin frees it (issue 15)
    return DeleteTeacherResponse(alias=alias)


async def launch_teacher(ctx: RegistryContext, alias: str) -> TeacherEntry:
    """Relaunch a local alias; it must reproduce its stored identity."""
    from kiln_registry.local import service as local  # local imports this module

    return await local.relaunch_local(ctx, alias)


def require_identity(row: TeacherRow) -> TeacherIdentity:
    identity = stored_identity(row)
    if identity is None or row.status == TeacherStatus.legacy_unverified.value:
        raise IdentityRequired(
            f"teacher alias {row.alias!r} has no verified identity",
            hint=f"delete the alias and register it again with fresh probes {RELEASE_NOTE}",
        )
    return identity


def _reprobe_message(ctx: RegistryContext, alias: str, exc: KilnError) -> str:
    text = redact_text(f"{exc.code}: {exc.message}", ctx.config.secret_env_names())
    return (
        f"{REPROBE_FAILED} ({text}); POST /v1/teachers/{alias}/probe again once the teacher"
        f" answers as registered, or delete the alias and register it again {RELEASE_NOTE}"
    )


def _store_outcome(
    ctx: RegistryContext,
    row: TeacherRow,
    report: ProbeReport | None,
    identity: TeacherIdentity,
    failure: str | None,
) -> None:
    """The receipt (if any) and the alias's status after a re-probe, in one transaction.

    A failure makes the alias ``unavailable`` with ``failure`` as its message; a pass
    restores ``verified`` only when a failed re-probe was what made it unavailable.
    """
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        if report is not None:
            outcome = "passed" if report.passed else "failed"
            repo.add_receipt(row.alias, outcome, identity.digest(), public_report(ctx, report))
        try:
            if failure is not None:
                repo.update_status(row.alias, TeacherStatus.unavailable.value, failure)
            elif row.status == TeacherStatus.unavailable.value and (
                row.status_message or ""
            ).startswith(REPROBE_FAILED):
                repo.update_status(row.alias, TeacherStatus.verified.value, None)
        except TeacherNotFound:
            pass  # deleted meanwhile; the receipt stays for audit


async def reprobe_teacher(ctx: RegistryContext, alias: str) -> ProbeReportPublic:
    """Re-run the probes pinned to the stored identity; store the receipt either way.

    A failed probe is reflected in the entry (``unavailable`` with the failure in
    ``status_message``) until a later re-probe passes; a refusal before the teacher
    is contacted (busy, credential) changes nothing.
    """
    row = await run_in_threadpool(_load_row, ctx, alias)
    identity = require_identity(row)
    if row.url is None:
        raise IdentityRequired(f"teacher alias {alias!r} has no endpoint to probe")
    resolved = _resolve(ctx, row.url, row.credential_id)
    try:
        report = await _probe(ctx, resolved, identity.served_model_id, identity)
    except ProbeBusy:
        raise
    except KilnError as exc:
        message = _reprobe_message(ctx, alias, exc)
        await run_in_threadpool(_store_outcome, ctx, row, attached_report(exc), identity, message)
        raise
    await run_in_threadpool(_store_outcome, ctx, row, report, identity, None)
    return ProbeReportPublic.model_validate(public_report(ctx, report))


def list_receipts(
    ctx: RegistryContext, alias: str, limit: int = 100, cursor: str | None = None
) -> ReceiptsResponse:
    """The alias's newest receipts (kept after the alias is deleted, for audit), in pages."""
    before = None
    if cursor is not None:
        created, last = decode_key(cursor, "receipts:" + alias, (str, int))
        before = (str(created), int(last))
    with ctx.reading() as session:
        rows = TeacherRepository(session).list_receipts(alias, limit=limit + 1, before=before)
        more = None
        if len(rows) > limit:
            more = encode_key("receipts:" + alias, rows[limit - 1].created_at, rows[limit - 1].id)
        receipts = [
            ProbeReceipt(
                id=r.id,
                alias=r.alias,
                created_at=r.created_at,
                outcome=ProbeOutcome.passed if r.outcome == "passed" else ProbeOutcome.failed,
                identity_revision=f"sha256:{r.identity_digest}" if r.identity_digest else None,
                report=ProbeReportPublic.model_validate(json.loads(r.report_json)),
            )
            for r in rows[:limit]
        ]
    return ReceiptsResponse(receipts=receipts, next_cursor=more)
