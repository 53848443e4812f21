"""Re-probing a stored alias's endpoints against its pinned identity (one or a replica set).

Shared by the kinds that serve an endpoint (``remote``, ``local``): one URL is
probed and its receipt stored; a replica set (``teacher_replicas`` rows) is
re-proved replica by replica (``teachers.replicas.reprobe_replicas``).  A
failed probe is reflected in the entry (``unavailable`` with the failure in
``status_message``) until a later re-probe passes; a refusal before the teacher
is contacted (busy, credential) changes nothing.

Database work runs in worker threads (``asyncio.to_thread``).  Imports the
probing seam, replicas, the database and the credential redaction; never the
API layer or FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import Callable

from kiln_registry.credentials.redaction import redact_text
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import (
    RELEASE_NOTE,
    IdentityRequired,
    KilnError,
    ProbeBusy,
    TeacherNotFound,
)
from kiln_registry.domain.vocabulary import TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.teachers import replicas
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.probing import (
    ProbeOutcome,
    Receipt,
    failure_receipt,
    registry_setup,
    resolve_endpoint,
    run_probes,
)

REPROBE_FAILED = "re-probe failed"


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


async def reprobe_endpoints(
    ctx: TeacherServices, row: TeacherRow, identity: TeacherIdentity
) -> ProbeOutcome:
    """Re-run the probes of ``row``'s endpoint(s) pinned to ``identity``; store the receipt(s)."""
    if row.replicas:
        return await replicas.reprobe_replicas(ctx, row, identity, _alias_status(ctx, row))
    if row.url is None:
        raise IdentityRequired(f"teacher alias {row.alias!r} has no endpoint to probe")
    resolved = resolve_endpoint(ctx.config, row.url, row.credential_id)
    setup = registry_setup(ctx)
    try:
        outcome = await run_probes(setup, resolved, identity.served_model_id, identity)
    except ProbeBusy:
        raise
    except KilnError as exc:
        message = _reprobe_message(ctx, row.alias, exc)
        receipt = failure_receipt(exc, setup.secret_names)
        await asyncio.to_thread(_store_outcome, ctx, row, receipt, identity, message)
        raise
    await asyncio.to_thread(_store_outcome, ctx, row, outcome.receipt, identity, None)
    return outcome
