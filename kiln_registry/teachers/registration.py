"""Teacher registration, deletion, re-probing and relaunch: the registry's write side.

The rule this module exists for: an alias is persisted and published only
after both live probes (and the cap probe) pass, in one transaction together
with its receipt.  Nothing is written before that, so a registration that
fails or whose server dies mid-probe leaves no trace.  Aliases are
immutable: the ``teachers`` primary key decides races (the early lookup only
spares a teacher a pointless probe); the loser gets ``AliasExists``.
Concurrent probes are capped by the context's ``ProbeLimiter``; a request
over the cap gets ``ProbeBusy`` (503, Retry-After) without touching the
teacher.  Kind ``local`` is delegated to ``teachers.local_registration`` and
``teachers.local_relaunch``.

Operations return rows and ``ProbeOutcome``s; the API renders them.
Database work runs in worker threads (reads BEGIN DEFERRED, writes BEGIN
IMMEDIATE) so a busy SQLite file never blocks the event loop; no session is
held while a teacher is probed.  Imports the probing seam, rows, the
database and ``auth.reserved``; never the API layer or FastAPI.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool

from kiln_registry.auth.reserved import ReservedAliases, refuse_reserved
from kiln_registry.credentials.redaction import redact_text
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import (
    RELEASE_NOTE,
    IdentityRequired,
    KilnError,
    ProbeBusy,
    RegistrationInvalid,
    TeacherNotFound,
)
from kiln_registry.domain.vocabulary import TeacherKind, TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.teachers import local_registration, local_relaunch, replicas
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.probing import (
    ProbeOutcome,
    Receipt,
    failure_receipt,
    registry_setup,
    resolve_endpoint,
    run_probes,
)
from kiln_registry.teachers.rows import (
    TeacherRequest,
    alias_free,
    load_row,
    require_identity,
    verified_fields,
)

REPROBE_FAILED = "re-probe failed"


def _persist(ctx: TeacherServices, row: TeacherRow, receipt: Receipt | None) -> TeacherRow:
    with ctx.writing() as session:
        refuse_reserved(session, row.alias)
        TeacherRepository(session).insert(row, max_teachers=ctx.config.server.max_teachers)
        if receipt is not None:
            receipt.store(session, row.alias, row.identity_digest)
        return row


def _verified_row(req: TeacherRequest, identity: TeacherIdentity) -> TeacherRow:
    return TeacherRow(
        alias=req.alias,
        kind=req.kind.value,
        provider=req.provider,
        url=req.url,
        credential_id=req.credential_id,
        notes=req.notes,
        adapter=req.adapter,
        status=TeacherStatus.verified.value,
        **verified_fields(identity),
    )


def _fixture_row(req: TeacherRequest) -> TeacherRow:
    return TeacherRow(
        alias=req.alias,
        kind=req.kind.value,
        provider=None,
        model_id=req.model_id,
        notes=req.notes,
        status=TeacherStatus.configured.value,
    )


async def register_teacher(ctx: TeacherServices, req: TeacherRequest) -> TeacherRow:
    """Probe, then persist; count the outcome for ``/metrics``.  Returns the stored row."""
    try:
        row = await _register(ctx, req)
    except KilnError as exc:
        ctx.metrics.count_registration(exc.code, exc.rule)
        raise
    ctx.metrics.count_registration("registered")
    return row


async def _register(ctx: TeacherServices, req: TeacherRequest) -> TeacherRow:
    if req.kind is TeacherKind.fixture:
        return await run_in_threadpool(_persist, ctx, _fixture_row(req), None)
    if req.kind is TeacherKind.local:
        return await local_registration.register_local(ctx, req)
    urls = replicas.replica_urls(req.url, req.urls)
    if urls is not None:
        return await replicas.register_replicas(ctx, req, urls)
    if req.url is None or req.model_id is None:  # the schema enforces both for 'remote'
        raise RegistrationInvalid("url and model_id are required for kind 'remote'")
    resolved = resolve_endpoint(ctx.config, req.url, req.credential_id)
    await run_in_threadpool(alias_free, ctx, req.alias)
    outcome = await run_probes(registry_setup(ctx), resolved, req.model_id, None)
    row = _verified_row(req, outcome.identity)
    return await run_in_threadpool(_persist, ctx, row, outcome.receipt)


def delete_teacher(ctx: TeacherServices, alias: str) -> None:
    """Stop the alias's local teacher, if one runs here, then remove and reserve the alias."""
    cap = ctx.config.server.max_reserved_aliases
    with ctx.reading() as session:  # a full reservation table refuses before anything stops
        ReservedAliases(session).require_room(cap)
    local_relaunch.stop_before_delete(ctx, alias)
    with ctx.writing() as session:
        if not TeacherRepository(session).delete(alias):
            raise TeacherNotFound(f"teacher alias {alias!r} is not registered")
        ReservedAliases(session).reserve(alias, limit=cap)  # until an admin frees it (issue 15)


async def launch_teacher(ctx: TeacherServices, alias: str) -> TeacherRow:
    """Relaunch a local alias; it must reproduce its stored identity."""
    return await local_relaunch.relaunch_local(ctx, alias)


def _reprobe_message(ctx: TeacherServices, alias: str, exc: KilnError) -> str:
    return reprobe_failure_message(ctx.config.secret_env_names(), alias, exc)


def reprobe_failure_message(secret_names: frozenset[str], alias: str, exc: KilnError) -> str:
    """The ``status_message`` of an alias whose re-probe, or a job's probe, failed."""
    text = redact_text(f"{exc.code}: {exc.message}", secret_names)
    return (
        f"{REPROBE_FAILED} ({text}); run `kiln teachers probe {shlex.quote(alias)}` (POST"
        f" /v1/teachers/{alias}/probe) again once the teacher answers as registered, or delete"
        f" the alias and register it again {RELEASE_NOTE}"
    )


def _store_outcome(
    ctx: TeacherServices,
    row: TeacherRow,
    receipt: Receipt | None,
    identity: TeacherIdentity,
    failure: str | None,
) -> None:
    """The receipt (if any) and the alias's status after a re-probe, in one transaction.

    A failure makes the alias ``unavailable`` with ``failure`` as its message; a pass
    restores ``verified`` only when a failed re-probe was what made it unavailable.
    """
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        if receipt is not None:
            receipt.store(session, row.alias, identity.digest())
        with contextlib.suppress(TeacherNotFound):  # deleted meanwhile; receipt kept for audit
            _apply_status(repo, row, failure)


def _apply_status(repo: TeacherRepository, row: TeacherRow, failure: str | None) -> None:
    """A failure makes the alias unavailable; a pass undoes only a failed re-probe's mark."""
    if failure is not None:
        repo.update_status(row.alias, TeacherStatus.unavailable.value, failure)
    elif row.status == TeacherStatus.unavailable.value and (row.status_message or "").startswith(
        REPROBE_FAILED
    ):
        repo.update_status(row.alias, TeacherStatus.verified.value, None)


def _alias_status(
    ctx: TeacherServices, row: TeacherRow
) -> Callable[[KilnError | None], Callable[[TeacherRepository], None]]:
    """A replica set's status update after a re-probe: ``_store_outcome``'s rule."""

    def for_failure(failure: KilnError | None) -> Callable[[TeacherRepository], None]:
        def update(repo: TeacherRepository) -> None:
            message = None if failure is None else _reprobe_message(ctx, row.alias, failure)
            _apply_status(repo, row, message)

        return update

    return for_failure


async def reprobe_teacher(ctx: TeacherServices, alias: str) -> ProbeOutcome:
    """Re-run the probes pinned to the stored identity; store the receipt either way.

    A failed probe is reflected in the entry (``unavailable`` with the failure in
    ``status_message``) until a later re-probe passes; a refusal before the teacher
    is contacted (busy, credential) changes nothing.
    """
    row = await run_in_threadpool(load_row, ctx, alias)
    identity = require_identity(row)
    if row.replicas:
        return await replicas.reprobe_replicas(ctx, row, identity, _alias_status(ctx, row))
    if row.url is None:
        raise IdentityRequired(f"teacher alias {alias!r} has no endpoint to probe")
    resolved = resolve_endpoint(ctx.config, row.url, row.credential_id)
    setup = registry_setup(ctx)
    try:
        outcome = await run_probes(setup, resolved, identity.served_model_id, identity)
    except ProbeBusy:
        raise
    except KilnError as exc:
        message = _reprobe_message(ctx, alias, exc)
        receipt = failure_receipt(exc, setup.secret_names)
        await run_in_threadpool(_store_outcome, ctx, row, receipt, identity, message)
        raise
    await run_in_threadpool(_store_outcome, ctx, row, outcome.receipt, identity, None)
    return outcome
