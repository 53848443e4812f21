"""Render every failure in Kiln's error envelope.

``{"error": {"code", "message", "hint"}}`` (``hint`` always a string; a
``rule`` member is added when a named rule failed) with the status of the
``KilnError`` subclass, ``Retry-After`` where a retry makes sense, request
validation errors as 400 with the endpoint's invalid-request code naming
each bad field (never the submitted values), a database that cannot be
reached (restart, outage, lock timeout) as ``503 database_unavailable``
with ``Retry-After``, and anything unexpected as a generic 500 whose body
says nothing internal (the traceback goes to the log, which is redacted).
As a last line of defence every rendered message and hint is scrubbed of
the current values of the configured secret variables.  Imports
FastAPI/Starlette, SQLAlchemy's exception types, ``kiln_registry.domain``
(errors, text) and the credential redaction helpers only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kiln_registry.credentials.redaction import redact_text
from kiln_registry.domain.errors import DatabaseUnavailable, KilnError
from kiln_registry.domain.text import ErrorItem, error_location, error_message, render_errors

log = logging.getLogger("kiln_registry.api")

MAX_VALIDATION_ITEMS = 20
MAX_MESSAGE_CHARS = 2000


def error_body(code: str, message: str, hint: str = "", rule: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message[:MAX_MESSAGE_CHARS], "hint": hint}
    if rule:
        error["rule"] = rule
    return {"error": error}


def invalid_code(method: str, path: str) -> str:
    """The code of a request that fails validation: the endpoint's own invalid-request code."""
    if path.startswith("/v1/jobs"):
        return "job_invalid"
    if method == "POST" and path.rstrip("/") == "/v1/teachers":
        return "teacher_registration_invalid"
    return "invalid_request"


def _validation_line(err: ErrorItem) -> str:
    where = error_location(err.get("loc", ()), empty="body", skip=("body",))
    if err.get("type") == "extra_forbidden":
        return f"{where}: unknown field (not part of the API)"
    return f"{where}: {error_message(err)}"


def describe_validation_errors(errors: Sequence[Any]) -> str:
    """One line naming each bad field; never echoes the submitted values."""
    return "; ".join(render_errors(errors, MAX_VALIDATION_ITEMS, _validation_line))


def _secret_names(request: Request) -> frozenset[str]:
    ctx = getattr(request.app.state, "ctx", None)
    config = getattr(ctx, "config", None)
    names = config.secret_env_names() if config is not None else frozenset()
    return frozenset(str(name) for name in names)


async def _kiln_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KilnError)
    names = _secret_names(request)
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    hint = redact_text(exc.hint, names) if exc.hint else ""
    return JSONResponse(
        error_body(exc.code, redact_text(str(exc), names), hint, exc.rule),
        status_code=exc.status,
        headers=headers,
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message = describe_validation_errors(exc.errors())
    return JSONResponse(
        error_body(
            invalid_code(request.method, request.url.path),
            message,
            "fix the named fields and retry",
        ),
        status_code=400,
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    hint = "the operations and their paths are listed at /openapi.json"
    return JSONResponse(
        error_body(code, str(exc.detail), hint), status_code=exc.status_code, headers=exc.headers
    )


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """The database is away or busy: 503 with Retry-After, never a 500 (issue 33 item 4)."""
    assert isinstance(exc, DBAPIError)
    if not isinstance(exc, OperationalError | InterfaceError) and not exc.connection_invalidated:
        return await _unexpected(request, exc)
    log.warning("database unavailable on %s %s (%s)", request.method, request.url.path,
                type(exc.orig).__name__)  # fmt: skip
    return await _kiln_error(request, DatabaseUnavailable("the registry's database is unavailable"))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        error_body("internal_error", "internal server error", "see the server log"),
        status_code=500,
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(KilnError, _kiln_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(Exception, _unexpected)
