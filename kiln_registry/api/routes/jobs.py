"""``/v1/jobs``: submit, list, show, cancel, delete, and stream a job's identity-bound corpus.

Thin handlers: validate, call one ``jobs.core.service`` function in a worker
thread, return a public schema; errors are ``KilnError`` (job_invalid,
job_not_found, job_conflict, teacher_not_registered,
teacher_identity_required).  The running workers, when the app's lifespan
started them, are ``app.state.job_workers``: submission wakes them and
cancellation signals a running job at its next request boundary.  A job
belongs to the token that submitted it: a token without `admin` lists, reads,
cancels, deletes and downloads only its own jobs (another's is `404
job_not_found`, like a missing one); `admin`, and every caller with auth off,
sees all.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path as FilePath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from kiln_registry.api.context import RegistryContext
from kiln_registry.api.job_views import job_public
from kiln_registry.api.paging import MAX_CURSOR_CHARS, decode_key, encode_key
from kiln_registry.api.routes import get_ctx
from kiln_registry.api.routes import responses as errors
from kiln_registry.api.strict_body import StrictJsonRoute
from kiln_registry.auth.middleware import STATE_KEY
from kiln_registry.auth.tokens import TokenIdentity
from kiln_registry.jobs.core import retention, service
from kiln_registry.jobs.core.liveness import WorkerBeats
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.state import JobEnvironment
from kiln_registry.jobs.kinds import job_kind
from kiln_registry.jobs.worker import JobWorkers
from kiln_registry.wire.corpus import NDJSON
from kiln_registry.wire.jobs import (
    JOB_ID_PATTERN,
    AnyJobCreate,
    DeleteJobResponse,
    JobPublic,
    JobsListResponse,
    JobStatus,
)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=StrictJsonRoute)
Ctx = Annotated[RegistryContext, Depends(get_ctx)]
JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="The job id.")]
RESULT_CHUNK = 1 << 20


def _workers(request: Request) -> Any:
    return getattr(request.app.state, "job_workers", None)


def _owner(request: Request) -> str | None:
    """The submitting token's name (``None`` with auth off): a new job's owner."""
    identity = request.scope.get("state", {}).get(STATE_KEY)
    return identity.name if isinstance(identity, TokenIdentity) else None


def _viewer(request: Request) -> str | None:
    """Whose jobs the caller may see: ``None`` (all) for ``admin`` or auth off, else its own."""
    identity = request.scope.get("state", {}).get(STATE_KEY)
    if not isinstance(identity, TokenIdentity) or "admin" in identity.scopes:
        return None
    return identity.name


def _live_workers(ctx: RegistryContext, rows: list[JobRow]) -> int | None:
    """Live job workers, read only when one of ``rows`` is queued (else None: not needed)."""
    if not any(row.status == JobStatus.queued for row in rows):
        return None
    with ctx.reading() as session:
        return WorkerBeats(session).live_count(timeout_s=ctx.config.jobs.lease_timeout_s)


async def _public(ctx: RegistryContext, rows: list[JobRow]) -> list[JobPublic]:
    live = await run_in_threadpool(_live_workers, ctx, rows)
    return [job_public(row, live) for row in rows]


@router.post(
    "",
    operation_id="submitJob",
    response_model=JobPublic,
    status_code=201,
    responses=errors.SUBMIT_JOB,
)
async def submit_job(body: AnyJobCreate, ctx: Ctx, request: Request) -> JobPublic:
    """Pin the teacher's complete spec, validate every sequence or prompt, and queue the job."""
    spec = job_kind(body.kind)
    row = await run_in_threadpool(
        spec.submit, ctx.config, ctx.sessions, spec.submission(body), _owner(request)
    )
    workers = _workers(request)
    if workers is not None:
        workers.wake()
    return (await _public(ctx, [row]))[0]


@router.get(
    "", operation_id="listJobs", response_model=JobsListResponse, responses=errors.LIST_JOBS
)
async def list_jobs(
    ctx: Ctx,
    request: Request,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS)] = None,
) -> JobsListResponse:
    """Jobs, newest first, one page at a time (`next_cursor`): a token's own jobs, or
    every job for `admin`."""
    before = None
    if cursor is not None:
        created, after_id = decode_key(cursor, "jobs", (str, str))
        before = (str(created), str(after_id))
    rows = await run_in_threadpool(
        service.list_jobs, ctx.sessions, limit=limit + 1, status=status, before=before,
        viewer=_viewer(request),
    )  # fmt: skip
    more = None
    if len(rows) > limit:
        more = encode_key("jobs", rows[limit - 1].created_at, rows[limit - 1].id)
    return JobsListResponse(jobs=await _public(ctx, rows[:limit]), next_cursor=more)


@router.get(
    "/{job_id}", operation_id="getJob", response_model=JobPublic, responses=errors.JOB_BY_ID
)
async def get_job(job_id: JobId, ctx: Ctx, request: Request) -> JobPublic:
    """One job: the caller's own (another token's is `404 job_not_found`), any for `admin`."""
    row = await run_in_threadpool(service.get_job, ctx.sessions, job_id, _viewer(request))
    return (await _public(ctx, [row]))[0]


@router.post(
    "/{job_id}/cancel",
    operation_id="cancelJob",
    response_model=JobPublic,
    responses=errors.CANCEL_JOB,
)
async def cancel_job(job_id: JobId, ctx: Ctx, request: Request) -> JobPublic:
    """Cancel a queued job now, or a running one between two requests."""
    row = await run_in_threadpool(service.cancel_job, ctx.sessions, job_id, _viewer(request))
    workers = _workers(request)
    if workers is not None:
        workers.cancel(job_id)
    return job_public(row)


@router.delete(
    "/{job_id}",
    operation_id="deleteJob",
    response_model=DeleteJobResponse,
    responses=errors.DELETE_JOB,
)
async def delete_job(job_id: JobId, ctx: Ctx, request: Request) -> DeleteJobResponse:
    """Remove a finished job: its rows, sequences and result file, atomically.

    A job still queued, probing or running is `409 job_conflict` (rule
    `job.delete_active`): cancel it first, then delete it once it shows `cancelled`.
    """
    await run_in_threadpool(retention.delete_job, ctx.sessions, job_id, _viewer(request))
    return DeleteJobResponse(id=job_id)


async def _chunks(path: FilePath, size: int) -> AsyncIterator[bytes]:
    handle = await run_in_threadpool(path.open, "rb")
    try:
        remaining = size
        while remaining > 0:
            chunk = await run_in_threadpool(handle.read, min(RESULT_CHUNK, remaining))
            if not chunk:
                break
            remaining -= len(chunk)
            yield chunk
    finally:
        handle.close()


@router.get(
    "/{job_id}/result",
    operation_id="getJobResult",
    response_class=StreamingResponse,
    responses={
        200: {"content": {NDJSON: {}}, "description": "The identity-bound corpus."},
        **errors.JOB_RESULT,
    },
)
async def get_job_result(job_id: JobId, ctx: Ctx, request: Request) -> StreamingResponse:
    """Stream the corpus: the exact off_policy_manifest line, then one line per sequence."""
    viewer = _viewer(request)
    row, path = await run_in_threadpool(service.result_file, ctx.sessions, job_id, viewer)
    size = row.result_bytes or 0
    headers = {
        "content-length": str(size),
        "x-kiln-result-sha256": row.result_sha256 or "",
        "x-kiln-identity-revision": "sha256:" + row.identity_digest,
    }
    # A generation corpus's detached signature (Kiln reads every line of that corpus).
    headers |= await run_in_threadpool(job_kind(row.kind).result_headers, path)
    return StreamingResponse(_chunks(path, size), media_type=NDJSON, headers=headers)


async def start_workers(
    app: FastAPI, ctx: RegistryContext, tls: ssl.SSLContext
) -> JobWorkers | None:
    """Start the ``[jobs] workers`` on the app's outbound client and its TLS trust (lifespan).

    None with ``[jobs] embedded_workers = false``: ``kiln worker`` processes run the jobs.
    """
    if not ctx.config.jobs.embedded_workers:
        app.state.job_workers = None
        return None
    env = JobEnvironment(
        config=ctx.config,
        sessions=ctx.sessions,
        http=ctx.client(),
        teacher_tls=tls,
        student=ctx.student,
        probe_limiter=ctx.job_probe_limiter,  # jobs' own probe capacity (issue 15)
        count_probe=ctx.metrics.count_probe,
        count_sequence=ctx.metrics.count_sequence,
    )
    workers = JobWorkers(env)
    await workers.start()
    app.state.job_workers = workers
    return workers


async def stop_workers(app: FastAPI, workers: JobWorkers | None) -> None:
    """Stop the workers before the outbound client closes; running jobs go back to queued."""
    app.state.job_workers = None
    if workers is not None:
        await workers.stop()
