"""Refusals the gateway answers itself, in vLLM's error shape.

vLLM 0.32 answers a refused request with
``{"error": {"message", "type", "param", "code"}}`` (``type`` is the
exception name for parameter errors, the HTTP reason phrase for routing
errors) and a missing or wrong API key with ``{"error": "Unauthorized"}``.
The gateway uses the same shapes so clients see familiar errors.  Messages
never quote request bytes other than a bounded, printable model name.

Imports: standard library only.
"""

from __future__ import annotations

import json
from http import HTTPStatus

BAD_REQUEST = "BadRequestError"
NOT_FOUND = "NotFoundError"
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'


def vllm_error_body(
    status: int, message: str, kind: str, param: str | None, **extra: object
) -> bytes:
    """vLLM's error body (``{"error": "Unauthorized"}`` for a 401), ``extra`` members appended."""
    if status == 401:
        return UNAUTHORIZED_BODY
    error: dict[str, object] = {"message": message, "type": kind, "param": param, "code": status}
    error.update(extra)
    return json.dumps({"error": error}, separators=(",", ":")).encode()


class Refusal(Exception):
    """A request the gateway answers itself; ``close`` ends the connection after it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str | None = None,
        param: str | None = None,
        close: bool = True,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind if kind is not None else HTTPStatus(status).phrase
        self.param = param
        self.close = close

    def body(self) -> bytes:
        return vllm_error_body(self.status, self.message, self.kind, self.param)


def bad_param(message: str, param: str, *, status: int = 400) -> Refusal:
    """A parameter refusal after the body was read (the connection may stay open)."""
    return Refusal(status, message, kind=BAD_REQUEST, param=param, close=False)


def not_found() -> Refusal:
    return Refusal(
        404,
        "Not Found: the gateway serves POST /v1/completions, GET /v1/models and GET /health",
    )
