"""The endpoint's own answers in vLLM's error shape.

vLLM answers ``{"error": {"message", "type", "param", "code"}}``; trainers
(TRL's ``VLLMClient``, the openai package) show ``message``.  The endpoint
uses the same shape and adds ``rule`` (the dotted rule that was broken) for
its own refusals, so a log line or a test can tell them apart.  A refused
request is ``EndpointRefusal``; ``body()`` renders it.  Messages never quote
request or teacher bytes beyond a bounded, printable model name.

Imports the standard library and ``gateway.refusals`` (vLLM's error body).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Final

from kiln_registry.gateway.refusals import vllm_error_body

BAD_REQUEST: Final = "BadRequestError"
NOT_FOUND: Final = "NotFoundError"
IDENTITY_CHANGED: Final = "teacher_identity_changed"
ANSWER_REFUSED: Final = "teacher_answer_refused"
UNAVAILABLE: Final = "teacher_endpoint_unavailable"


class EndpointRefusal(Exception):
    """A request the endpoint answers itself, with status, vLLM ``type`` and rule."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str | None = None,
        param: str | None = None,
        rule: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind if kind is not None else HTTPStatus(status).phrase
        self.param = param
        self.rule = rule
        self.retry_after = retry_after

    def body(self) -> bytes:
        extra = {} if self.rule is None else {"rule": self.rule}
        return vllm_error_body(self.status, self.message, self.kind, self.param, **extra)

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"retry-after": str(self.retry_after)}


def bad_request(message: str, param: str, rule: str) -> EndpointRefusal:
    """A refused request field or bound (HTTP 400, vLLM's ``BadRequestError``)."""
    return EndpointRefusal(400, message, kind=BAD_REQUEST, param=param, rule=f"endpoint.{rule}")


def unavailable(reason: str, *, retry_after: int | None = None) -> EndpointRefusal:
    """HTTP 503: the endpoint does not serve now (no replica left, alias gone)."""
    return EndpointRefusal(
        503, reason, kind=UNAVAILABLE, rule="endpoint.unavailable", retry_after=retry_after
    )
