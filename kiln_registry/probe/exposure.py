"""What a probe failure may tell the caller about the far side (issue 15, attack 3: SSRF).

A registration names any URL, so the registry must not become a reader of
other services' error pages or a port scanner:

* ``vllm_error_text``: a non-success body is quoted only when it has vLLM's
  error shape (``{"error": {"message", "type", "param", "code"}}``, or
  ``{"error": "Unauthorized"}`` from its API-key check on a 401); anything
  else is reported by its status alone.
* ``unreachable``: every failure before an HTTP answer (refused or reset
  connection, DNS, TLS handshake or untrusted certificate, a timeout before
  the response head) is one error with one message and rule
  ``probe.unreachable``; the detail goes to the server log only.
* ``parse_error_body``: the fields of a vLLM error envelope, leniently (None
  when a body is not one).

Imports the standard library, ``kiln_registry.domain.errors`` and ``probe.parse``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe.parse import refuse_constant, shown

log = logging.getLogger("kiln_registry.probe")

VLLM_ERROR_KEYS = frozenset({"message", "type", "param", "code"})
MAX_ERROR_BODY = 64 * 1024
UNREACHABLE_MESSAGE = "could not reach the teacher: no HTTP answer (connection, TLS or transport)"
UNREACHABLE_HINT = (
    "check the URL and that the teacher is up; for HTTPS, that [server] teacher_ca_file"
    " trusts its certificate; the registry's log has the detail"
)
NOT_SHOWN = "the body is not a vLLM error and is not shown"


def vllm_error_text(status: int, body: bytes) -> str | None:
    """The message of a vLLM error body, or None when the body is not one."""
    if len(body) > MAX_ERROR_BODY:
        return None
    try:
        top = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(top, dict) or set(top) != {"error"}:
        return None
    err = top["error"]
    if err == "Unauthorized" and status == 401:
        return "Unauthorized"
    if not isinstance(err, dict) or set(err) != VLLM_ERROR_KEYS:
        return None
    if not isinstance(err["message"], str) or not isinstance(err["type"], str):
        return None
    if not (err["code"] is None or type(err["code"]) is int):
        return None
    return shown(err["message"])


def unreachable(detail: str) -> ProbeFailed:
    """The one refusal for a teacher that gave no HTTP answer; ``detail`` is only logged."""
    log.warning("teacher unreachable: %s", detail[:500])
    return ProbeFailed(UNREACHABLE_MESSAGE, rule="probe.unreachable", hint=UNREACHABLE_HINT)


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """A vLLM error body: flat ``{"error": "..."}`` (401) or the nested envelope."""

    message: str
    type: str | None
    param: str | None
    code: int | None


def parse_error_body(body: bytes) -> ErrorBody | None:
    """The error envelope of a non-2xx body, or None when it is not one."""
    try:
        top = json.loads(body.decode("utf-8"), parse_constant=refuse_constant)
    except (ValueError, RecursionError, ProbeFailed):
        return None
    if not isinstance(top, dict) or "error" not in top:
        return None
    err = top["error"]
    if isinstance(err, str):
        return ErrorBody(message=err, type=None, param=None, code=None)
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return None
    kind, param, code = err.get("type"), err.get("param"), err.get("code")
    return ErrorBody(
        message=err["message"],
        type=kind if isinstance(kind, str) else None,
        param=param if isinstance(param, str) else None,
        code=code if type(code) is int else None,
    )
