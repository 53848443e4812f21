"""HTTP routes: thin handlers that validate, call one service function and return a schema."""

from __future__ import annotations

from fastapi import Request

from kiln_registry.api.context import RegistryContext


async def get_ctx(request: Request) -> RegistryContext:
    """The app's context.  ``async`` on purpose: FastAPI runs a plain ``def``
    dependency in the thread pool, a thread hop on every request."""
    ctx = request.app.state.ctx
    assert isinstance(ctx, RegistryContext)
    return ctx
