"""``create_app``: the registry's FastAPI application.

Receives a ready ``RegistryContext`` (configuration, migrated database,
student view); creates the outbound HTTP client in its lifespan, never at
import time.  The outbound client never follows redirects, ignores proxy
variables from the environment, and verifies TLS (against the configured
CA bundle when ``[server] teacher_ca_file`` is set, else the system store).
Request bodies are bounded (``api.limits``) before FastAPI reads them.

Imports FastAPI, httpx and the ``api`` package; the routes reach the
database and the probe only through ``teacher_views`` and the teachers layer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import httpx
from fastapi import FastAPI

from kiln_registry.api.auth_setup import close_auth, install_auth
from kiln_registry.api.context import RegistryContext
from kiln_registry.api.deadline import RequestDeadline
from kiln_registry.api.errors import install_error_handlers
from kiln_registry.api.fast_lookup import CachedEntryLookup
from kiln_registry.api.host_guard import install_host_guard
from kiln_registry.api.limits import RequestBodyLimit
from kiln_registry.api.openapi import install_openapi
from kiln_registry.api.routes import admin, jobs, keys, system, teachers
from kiln_registry.api.teacher_views import cached_teacher_json
from kiln_registry.api.ui import routes as ui_pages
from kiln_registry.config.edge import ServerEdgeKeys
from kiln_registry.jobs.environment import outbound_client
from kiln_registry.observability.access import AccessLayer
from kiln_registry.probe.transport import teacher_tls_context

API_TITLE = "kiln-registry"
API_VERSION = "1.0.0"


def create_app(
    ctx: RegistryContext | None, *, transport: httpx.AsyncBaseTransport | None = None
) -> FastAPI:
    """The application; ``ctx=None`` builds it only to render the OpenAPI schema."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if ctx is None:
            raise RuntimeError("create_app(None) is for schema generation only")
        # One trust configuration for both teacher clients (probes and job scoring).
        tls = teacher_tls_context(ctx.config.server.teacher_ca_file)
        async with outbound_client(tls, transport) as http:
            ctx.http = http
            job_workers = await jobs.start_workers(app, ctx, tls)  # issue 8: the job queue
            try:
                yield
            finally:
                await jobs.stop_workers(app, job_workers)
                ctx.http = None
                close_auth(app)

    app = FastAPI(
        title=API_TITLE,
        version=API_VERSION,
        description=(
            "Kiln teacher registry: immutable aliases for teachers whose identity was proven"
            " by live fingerprint probes."
        ),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.ctx = ctx
    install_error_handlers(app)
    if ctx is not None:
        # Routed requests only: a cached lookup (next layer out) is answered at once.
        app.add_middleware(RequestDeadline, seconds=ctx.config.server.request_timeout_secs)
        # Every middleware added later (outer) still sees cached lookups.
        app.add_middleware(CachedEntryLookup, lookup=partial(cached_teacher_json, ctx))
    # Bodies are read at the configured minimum rate (issue 27).
    edge = ctx.config.server if ctx is not None else ServerEdgeKeys()
    app.add_middleware(
        RequestBodyLimit, grace_s=edge.body_grace_s, min_rate=edge.body_min_bytes_per_s
    )
    if ctx is not None:
        # Outside the cached lookup: every request, cached or not, is checked (issue 15).
        install_auth(app, ctx)
        # Outermost: foreign Host headers and non-JSON bodies never reach auth or a route.
        server = ctx.config.server
        install_host_guard(
            app, bound=server.host, allowed=server.allowed_hosts, cors=server.cors_origins
        )
        # Outside everything: request id, per-route metrics, access log (issue 18).
        app.add_middleware(AccessLayer, metrics=ctx.metrics)
    app.include_router(teachers.router)
    app.include_router(ui_pages.router)  # /docs, /ui and their files (open: no data)
    app.include_router(system.router)
    app.include_router(jobs.router)
    app.include_router(keys.router)
    app.include_router(admin.router)
    install_openapi(app)
    return app
