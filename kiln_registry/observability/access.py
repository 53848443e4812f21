"""The access layer: request id, metrics and the access log of every HTTP request.

``AccessLayer`` is a pure ASGI layer, the outermost of the application (so it
also sees requests refused by the host guard or auth, and lookups answered by
the cached fast path, ``api.fast_lookup``).  Per request it

* picks the request id (``observability.request_id``), stores it in
  ``scope["state"]["request_id"]`` and in the ``current_request_id`` context
  variable, and adds ``X-Request-ID`` to the response head;
* records ``kiln_http_requests_total`` and the latency histogram under the
  route's path template (``route_template``), never the raw path;
* writes one access record to the ``kiln_registry.access`` logger (only when
  INFO is enabled): its fields travel on the record (``FIELDS_ATTR``); the
  formatters (``observability.logs``) write them as fields and scrub the
  finished line of tokens and secret values.  The query string is never
  logged; the token's *name* is, never the token.
* except for a page's periodic refresh (``/ui`` sends ``X-Kiln-Refresh: 1``
  with every request it repeats each second): such a ``GET``/``HEAD`` answered
  below 400 is written at DEBUG and counted (``RefreshSummary``), and one INFO
  line per ``SUMMARY_S`` (written with the first request after the window
  ends) says how many there were per route.  A refused or failed refresh, and
  every other request, keeps its own INFO line.

It does a dict lookup and a few attribute reads per request; the access
record is built only when it will be written.  Imports the standard library,
Starlette's routing (``Match``) and ``observability``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from starlette.routing import Match

from kiln_registry.domain.asgi import ASGIApp, Message, Receive, Scope, Send
from kiln_registry.observability.metrics import RegistryMetrics, method_label
from kiln_registry.observability.request_id import HEADER, RequestIds, current_request_id

ACCESS_LOGGER: Final = "kiln_registry.access"
FIELDS_ATTR: Final = "kiln_access"  # the access record's fields (a dict) on the LogRecord
UNMATCHED: Final = "unmatched"
MAX_PATH_CHARS: Final = 256
# The cached fast path answers GET /v1/teachers/<alias> without routing (api.fast_lookup).
LOOKUP_PREFIX: Final = "/v1/teachers/"
LOOKUP_TEMPLATE: Final = "/v1/teachers/{alias}"

REFRESH_HEADER: Final = b"x-kiln-refresh"
SUMMARY_S: Final = 60.0
READS: Final = frozenset({"GET", "HEAD"})

access_log = logging.getLogger(ACCESS_LOGGER)


def _refresh(scope: Scope, status: int) -> bool:
    """A page's successful periodic read (``X-Kiln-Refresh: 1``, GET/HEAD, below 400)."""
    if scope["method"] not in READS or status >= 400:
        return False
    return any(k == REFRESH_HEADER and v == b"1" for k, v in scope["headers"])


class RefreshSummary:
    """Counts of refresh reads per (method, route template); one summary per window.

    Keys are route templates (bounded by the app's routes), never raw paths.
    """

    def __init__(self, window_s: float = SUMMARY_S, clock: Callable[[], float] = time.monotonic):
        self._window_s = window_s
        self._clock = clock
        self._since = clock()
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, method: str, route: str) -> None:
        key = (method, route)
        self._counts[key] = self._counts.get(key, 0) + 1

    def due(self) -> str | None:
        """The summary line once the window has ended with something counted, else None."""
        now = self._clock()
        if now - self._since < self._window_s:
            return None
        counts, self._counts, self._since = self._counts, {}, now
        if not counts:
            return None
        parts = ", ".join(f"{n} {m} {r}" for (m, r), n in sorted(counts.items()))
        return (
            f"page refreshes answered in the last {self._window_s:g} s: {parts}"
            " (each one is logged at DEBUG)"
        )


def route_template(scope: Scope) -> str:
    """The path template of the route that served (or would serve) the request."""
    route = scope.get("route")
    if route is None:
        path: str = scope["path"]
        if path.startswith(LOOKUP_PREFIX) and "/" not in path[len(LOOKUP_PREFIX) :]:
            return LOOKUP_TEMPLATE  # a cached lookup (or one refused before routing)
        route = _match(scope)
        if route is None:
            return UNMATCHED
    template = getattr(route, "path_format", None)
    return template if isinstance(template, str) else UNMATCHED


def _match(scope: Scope) -> object | None:
    """The app's route for a request that never reached the router (bounded by the routes)."""
    app = scope.get("app")
    router = getattr(app, "router", None)
    for route in getattr(router, "routes", ()):
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            found: object = route
            return found
    return None


class AccessLayer:
    """Request id, per-route metrics and the structured access log (see the module)."""

    def __init__(
        self, app: ASGIApp, *, metrics: RegistryMetrics, summary: RefreshSummary | None = None
    ) -> None:
        self._app = app
        self._metrics = metrics
        self._ids = RequestIds()
        self._refreshes = summary or RefreshSummary()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = self._ids.for_headers(scope["headers"])
        scope.setdefault("state", {})["request_id"] = request_id
        id_header = (HEADER, request_id.encode("ascii"))
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        reset = current_request_id.set(request_id)
        try:
            await self._app(scope, receive, send_with_id)
        finally:
            current_request_id.reset(reset)
            seconds = time.perf_counter() - started
            route = route_template(scope)
            method = method_label(scope["method"])
            self._metrics.observe_request(method, route, status, seconds)
            level = logging.INFO
            if _refresh(scope, status):
                self._refreshes.add(method, route)
                level = logging.DEBUG
            if access_log.isEnabledFor(level):
                _log_access(scope, route, status, seconds, request_id, level)
            summary = self._refreshes.due()
            if summary is not None:
                access_log.info(summary)


def _log_access(
    scope: Scope, route: str, status: int, seconds: float, request_id: str, level: int
) -> None:
    client = scope.get("client")
    identity = scope.get("state", {}).get("kiln_token")
    fields: dict[str, object] = {
        "request_id": request_id,
        "method": method_label(scope["method"]),
        "route": route,
        "path": scope["path"][:MAX_PATH_CHARS],
        "status": status,
        "duration_ms": round(seconds * 1000.0, 3),
        "client": client[0] if client else None,
        "token": getattr(identity, "name", None),
    }
    # Built directly (no caller lookup: the logger's _log walks the stack for every record).
    record = logging.LogRecord(ACCESS_LOGGER, level, __file__, 0, "request", None, None)
    record.__dict__[FIELDS_ATTR] = fields
    access_log.handle(record)
