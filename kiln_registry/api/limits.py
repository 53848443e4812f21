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

The budget is reserved per caller (issue 27, item 2): one caller (its
token's name, else its address) holds at most ``PER_CALLER_BYTES`` (one
maximal job body), and bodies over ``MAX_REQUEST_BYTES`` never take the
last ``SMALL_RESERVE_BYTES``, so every registration finds room whatever job
bodies hold.  A body must also arrive in time: after ``grace_s`` it must
keep an average of ``min_rate`` bytes per second (``[server] body_grace_s``
and ``body_min_bytes_per_s``); a slower one is answered ``408
request_timeout`` and its connection closed, which frees its reservation.

Imports the standard library only.
"""

from __future__ import annotations

import asyncio
import json

from kiln_registry.domain.asgi import ASGIApp, Message, Receive, Scope, Send

MAX_REQUEST_BYTES = 64 * 1024
# Job submissions may carry inline token sequences (up to 1M tokens).
MAX_JOB_REQUEST_BYTES = 16 * 1024 * 1024
PATH_LIMITS: tuple[tuple[str, int], ...] = (("/v1/jobs", MAX_JOB_REQUEST_BYTES),)
# Room kept for small bodies (64 registrations at their largest) whatever job bodies hold.
SMALL_RESERVE_BYTES = 64 * MAX_REQUEST_BYTES
# Two maximal job bodies at a time (their parsing is a small multiple of their size),
# plus the small bodies' reserve.
MAX_BYTES_IN_FLIGHT = 2 * MAX_JOB_REQUEST_BYTES + SMALL_RESERVE_BYTES
PER_CALLER_BYTES = MAX_JOB_REQUEST_BYTES
RETRY_AFTER_S = 1
DEFAULT_GRACE_S = 10.0
DEFAULT_MIN_RATE = 64 * 1024


def _envelope(code: str, message: str, hint: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "hint": hint}}).encode()


def _too_large_body(limit: int) -> bytes:
    message = f"request body is larger than {limit} bytes"
    return _envelope("request_too_large", message, "send a smaller request")


def _busy_body() -> bytes:
    return _envelope(
        "server_busy",
        "too many request bytes are in flight (for this caller or in all); retry shortly",
        "retry after the Retry-After seconds; send large inputs as corpus files",
    )


def _slow_body(grace_s: float, min_rate: int) -> bytes:
    return _envelope(
        "request_timeout",
        f"request body arrived slower than {min_rate} bytes per second"
        f" after a grace of {grace_s:g} seconds",
        "send the body at once; a server admin may lower [server] body_min_bytes_per_s",
    )


class ByteBudget:
    """Bytes reserved by bodies in flight, in all and per caller (one event loop: no lock).

    A caller holds at most ``per_caller`` bytes; a large body (over
    ``MAX_REQUEST_BYTES``) fits only below ``capacity - small_reserve``.
    """

    def __init__(
        self, capacity: int, *, per_caller: int = PER_CALLER_BYTES, small_reserve: int = 0
    ) -> None:
        self.capacity = capacity
        self.per_caller = per_caller
        self.small_reserve = small_reserve
        self.used = 0
        self.held: dict[str, int] = {}  # one entry per caller holding bytes

    def take(self, caller: str, size: int, *, large: bool) -> bool:
        held = self.held.get(caller, 0)
        ceiling = self.capacity - (self.small_reserve if large else 0)
        if held + size > self.per_caller or self.used + size > ceiling:
            return False
        self.used += size
        self.held[caller] = held + size
        return True

    def give(self, caller: str, size: int) -> None:
        if size <= 0:
            return
        self.used -= size
        left = self.held.get(caller, 0) - size
        if left > 0:
            self.held[caller] = left
        else:
            self.held.pop(caller, None)


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            text = value.decode("latin-1")
            return int(text) if text.isdigit() and len(text) < 20 else -1
    return None


def request_caller(scope: Scope) -> tuple[str, frozenset[str]] | None:
    """Who is calling: ``token:<name>`` with its scopes (set by the auth layer), else
    ``addr:<ip>`` with none; None when the connection has no address."""
    state = scope.get("state")
    token = state.get("kiln_token") if isinstance(state, dict) else None
    name = getattr(token, "name", None)
    if isinstance(name, str):
        return "token:" + name, getattr(token, "scopes", frozenset())
    client = scope.get("client")
    return ("addr:" + str(client[0]), frozenset()) if client else None


def body_caller(scope: Scope) -> str:
    """Whose budget a body takes: the token's name, else the address."""
    caller = request_caller(scope)
    return caller[0] if caller is not None else "addr:"


def _refusal_headers(body: bytes, *, retry: bool) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if retry:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    return headers


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
        grace_s: float = DEFAULT_GRACE_S,
        min_rate: int = DEFAULT_MIN_RATE,
    ) -> None:
        self._app = app
        self._max = max_bytes
        self._path_limits = path_limits
        reserve = min(SMALL_RESERVE_BYTES, bytes_in_flight // 2)
        self.budget = ByteBudget(bytes_in_flight, small_reserve=reserve)
        self.grace_s = grace_s
        self.min_rate = min_rate

    def _limit(self, path: str) -> int:
        for prefix, limit in self._path_limits:
            if path == prefix or path.startswith(prefix + "/"):
                return limit
        return self._max

    async def refuse(self, send: Send, status: int, limit: int | None = None) -> None:
        """413 for a body over ``limit``, 503 (busy, Retry-After) or 408 (too slow)."""
        if status == 413 and limit is not None:
            body = _too_large_body(limit)
        elif status == 408:
            body = _slow_body(self.grace_s, self.min_rate)
        else:
            body = _busy_body()
        headers = _refusal_headers(body, retry=status == 503)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        limit = self._limit(str(scope.get("path", "")))
        declared = _declared_length(scope)
        if declared is not None and not 0 <= declared <= limit:
            await self.refuse(send, 413, limit)
            return
        caller = body_caller(scope)
        large = (declared or 0) > MAX_REQUEST_BYTES
        if declared and not self.budget.take(caller, declared, large=large):
            await self.refuse(send, 503)
            return
        state = _BodyState(self, caller, limit, declared)
        try:
            await self._app(scope, state.receiver(receive, send), state.sender(send))
        finally:
            self.budget.give(caller, state.reserved)


class _BodyState:
    """One request's counted body: bytes received and reserved, its pace, whether refused."""

    def __init__(self, owner: RequestBodyLimit, caller: str, limit: int, declared: int | None):
        self.owner = owner
        self.caller = caller
        self.limit = limit
        self.reserved = declared or 0
        self.streamed = declared is None
        self.received = 0
        self.complete = declared == 0
        self.refused = False
        self.started = asyncio.get_running_loop().time()

    def _deadline(self) -> float:
        """When the body is overdue: the grace, plus one second per ``min_rate`` bytes in."""
        owner = self.owner
        return self.started + owner.grace_s + self.received / owner.min_rate

    async def _next(self, receive: Receive) -> Message | None:
        """The next message; None when the body fell below the minimum rate."""
        if self.complete:
            return await receive()
        try:
            async with asyncio.timeout_at(self._deadline()):
                message = await receive()
        except TimeoutError:
            return None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.complete = True
        return message

    def _check(self, size: int) -> int:
        """0 when ``size`` more bytes are fine, else the refusal's status (413 or 503)."""
        self.received += size
        if self.received > self.limit:
            return 413
        if self.streamed and size:
            large = self.reserved + size > MAX_REQUEST_BYTES
            if not self.owner.budget.take(self.caller, size, large=large):
                return 503
            self.reserved += size
        return 0

    def receiver(self, receive: Receive, send: Send) -> Receive:
        async def counted_receive() -> Message:
            if self.refused:
                return {"type": "http.disconnect"}
            message = await self._next(receive)
            if message is not None and message["type"] != "http.request":
                return message
            status = 408 if message is None else self._check(len(message.get("body", b"")))
            if status == 0 and message is not None:
                return message
            # Answer now; the app then sees a disconnect and its own (late) response is
            # dropped by the sender below.
            self.refused = True
            await self.owner.refuse(send, status, self.limit)
            return {"type": "http.disconnect"}

        return counted_receive

    def sender(self, send: Send) -> Send:
        async def guarded_send(message: Message) -> None:
            if not self.refused:
                await send(message)

        return guarded_send
