"""Per-operation error responses for the OpenAPI document.

Each operation lists the statuses it can answer with the error envelope and,
for each status, the codes it can carry (``x-kiln-error-codes``, also named
in the description).  Codes and statuses follow Kiln's
``crates/kiln-server/src/error.rs`` where Kiln has the same failure.  Every
operation can also answer ``500 internal_error`` and, except the local
relaunch, ``408 request_timeout`` past ``request_timeout_secs``
(``api.deadline``); every operation but ``/health`` can answer
``401 unauthorized`` / ``403 forbidden`` when API tokens are on
(``auth.middleware``); a body over the size bound is ``413 request_too_large``
(``api.limits``), and one that does not fit the shared in-flight budget
``503 server_busy`` (listed on the operations that take a body).  Imports
the schemas only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kiln_registry.wire.system import ErrorResponse

DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request",
    401: "Missing, unknown, expired or revoked bearer token (`WWW-Authenticate: Bearer`)",
    403: "The token lacks the route's scope",
    404: "Not found",
    408: "Request timed out (`request_timeout_secs`)",
    409: "Conflict",
    413: "Request body too large",
    429: "Queue quota reached; retry after the Retry-After seconds",
    500: "Internal error",
    502: "Teacher probe failed",
    503: "Busy; retry after the Retry-After seconds",
}

# Launching a local teacher can refuse the profile's options or files.
LAUNCH_400 = ("launcher_policy_refused", "config_invalid", "teacher_identity_invalid")
PROBE = {502: ("teacher_identity_probe_failed",), 503: ("teacher_identity_probe_busy",)}


def error_responses(
    table: Mapping[int, Sequence[str]], *, deadline: bool = True, auth: bool = True
) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for the statuses and codes in ``table`` (plus 500, 408, 401/403)."""
    full: dict[int, Sequence[str]] = {**table, 500: ("internal_error", *table.get(500, ()))}
    if deadline:
        full[408] = ("request_timeout",)
    if auth:
        full[401] = ("unauthorized",)
        full[403] = ("forbidden",)
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted(full):
        codes = list(dict.fromkeys(full[status]))
        listed = ", ".join(f"`{code}`" for code in codes)
        out[status] = {
            "model": ErrorResponse,
            "description": f"{DESCRIPTIONS[status]}: {listed}.",
            "x-kiln-error-codes": codes,
        }
    return out


REGISTER = error_responses(
    {
        400: ("teacher_registration_invalid", "invalid_adapter_name", *LAUNCH_400),
        409: (
            "teacher_alias_exists",
            "teacher_alias_reserved",
            "teacher_limit_reached",
            "teacher_identity_mismatch",
            "teacher_launch_conflict",
        ),
        413: ("request_too_large",),
        500: ("launcher_failed",),
        502: ("teacher_identity_probe_failed",),
        503: ("teacher_identity_probe_busy", "server_busy"),
    }
)
LIST_TEACHERS = error_responses({400: ("invalid_request",)})  # a bad limit or cursor
GET_TEACHER = error_responses({404: ("teacher_not_found",)})
DELETE_TEACHER = error_responses(
    {404: ("teacher_not_found",), 409: ("teacher_launch_conflict", "reserved_aliases_full")}
)
PROBE_TEACHER = error_responses(
    {
        400: ("teacher_registration_invalid",),
        404: ("teacher_not_found",),
        409: ("teacher_identity_required", "teacher_identity_mismatch"),
        **PROBE,
    }
)
LAUNCH_TEACHER = error_responses(
    {
        400: ("teacher_registration_invalid", "invalid_adapter_name", *LAUNCH_400),
        404: ("teacher_not_found",),
        409: ("teacher_identity_mismatch", "teacher_launch_conflict", "teacher_identity_required"),
        500: ("launcher_failed",),
        **PROBE,
    },
    deadline=False,  # bounded by ready_deadline_s and local_launch_deadline_s instead
)
RECEIPTS = error_responses({400: ("invalid_request",)})
SUBMIT_JOB = error_responses(
    {
        400: ("job_invalid", "teacher_not_registered"),
        409: ("teacher_identity_required",),
        413: ("request_too_large",),
        429: ("job_queue_full",),
        503: ("server_busy",),
    }
)
LIST_JOBS = error_responses({400: ("job_invalid", "invalid_request")})  # bad cursor
JOB_BY_ID = error_responses({400: ("job_invalid",), 404: ("job_not_found",)})
CANCEL_JOB = error_responses(
    {400: ("job_invalid",), 404: ("job_not_found",), 409: ("job_conflict",)}
)
DELETE_JOB = error_responses(
    {400: ("job_invalid",), 404: ("job_not_found",), 409: ("job_conflict",)}
)
JOB_RESULT = error_responses(
    {400: ("job_invalid",), 404: ("job_not_found",), 409: ("job_conflict",)}
)
SYSTEM = error_responses({})
OPEN = error_responses({}, auth=False)  # /health needs no token
