"""Operational routes: health, readiness, Prometheus metrics and offline API docs."""

from __future__ import annotations

import html
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from kiln_registry.api.context import RegistryContext
from kiln_registry.api.routes import get_ctx
from kiln_registry.api.routes.responses import OPEN, SYSTEM
from kiln_registry.api.schemas import HealthResponse, LegacyRegistryReport, ReadyResponse
from kiln_registry.db.repository import LegacyImportRepository, TeacherRepository

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


@router.get("/ready", operation_id="ready", response_model=ReadyResponse, responses=SYSTEM)
async def ready(ctx: Ctx) -> ReadyResponse:
    counts = await run_in_threadpool(_status_counts, ctx)
    return ReadyResponse(
        status="ready" if ctx.http is not None else "starting",
        database_revision=ctx.database_revision,
        teachers=sum(counts.values()),
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


def _metric_lines(name: str, kind: str, help_text: str, samples: dict[str, int], label: str) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for key, value in sorted(samples.items()):
        lines.append(f'{name}{{{label}="{key}"}} {value}')
    return "\n".join(lines) + "\n"


def render_metrics(ctx: RegistryContext, status_counts: dict[str, int]) -> str:
    m = ctx.metrics
    text = _metric_lines(
        "kiln_registrations_total",
        "counter",
        "Teacher registrations by outcome.",
        dict(m.registrations),
        "outcome",
    )
    text += _metric_lines(
        "kiln_probes_total", "counter", "Identity probes by outcome.", dict(m.probes), "outcome"
    )
    text += (
        "# HELP kiln_probe_duration_seconds Time spent in identity probes.\n"
        "# TYPE kiln_probe_duration_seconds summary\n"
        f"kiln_probe_duration_seconds_sum {m.probe_seconds_sum:.6f}\n"
        f"kiln_probe_duration_seconds_count {m.probe_seconds_count}\n"
    )
    text += _metric_lines(
        "kiln_teachers", "gauge", "Registered teachers by status.", status_counts, "status"
    )
    return text


@router.get("/metrics", operation_id="metrics", response_class=PlainTextResponse, responses=SYSTEM)
async def metrics(ctx: Ctx) -> PlainTextResponse:
    counts = await run_in_threadpool(_status_counts, ctx)
    return PlainTextResponse(
        render_metrics(ctx, counts), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


def render_docs(schema: dict[str, Any]) -> str:
    """A self-contained HTML page of every operation; no scripts, no CDN."""
    title = html.escape(str(schema.get("info", {}).get("title", "API")))
    rows: list[str] = []
    for path, operations in sorted(schema.get("paths", {}).items()):
        for method, op in sorted(operations.items()):
            rows.append(
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>".format(
                    html.escape(method.upper()),
                    html.escape(path),
                    html.escape(str(op.get("operationId", ""))),
                    html.escape(str(op.get("summary", ""))),
                )
            )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:.2em 1em}</style></head>"
        f"<body><h1>{title}</h1><p>The full schema is at <a href='/openapi.json'>"
        "/openapi.json</a> (also <code>openapi/kiln-registry.openapi.json</code>).</p>"
        "<table><tr><th>Method</th><th>Path</th><th>Operation</th><th>Summary</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )


@router.get("/docs", include_in_schema=False)
async def docs(request: Request) -> HTMLResponse:
    return HTMLResponse(render_docs(request.app.openapi()))
