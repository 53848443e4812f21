"""HTTP routes: thin handlers that validate, call one service function and return a schema."""

from __future__ import annotations

from fastapi import Request

from kiln_registry.api.context import RegistryContext
from kiln_registry.api.schemas import ErrorResponse

ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorResponse, "description": "Invalid request"},
    404: {"model": ErrorResponse, "description": "Not found"},
    409: {"model": ErrorResponse, "description": "Conflict"},
    500: {"model": ErrorResponse, "description": "Internal error"},
    502: {"model": ErrorResponse, "description": "Teacher probe failed"},
    503: {"model": ErrorResponse, "description": "Busy; retry after the Retry-After seconds"},
}


async def get_ctx(request: Request) -> RegistryContext:
    """The app's context.  ``async`` on purpose: FastAPI runs a plain ``def``
    dependency in the thread pool, a thread hop on every request."""
    ctx = request.app.state.ctx
    assert isinstance(ctx, RegistryContext)
    return ctx
