"""Serve cached ``GET /v1/teachers/{alias}`` bodies without the router.

Alias lookups are the registry's hot path (a Kiln client resolves an alias
before every job).  Once an entry has been rendered by the route and stored
in the coherent entry cache (``api.entry_cache``), routing, dependency
resolution and response construction cost several times the lookup itself.
This pure ASGI layer answers exactly those requests from the cache and hands
everything else, including every miss, to the application unchanged, so a
cached answer is the route's own bytes with the route's own headers.

Which requests it answers mirrors the router (``routes/teachers.py``):
``GET`` with no query string, a path of ``/v1/teachers/<alias>`` where the
alias (already percent-decoded by the server, as the router sees it) is not
empty and does not end with ``/receipts`` (that suffix is the receipts route,
declared first).  Middleware added after this one (outermost) still sees
every request.  Imports the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln_registry.domain.asgi import ASGIApp, Receive, Scope, Send

PREFIX = "/v1/teachers/"
SUFFIX_ROUTES = ("/receipts",)

Lookup = Callable[[str], bytes | None]


def cached_alias(scope: Scope) -> str | None:
    """The alias a cacheable lookup names, or None when the router must decide."""
    if scope["type"] != "http" or scope["method"] != "GET" or scope.get("query_string"):
        return None
    path = scope["path"]
    if not path.startswith(PREFIX):
        return None
    alias: str = path[len(PREFIX) :]
    if not alias or alias.endswith(SUFFIX_ROUTES):
        return None
    return alias


class CachedEntryLookup:
    """Answer cache hits of ``GET /v1/teachers/{alias}``; pass everything else on."""

    def __init__(self, app: ASGIApp, *, lookup: Lookup) -> None:
        self._app = app
        self._lookup = lookup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        alias = cached_alias(scope)
        body = None if alias is None else self._lookup(alias)
        if body is None:
            await self._app(scope, receive, send)
            return
        headers = [
            (b"content-length", str(len(body)).encode("ascii")),
            (b"content-type", b"application/json"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
