"""Kiln's ``[server] request_timeout_secs`` as the deadline of one API request.

Kiln answers a request that runs past ``request_timeout_secs`` with ``408``
and the code ``request_timeout`` (``crates/kiln-server/src/error.rs``,
``ApiError::request_timeout``); ``RequestDeadline`` does the same for the
registry's API.  Routes with their own, longer deadline (a local teacher's
launch, bounded by ``ready_deadline_s`` and ``local_launch_deadline_s``) are
exempt, as are responses already started (a status cannot be changed once
sent; the request is then cancelled and the connection closed).

Pure ASGI; imports the standard library, Starlette's types and
``kiln_registry.api.errors`` only.
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kiln_registry.api.errors import error_body

EXEMPT_SUFFIXES = ("/launch",)
HINT = "increase the server's request_timeout_secs in the config file, or retry"


def timeout_body(seconds: int) -> bytes:
    """Kiln's envelope for a request that ran past its deadline."""
    body = error_body("request_timeout", f"Request timed out after {seconds} seconds", HINT)
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


class RequestDeadline:
    """Cancel an HTTP request after ``seconds`` and answer ``408 request_timeout``."""

    def __init__(self, app: ASGIApp, *, seconds: int) -> None:
        if seconds <= 0:
            raise ValueError("request_timeout_secs must be > 0")
        self._app = app
        self._seconds = seconds

    def _exempt(self, scope: Scope) -> bool:
        path = str(scope.get("path", ""))
        return scope["type"] != "http" or path.endswith(EXEMPT_SUFFIXES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._exempt(scope):
            await self._app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            async with asyncio.timeout(self._seconds):
                await self._app(scope, receive, tracking_send)
        except TimeoutError:
            if started:
                raise
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = timeout_body(self._seconds)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 408, "headers": headers})
        await send({"type": "http.response.body", "body": body})
