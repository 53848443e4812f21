"""Request bodies read as strict JSON (issue 15, attacks 6 and 8).

FastAPI decodes a JSON body with ``json.loads``, which keeps the last of two
duplicate keys and accepts lone surrogate escapes (``"\\ud800"``) that later
fail at the database insert as a 500.  ``StrictJsonRoute`` is the route
class of every router with a request body: its request reads the body with
the identity reader (``identity.canonical.strict_json_loads``: duplicate
keys, lone surrogates, NaN/Infinity, numbers that overflow, over-deep
nesting and invalid UTF-8 are refused) and refuses with 400 and the
endpoint's invalid-request code (``api.errors.invalid_code``) before any
handler, probe or write runs.  The route also names the caller for the
per-caller probe slots (``probe.client.PROBE_CALLER``).  Integer ranges are bounded in the schemas.

Imports FastAPI/Starlette, ``identity.canonical`` and ``api.errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from kiln_registry.api.errors import invalid_code
from kiln_registry.api.limits import MAX_JOB_REQUEST_BYTES, request_caller
from kiln_registry.domain.errors import IdentityError, KilnError
from kiln_registry.identity.canonical import strict_json_loads
from kiln_registry.probe.client import PROBE_CALLER, ProbeCaller
from kiln_registry.wire.jobs import MAX_INLINE_SEQUENCES, MAX_INLINE_TOKENS

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
# Every item of a valid body is a token, a sequence or one of a few fields.
MAX_JSON_ITEMS = MAX_INLINE_TOKENS + MAX_INLINE_SEQUENCES + 64


async def read_strict_json(request: Request) -> None:
    """Parse a non-empty body strictly and cache it as the request's JSON (FastAPI reuses it).

    Runs before FastAPI's own body handling, which would turn any exception
    from ``request.json()`` into a bare 400 without the envelope's code.
    """
    body = await request.body()
    if not body:
        return
    if body.count(b",") > MAX_JSON_ITEMS:
        # Refused before parsing: a body of millions of tiny items would otherwise become
        # Python lists many times its size (issue 15, attack 4).
        raise KilnError(
            f"request body holds more than {MAX_JSON_ITEMS} JSON items",
            rule="json.too_many_items",
            code=invalid_code(request.method, request.url.path),
            status=400,
            hint="send large inputs as a corpus file under [jobs] corpus_root",
        )
    try:
        value = strict_json_loads(body, what="request body", max_bytes=MAX_JOB_REQUEST_BYTES)
    except IdentityError as exc:
        raise KilnError(
            exc.message,
            rule=exc.rule,
            code=invalid_code(request.method, request.url.path),
            status=400,
            hint="send one strict JSON object (unique keys, valid UTF-8 strings)",
        ) from None
    request._json = value  # Starlette's cache: ``request.json()`` returns it as is


def caller_key(scope: Any) -> ProbeCaller | None:
    """Who is calling, for fair probe slots: the token (admin or not), else the client address.

    Without a token every client at one address is one caller (on loopback with auth
    off, all local clients share one turn): give each client a token to separate them.
    """
    caller = request_caller(scope)
    if caller is None:
        return None
    key, scopes = caller
    return ProbeCaller(key, admin="admin" in scopes)


class StrictJsonRoute(APIRoute):
    """An ``APIRoute`` whose JSON body, when it has one, is read strictly first.

    It also names the caller for the probe limiter (``PROBE_CALLER``) while the
    endpoint runs, so one caller holds at most its share of probe slots.
    """

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        methods = self.methods or set()
        if not any(method in methods for method in ("POST", "PUT", "PATCH")):
            return handler

        async def strict_handler(request: Request) -> Response:
            await read_strict_json(request)
            caller = PROBE_CALLER.set(caller_key(request.scope))
            try:
                return await handler(request)
            finally:
                PROBE_CALLER.reset(caller)

        return strict_handler
