"""Which scope each route needs, and which audit action a state change is.

``required_scope(method, path)`` is the one table the auth middleware reads:
``None`` for ``GET``/``HEAD`` of ``/health`` and the browser pages' fixed files
(``/`` redirecting to ``/ui``, ``/docs``, ``/ui``, ``/assets/<name>``: no data,
always open).  Open paths are open for their own methods only: any other
method on them needs ``admin`` like every unlisted route (issue 27, item 1:
``POST /health`` was an anonymous way to write audit rows),
``read`` for GET routes, receipts, job status and ``POST
/v1/teachers/<alias>/report`` (a changed answer reported: the registry
re-probes by itself and trusts nothing the caller says), ``register`` for
registering, deleting, probing and launching teachers, ``jobs`` for
submitting, cancelling, deleting jobs and fetching results, ``admin`` for the
audit log and alias release.  Anything not listed needs ``admin`` (fail
closed: a route added later is locked until it is listed here).  ``/ready``
and ``/metrics`` need ``read`` unless ``[server] metrics_public``;
``/openapi.json`` needs ``read`` unless ``[server] public_docs``.  ``HEAD``
is treated as ``GET``.

``audit_action(method, path)`` names the state change a non-GET request makes
(``teacher.register`` ...) and the alias or job id in its path; ``None`` when
the request names none of the registry's state changes.  ``fallback_action``
names such a request by method and path (recorded only for a token holder).
Imports the standard library only.
"""

from __future__ import annotations

from typing import Final

OPEN_PATHS: Final = frozenset({"/health", "/", "/docs", "/ui"})
ASSETS: Final = "/assets/"  # the pages' files (api.ui): open for GET/HEAD only
METRICS_PATHS: Final = frozenset({"/ready", "/metrics"})
READ_PATHS: Final = frozenset({"/v1/keys", "/openapi.json"})
SCHEMA_PATH: Final = "/openapi.json"
TEACHERS: Final = "/v1/teachers"
JOBS: Final = "/v1/jobs"
ADMIN_ALIASES: Final = "/v1/admin/aliases/"
READ_METHODS: Final = frozenset({"GET", "HEAD"})


def _teachers_scope(method: str, path: str) -> str:
    if method in READ_METHODS:
        return "read"
    if path == TEACHERS:
        return "register" if method == "POST" else "admin"
    if method == "POST" and path.endswith("/report"):
        return "read"  # the registry re-probes by itself (the teacher endpoint's report)
    if method == "POST" and path.endswith(("/probe", "/launch")):
        return "register"
    if method == "DELETE":
        return "register"
    return "admin"


def _jobs_scope(method: str, path: str) -> str:
    if method in READ_METHODS:
        return "jobs" if path.endswith("/result") else "read"
    if method == "POST" and (path == JOBS or path.endswith("/cancel")):
        return "jobs"
    if method == "DELETE" and path != JOBS:
        return "jobs"
    return "admin"


def required_scope(
    method: str, path: str, *, metrics_public: bool = False, public_docs: bool = False
) -> str | None:
    """The scope ``method path`` needs, or None when the route is open."""
    if method in READ_METHODS and (path in OPEN_PATHS or path.startswith(ASSETS)):
        return None
    if public_docs and method in READ_METHODS and path == SCHEMA_PATH:
        return None
    if path in METRICS_PATHS:
        return None if metrics_public else "read"
    if path == TEACHERS or path.startswith(TEACHERS + "/"):
        return _teachers_scope(method, path)
    if path == JOBS or path.startswith(JOBS + "/"):
        return _jobs_scope(method, path)
    if path in READ_PATHS and method in READ_METHODS:
        return "read"
    return "admin"


def _tail(path: str, prefix: str, suffix: str = "") -> str:
    end = len(path) - len(suffix) if suffix else len(path)
    return path[len(prefix) : end]


def audit_action(method: str, path: str) -> tuple[str, str | None] | None:
    """The audit action of a state-changing request and the alias/job id its path names.

    ``None`` for anything that is not one of the registry's state changes (an unknown
    path, a method the route lacks): such a request never writes an audit row.
    """
    if path == TEACHERS and method == "POST":
        return "teacher.register", None
    if path.startswith(TEACHERS + "/"):
        for suffix, action in (("/probe", "teacher.probe"), ("/launch", "teacher.launch"),
                               ("/report", "teacher.report")):  # fmt: skip
            if method == "POST" and path.endswith(suffix):
                return action, _tail(path, TEACHERS + "/", suffix)
        if method == "DELETE":
            return "teacher.delete", _tail(path, TEACHERS + "/")
    if path == JOBS and method == "POST":
        return "job.submit", None
    if path.startswith(JOBS + "/"):
        if method == "POST" and path.endswith("/cancel"):
            return "job.cancel", _tail(path, JOBS + "/", "/cancel")
        if method == "DELETE":
            return "job.delete", _tail(path, JOBS + "/")
    if path.startswith(ADMIN_ALIASES) and path.endswith("/release") and method == "POST":
        return "alias.release", _tail(path, ADMIN_ALIASES, "/release")
    return None


def fallback_action(method: str, path: str) -> str:
    """A bounded name for a non-GET request to no known state change (``post /x``)."""
    return f"{method.lower()[:16]} {path[:128]}"
