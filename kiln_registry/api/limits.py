"""A request-body bound for the registry API, enforced before anything is buffered.

Pure ASGI middleware: a declared ``Content-Length`` above the bound (or one
that is not a number) is refused at once, and a body streamed without one is
counted chunk by chunk and refused as soon as it passes the bound (the
application then sees a client disconnect and whatever it answers is
dropped), so the application never buffers more than ``max_bytes`` plus
one chunk.  The refusal is Kiln's
error envelope with status 413 and code ``request_too_large``.

Bodies in flight share one byte budget (``MAX_BYTES_IN_FLIGHT``, issue 15
attack 4): a request reserves its declared length (or each streamed chunk)
before it is read and releases it when its answer is done; a body that does
not fit is answered 503 ``server_busy`` with ``Retry-After`` at once, so a
burst of large bodies cannot take the server's memory, and requests without
a body (``/health``) never wait for it.

Imports the standard library only.
"""

from __future__ import annotations

import json

from kiln_registry.domain.asgi import ASGIApp, Message, Receive, Scope, Send

MAX_REQUEST_BYTES = 64 * 1024
# Job submissions may carry inline token sequences (up to 1M tokens).
MAX_JOB_REQUEST_BYTES = 16 * 1024 * 1024
PATH_LIMITS: tuple[tuple[str, int], ...] = (("/v1/jobs", MAX_JOB_REQUEST_BYTES),)
# Two maximal job bodies at a time; their parsing is a small multiple of their size.
MAX_BYTES_IN_FLIGHT = 2 * MAX_JOB_REQUEST_BYTES
RETRY_AFTER_S = 1


def _too_large_body(limit: int) -> bytes:
    error = {
        "code": "request_too_large",
        "message": f"request body is larger than {limit} bytes",
        "hint": "send a smaller request",
    }
    return json.dumps({"error": error}).encode()


def _busy_body() -> bytes:
    error = {
        "code": "server_busy",
        "message": "too many request bytes are in flight; retry shortly",
        "hint": "retry after the Retry-After seconds; send large inputs as corpus files",
    }
    return json.dumps({"error": error}).encode()


class ByteBudget:
    """Bytes reserved by bodies in flight (one event loop: no lock needed)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.capacity:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


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
        bytes_in_flight: int = MAX_BYTES_IN_FLIGHT,
    ) -> None:
        self._app = app
        self._max = max_bytes
        self._path_limits = path_limits
        self.budget = ByteBudget(bytes_in_flight)

    def _limit(self, path: str) -> int:
        for prefix, limit in self._path_limits:
            if path == prefix or path.startswith(prefix + "/"):
                return limit
        return self._max

    @staticmethod
    async def _refuse(send: Send, limit: int | None) -> None:
        """413 for a body over ``limit``; 503 with Retry-After when ``limit`` is None (busy)."""
        body = _too_large_body(limit) if limit is not None else _busy_body()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        if limit is None:
            headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
        status = 413 if limit is not None else 503
        await send({"type": "http.response.start", "status": status, "headers": headers})
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
        if declared and not self.budget.take(declared):
            await self._refuse(send, None)
            return
        state = _BodyState(limit, declared or 0, streamed=declared is None)
        try:
            await self._app(scope, state.receiver(receive, send, self), state.sender(send))
        finally:
            self.budget.give(state.reserved)


class _BodyState:
    """One request's counted body: bytes received and reserved, and whether it was refused."""

    def __init__(self, limit: int, reserved: int, *, streamed: bool) -> None:
        self.limit = limit
        self.reserved = reserved
        self.streamed = streamed
        self.received = 0
        self.refused = False

    def receiver(self, receive: Receive, send: Send, owner: RequestBodyLimit) -> Receive:
        async def counted_receive() -> Message:
            if self.refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] != "http.request":
                return message
            size = len(message.get("body", b""))
            self.received += size
            refusal: int | None = 0
            if self.received > self.limit:
                refusal = self.limit
            elif self.streamed and size:
                if owner.budget.take(size):
                    self.reserved += size
                else:
                    refusal = None
            if refusal == 0:
                return message
            # Answer now; the app then sees a disconnect and its own (late) response is
            # dropped by the sender below.
            self.refused = True
            await owner._refuse(send, refusal)
            return {"type": "http.disconnect"}

        return counted_receive

    def sender(self, send: Send) -> Send:
        async def guarded_send(message: Message) -> None:
            if not self.refused:
                await send(message)

        return guarded_send
