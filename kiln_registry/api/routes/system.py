"""Operational routes: health, readiness and Prometheus metrics (the docs page: ``api.ui``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from kiln_registry.api.context import RegistryContext
from kiln_registry.api.routes import get_ctx
from kiln_registry.api.routes.responses import OPEN, SYSTEM
from kiln_registry.db.repository import LegacyImportRepository, TeacherRepository
from kiln_registry.jobs.core.liveness import QueueLiveness, queue_liveness
from kiln_registry.jobs.core.registry_repository import registry_counts
from kiln_registry.observability.metrics import CONTENT_TYPE, StateSnapshot
from kiln_registry.version import package_version
from kiln_registry.wire.system import (
    HealthResponse,
    LegacyRegistryReport,
    ReadyResponse,
    WorkersReport,
)

router = APIRouter(tags=["system"])
Ctx = Annotated[RegistryContext, Depends(get_ctx)]


@router.get("/health", operation_id="health", response_model=HealthResponse, responses=OPEN)
async def health() -> HealthResponse:
    return HealthResponse()


def _status_counts(ctx: RegistryContext) -> dict[str, int]:
    counts: dict[str, int] = {}
    with ctx.reading() as session:
        for row in TeacherRepository(session).list_all():
            counts[row.status] = counts.get(row.status, 0) + 1
    return counts


def _liveness(ctx: RegistryContext) -> QueueLiveness:
    with ctx.reading() as session:
        return queue_liveness(session, timeout_s=ctx.config.jobs.lease_timeout_s)


def _workers_report(ctx: RegistryContext) -> WorkersReport:
    found = _liveness(ctx)
    return WorkersReport(
        live=found.live_workers,
        embedded=ctx.config.jobs.embedded_workers,
        queued=found.queued,
        oldest_queued_age_s=found.oldest_queued_age_s,
        warning=found.warning(),
    )


@router.get("/ready", operation_id="ready", response_model=ReadyResponse, responses=SYSTEM)
async def ready(ctx: Ctx) -> ReadyResponse:
    """Readiness of the API (200 while it serves); the job workers are reported, not gated:
    `workers.warning` says when queued jobs have no live worker."""
    counts = await run_in_threadpool(_status_counts, ctx)
    return ReadyResponse(
        status="ready" if ctx.http is not None else "starting",
        version=package_version(),
        database_revision=ctx.database_revision,
        teachers=sum(counts.values()),
        workers=await run_in_threadpool(_workers_report, ctx),
        legacy_registry=await run_in_threadpool(_legacy_report, ctx),
    )


def _legacy_report(ctx: RegistryContext) -> LegacyRegistryReport | None:
    """The recorded outcome of the start-up ``teachers.json`` import, if one ran."""
    with ctx.reading() as session:
        row = LegacyImportRepository(session).status()
        if row is None:
            return None
        return LegacyRegistryReport.model_validate(
            {"status": row.outcome, "path": row.source, "rule": row.rule, "message": row.message}
        )


def _metrics_state(ctx: RegistryContext) -> StateSnapshot:
    with ctx.reading() as session:
        teachers, jobs, leases = registry_counts(session)
        found = queue_liveness(session, timeout_s=ctx.config.jobs.lease_timeout_s)
    return StateSnapshot(
        teachers=teachers, jobs=jobs, worker_leases=leases, live_workers=found.live_workers,
        oldest_queued_age_s=found.oldest_queued_age_s or 0.0,
    )  # fmt: skip


def _render_metrics(ctx: RegistryContext) -> bytes:
    return ctx.metrics.render(_metrics_state(ctx))


@router.get("/metrics", operation_id="metrics", response_class=PlainTextResponse, responses=SYSTEM)
async def metrics(ctx: Ctx) -> Response:
    # Prometheus text (observability.metrics); `read` scope unless [server] metrics_public.
    body = await run_in_threadpool(_render_metrics, ctx)
    return Response(body, media_type=CONTENT_TYPE)
