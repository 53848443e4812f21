"""The API edge of teachers: entries, pages, receipts, and rendering the teachers layer.

Owns what ``/v1/teachers`` answers: a ``TeacherEntry`` with every live check
applied at read time (``teachers.views``), the coherent cache of rendered
entries (``api.entry_cache``; ``api.fast_lookup`` serves it without the
router), alias pages and receipt pages.  The write side (register, re-probe,
relaunch, delete) is ``teachers.registration``; this module turns its rows
and ``ProbeOutcome``s, and the read side's ``TeacherRead``s
(``teachers.views``), into wire schemas.

Imports the API context, schemas and entries, the teachers layer and the
database repository; never FastAPI.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.concurrency import run_in_threadpool

from kiln_registry.api.context import RegistryContext
from kiln_registry.api.paging import (
    DEFAULT_PAGE,
    decode_cursor,
    decode_key,
    encode_cursor,
    encode_key,
)
from kiln_registry.api.schemas import RegisterTeacherRequest
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.teachers import registration
from kiln_registry.teachers.entries import entry_from_read
from kiln_registry.teachers.live_status import NO_CHECKS, ReadChecks
from kiln_registry.teachers.rows import load_row
from kiln_registry.teachers.views import read_teacher
from kiln_registry.wire.teachers import (
    DeleteTeacherResponse,
    ProbeOutcome,
    ProbeReceipt,
    ProbeReportPublic,
    ReceiptsResponse,
    TeacherEntry,
    TeachersListResponse,
)


def entry_of(ctx: RegistryContext, row: TeacherRow) -> TeacherEntry:
    """The entry of ``row`` with every live check applied now (nothing is written)."""
    read = read_teacher(ctx.config, ctx.student, row)
    return entry_from_read(read, read.problem(ctx.config))


async def register_teacher(ctx: RegistryContext, req: RegisterTeacherRequest) -> TeacherEntry:
    """Probe, persist and publish (``teachers.registration``); the new entry."""
    return entry_of(ctx, await registration.register_teacher(ctx, req))


async def reprobe_teacher(ctx: RegistryContext, alias: str) -> ProbeReportPublic:
    """Re-run the probes pinned to the stored identity; the scrubbed report."""
    outcome = await registration.reprobe_teacher(ctx, alias)
    return ProbeReportPublic.model_validate(outcome.receipt.body)


async def launch_teacher(ctx: RegistryContext, alias: str) -> TeacherEntry:
    """Relaunch a local alias; it must reproduce its stored identity."""
    return entry_of(ctx, await registration.launch_teacher(ctx, alias))


def delete_teacher(ctx: RegistryContext, alias: str) -> DeleteTeacherResponse:
    """Stop the alias's local teacher, if one runs here, then remove the alias."""
    registration.delete_teacher(ctx, alias)
    return DeleteTeacherResponse(alias=alias)


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
    return entry_of(ctx, load_row(ctx, alias))


def _render_teacher(ctx: RegistryContext, alias: str) -> bytes:
    cache = ctx.entry_cache()
    seen = cache.version()  # read BEFORE the row: a later commit invalidates the copy
    read = read_teacher(ctx.config, ctx.student, load_row(ctx, alias))
    problem = read.problem(ctx.config)
    body = entry_from_read(read, problem).model_dump_json(by_alias=True).encode("utf-8")
    if read.fixed is not None:
        cache.put(alias, body, seen, NO_CHECKS)  # cannot change while this process runs
    elif problem is None:
        cache.put(alias, body, seen, read.checks)  # served while its per-read checks pass
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


RECEIPT_TEXT_WITHHELD = (
    "the failure's text is shown to admin tokens only: it may quote what the teacher answered"
)


def _public_report(report: dict[str, Any], full_failures: bool) -> ProbeReportPublic:
    failure = report.get("failure")
    if not full_failures and isinstance(failure, dict) and failure.get("message") is not None:
        report = {**report, "failure": {**failure, "message": RECEIPT_TEXT_WITHHELD}}
    return ProbeReportPublic.model_validate(report)


def list_receipts(
    ctx: RegistryContext,
    alias: str,
    limit: int = 100,
    cursor: str | None = None,
    full_failures: bool = True,
) -> ReceiptsResponse:
    """The alias's newest receipts (kept after the alias is deleted, for audit), in pages.

    ``full_failures`` False (a caller without ``admin``): a failure's message, which may
    quote the teacher's answer, is replaced by ``RECEIPT_TEXT_WITHHELD`` (issue 27 item 13).
    """
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
                report=_public_report(json.loads(r.report_json), full_failures),
            )
            for r in rows[:limit]
        ]
    return ReceiptsResponse(receipts=receipts, next_cursor=more)
