"""Admin routes: ``GET /v1/audit`` and ``POST /v1/admin/aliases/{alias}/release``.

Both need the ``admin`` scope (``auth.scopes``).  The audit log lists state
changes newest first, one page at a time (``limit`` 1..1000, ``cursor`` the
previous page's ``next_cursor``; ``before`` an event id also pages back); its
rows hold token names, never tokens.  Releasing a reserved alias
(one that was deleted) lets it be registered again; an alias that is not
reserved is ``404 alias_not_reserved``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from starlette.concurrency import run_in_threadpool

from kiln_registry.api.context import RegistryContext
from kiln_registry.api.paging import MAX_CURSOR_CHARS, decode_key, encode_key
from kiln_registry.api.routes import get_ctx
from kiln_registry.api.routes.responses import error_responses
from kiln_registry.auth.repository import AuditRepository, ReservedAliases
from kiln_registry.domain.errors import KilnError
from kiln_registry.domain.text import quoted
from kiln_registry.wire.admin import AuditEvent, AuditResponse, ReleaseResponse

router = APIRouter(tags=["admin"])
Ctx = Annotated[RegistryContext, Depends(get_ctx)]


class AliasNotReserved(KilnError):
    status = 404
    code = "alias_not_reserved"


def _events(
    ctx: RegistryContext, limit: int, before: int | None, cursor: str | None
) -> AuditResponse:
    if cursor is not None:
        after = int(decode_key(cursor, "audit", (int,))[0])
        before = after if before is None else min(before, after)
    with ctx.reading() as session:
        rows = AuditRepository(session).list_events(limit=limit + 1, before=before)
        more = encode_key("audit", rows[limit - 1].id) if len(rows) > limit else None
        events = [
            AuditEvent(
                id=r.id,
                at=r.at,
                token=r.token_name,
                action=r.action,
                target=r.target,
                outcome=r.outcome,
                status=r.status,
            )
            for r in rows[:limit]
        ]
    return AuditResponse(events=events, next_cursor=more)


def _release(ctx: RegistryContext, alias: str) -> ReleaseResponse:
    with ctx.writing() as session:
        if not ReservedAliases(session).release(alias):
            raise AliasNotReserved(
                f"alias {quoted(alias, 256)} is not reserved",
                hint="only deleted aliases are reserved",
            )
    return ReleaseResponse(alias=alias, released=True)


@router.get(
    "/v1/audit",
    operation_id="listAuditEvents",
    response_model=AuditResponse,
    responses=error_responses({400: ("invalid_request",)}),
)
async def list_audit(
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS)] = None,
) -> AuditResponse:
    """State changes, newest first, one page at a time (`next_cursor`; admin scope)."""
    return await run_in_threadpool(_events, ctx, limit, before, cursor)


@router.post(
    "/v1/admin/aliases/{alias:path}/release",
    operation_id="releaseAlias",
    response_model=ReleaseResponse,
    responses=error_responses({400: ("invalid_request",), 404: ("alias_not_reserved",)}),
)
async def release_alias(
    alias: Annotated[str, Path(min_length=1, max_length=512)], ctx: Ctx
) -> ReleaseResponse:
    """Free a deleted alias so it can be registered again (admin scope)."""
    return await run_in_threadpool(_release, ctx, alias)
