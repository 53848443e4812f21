"""``/v1/teachers``: register, list, show, delete, re-probe, relaunch (local), receipts.

Aliases may contain ``/`` (``qwen/qwen3-8b@vllm``), sent percent-encoded
(``%2F``) or not: uvicorn decodes the path before routing, so both forms
reach the same route.  The alias parameter takes the rest of the path; the
suffix routes (``/probe``, ``/receipts``, ``/launch``) are declared first
and match only the LAST segment, and registration refuses an alias with a
``/`` whose last segment is one of those words (``kiln_registry.domain.aliases``),
so no path has two readings.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from kiln_registry.api import teacher_views as service
from kiln_registry.api.context import RegistryContext
from kiln_registry.api.paging import DEFAULT_PAGE, MAX_CURSOR_CHARS, MAX_PAGE
from kiln_registry.api.routes import get_ctx
from kiln_registry.api.routes import responses as errors
from kiln_registry.api.schemas import RegisterTeacherRequest
from kiln_registry.api.strict_body import StrictJsonRoute
from kiln_registry.auth.middleware import STATE_KEY
from kiln_registry.auth.tokens import TokenIdentity
from kiln_registry.domain.aliases import ALIAS_RULE_TEXT
from kiln_registry.wire.teachers import (
    DeleteTeacherResponse,
    ProbeReportPublic,
    ReceiptsResponse,
    TeacherEntry,
    TeachersListResponse,
)

router = APIRouter(prefix="/v1/teachers", tags=["teachers"], route_class=StrictJsonRoute)
Ctx = Annotated[RegistryContext, Depends(get_ctx)]
Alias = Annotated[
    str,
    Path(
        description="The teacher alias, percent-encoded as one segment (`/` as `%2F`) or with"
        f" its `/` written as is. An alias is {ALIAS_RULE_TEXT}; an unknown one is"
        " `404 teacher_not_found`."
    ),
]


@router.get(
    "",
    operation_id="listTeachers",
    response_model=TeachersListResponse,
    responses=errors.LIST_TEACHERS,
)
async def list_teachers(
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS)] = None,
) -> TeachersListResponse:
    """Registered aliases, ordered by alias, one page at a time (`next_cursor`)."""
    return await run_in_threadpool(service.list_teachers, ctx, limit, cursor)


@router.post(
    "", operation_id="registerTeacher", response_model=TeacherEntry, responses=errors.REGISTER
)
async def register_teacher(body: RegisterTeacherRequest, ctx: Ctx) -> TeacherEntry:
    """Probe the teacher (K=1, K=max_top_k, then the refused cap), then persist the alias.

    Kind `local`: `model_id` names a `[teachers.local.<profile>]` entry of the server's
    kiln.toml (there is no separate `launch_profile` field).  The server stages the
    snapshot, launches vLLM on `127.0.0.1:<port>` through its embedded launcher, waits
    for readiness (the alias shows `unavailable` with progress in `status_message`
    meanwhile), probes it, and persists the alias only when the probes pass.
    """
    return await service.register_teacher(ctx, body)


# The suffix routes come before the bare {alias} routes: Starlette takes the first match.


@router.post(
    "/{alias:path}/probe",
    operation_id="probeTeacher",
    response_model=ProbeReportPublic,
    responses=errors.PROBE_TEACHER,
)
async def probe_teacher(alias: Alias, ctx: Ctx) -> ProbeReportPublic:
    """Re-run both probes against the stored identity; the alias is not changed."""
    return await service.reprobe_teacher(ctx, alias)


@router.post(
    "/{alias:path}/report",
    operation_id="reportTeacher",
    response_model=ProbeReportPublic,
    responses=errors.PROBE_TEACHER,
)
async def report_teacher(alias: Alias, ctx: Ctx) -> ProbeReportPublic:
    """Report that the alias answered outside its pin; the registry re-probes it by itself.

    Scope `read` (what `kiln teacher-endpoint` holds): the report carries no claim, the
    registry runs both probes against the stored identity exactly as `probeTeacher` does
    and the probes alone decide (a failure marks the alias `unavailable`); audited as
    `teacher.report`.
    """
    return await service.reprobe_teacher(ctx, alias)


@router.post(
    "/{alias:path}/launch",
    operation_id="launchTeacher",
    response_model=TeacherEntry,
    responses=errors.LAUNCH_TEACHER,
)
async def launch_teacher(alias: Alias, ctx: Ctx) -> TeacherEntry:
    """Relaunch an `unavailable` kind-`local` alias from its `[teachers.local.<profile>]`.

    The profile is the one the alias was registered with (registration's `model_id`
    names it).  The launcher's identity must equal the stored one before vLLM is
    spawned, and the probes are pinned to it; otherwise the alias stays `unavailable`
    and the error is `teacher_identity_mismatch`.  Waits for readiness up to the
    profile's `ready_deadline_s`; progress shows in `status_message`.  A running alias
    is returned unchanged.
    """
    return await service.launch_teacher(ctx, alias)


@router.get(
    "/{alias:path}/receipts",
    operation_id="listTeacherReceipts",
    response_model=ReceiptsResponse,
    responses=errors.RECEIPTS,
)
async def list_receipts(
    alias: Alias,
    ctx: Ctx,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS)] = None,
) -> ReceiptsResponse:
    """Stored probe reports of the alias, newest first (kept after a delete), in pages."""
    full = _is_admin(request)
    return await run_in_threadpool(service.list_receipts, ctx, alias, limit, cursor, full)


def _is_admin(request: Request) -> bool:
    """An ``admin`` token, or no token because auth is off (issue 27 item 13: who reads
    a failed probe's teacher text)."""
    state = request.scope.get("state")
    token = state.get(STATE_KEY) if isinstance(state, dict) else None
    if isinstance(token, TokenIdentity):
        return "admin" in token.scopes
    return token is None


@router.get(
    "/{alias:path}",
    operation_id="getTeacher",
    response_model=TeacherEntry,
    responses=errors.GET_TEACHER,
)
async def get_teacher(alias: Alias, ctx: Ctx) -> Response:
    """One alias: its spec, capabilities, status and identity revision."""
    # Pre-rendered TeacherEntry JSON (the hot path; see api.entry_cache).
    return Response(await service.teacher_json(ctx, alias), media_type="application/json")


@router.delete(
    "/{alias:path}",
    operation_id="deleteTeacher",
    response_model=DeleteTeacherResponse,
    responses=errors.DELETE_TEACHER,
)
async def delete_teacher(alias: Alias, ctx: Ctx) -> DeleteTeacherResponse:
    """Remove the alias (its receipts stay); it stays reserved until an admin releases it.

    To change the deployment behind an alias: delete it, have an admin run
    `kiln teachers release ALIAS` (`POST /v1/admin/aliases/{alias}/release`), then
    register it again.  A full reservation table (`[server] max_reserved_aliases`) is
    `409 reserved_aliases_full` and deletes nothing.
    """
    return await run_in_threadpool(service.delete_teacher, ctx, alias)
