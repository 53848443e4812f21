"""A request-body bound for the registry API, enforced before anything is buffered.

Pure ASGI middleware: a declared ``Content-Length`` above the bound (or one
that is not a number) is refused at once, and a body streamed without one is
counted chunk by chunk and refused as soon as it passes the bound (the
application then sees a client disconnect and whatever it answers is
dropped), so the application never buffers more than ``max_bytes`` plus
one chunk.  The refusal is Kiln's
error envelope with status 413 and code ``request_too_large``.

Imports the standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

MAX_REQUEST_BYTES = 64 * 1024
# Job submissions may carry inline token sequences (up to 1M tokens).
MAX_JOB_REQUEST_BYTES = 16 * 1024 * 1024
PATH_LIMITS: tuple[tuple[str, int], ...] = (("/v1/jobs", MAX_JOB_REQUEST_BYTES),)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _too_large_body(limit: int) -> bytes:
    error = {
        "code": "request_too_large",
        "message": f"request body is larger than {limit} bytes",
        "hint": "send a smaller request",
    }
    return json.dumps({"error": error}).encode()


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            text = value.decode("latin-1")
            return int(text) if text.isdigit() and len(text) < 20 else -1
    return None


class RequestBodyLimit:
    """Refuse request bodies above the path's bound with 413 before they are buffered.

    ``path_limits`` are ``(prefix, bytes)`` pairs; other paths get ``max_bytes``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int = MAX_REQUEST_BYTES,
        path_limits: tuple[tuple[str, int], ...] = PATH_LIMITS,
    ) -> None:
        self._app = app
        self._max = max_bytes
        self._path_limits = path_limits

    def _limit(self, path: str) -> int:
        for prefix, limit in self._path_limits:
            if path == prefix or path.startswith(prefix + "/"):
                return limit
        return self._max

    @staticmethod
    async def _refuse(send: Send, limit: int) -> None:
        body = _too_large_body(limit)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        limit = self._limit(str(scope.get("path", "")))
        declared = _declared_length(scope)
        if declared is not None and not 0 <= declared <= limit:
            await self._refuse(send, limit)
            return
        state = {"received": 0, "refused": False}

        async def counted_receive() -> Message:
            if state["refused"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > limit:
                    # Answer now; the app then sees a disconnect and its
                    # own (late) response is dropped below.
                    state["refused"] = True
                    await self._refuse(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not state["refused"]:
                await send(message)

        await self._app(scope, counted_receive, guarded_send)
