"""One admitted request relayed to the upstream, and its answer to the client.

``Forward`` is the ``upstream.Sink`` of one exchange.  It takes a pooled
upstream connection (or opens one), sends the request (one retry on a fresh
connection when a pooled one turns out stale), and relays the answer: the
status, reason and end-to-end headers in order (hop-by-hop ones dropped,
framing rewritten), then the body bytes as each read returned them.  A
Content-Length answer keeps its length; any other answer is re-framed chunk
for chunk (``%x CRLF payload CRLF``, ending with ``0 CRLF CRLF``).

Nothing reaches the client before ``FLUSH_BYTES`` of a Content-Length
answer (or all of it) or the first chunk of a chunked one, so an upstream
that fails early is answered with a clean 502/504 instead of a broken body.
Bounds: a declared length over the response bound is a 502 before anything
is written; a body that passes the bound, breaks off or stalls after bytes
were written ends the client connection without the rest (an incomplete
body, never a silently cut one).

Imports: standard library and sibling gateway modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from kiln_registry.gateway.admission import response_cap
from kiln_registry.gateway.http1 import RequestHead, response_head
from kiln_registry.gateway.refusals import Refusal
from kiln_registry.gateway.upstream import (
    OverBound,
    ResponseHead,
    StaleConnection,
    UpstreamConnection,
    UpstreamFailed,
    UpstreamPool,
)


class _Counts(Protocol):
    in_flight: int


class ClientSide(Protocol):
    """What a relay needs of the client connection (``gateway.server.ClientConnection``)."""

    @property
    def gateway(self) -> _Counts: ...
    def must_close(self) -> bool: ...
    def write(self, data: list[bytes | memoryview]) -> None: ...
    def finished(self, tail: list[bytes | memoryview], *, keep: bool) -> None: ...
    def refuse(self, refusal: Refusal) -> None: ...
    def cut(self) -> None: ...


FLUSH_BYTES = 64 * 1024
_FORWARDED = (b"content-type", b"accept")


def upstream_request(head: RequestHead, body: bytes) -> list[bytes]:
    """The request as sent upstream: only an allowlist of headers, then the body as received."""
    lines = [head.method, b" ", head.target, b" HTTP/1.1\r\nhost: localhost\r\n"]
    lines.append(b"accept-encoding: identity\r\n")
    for name in _FORWARDED:
        value = head.single(name)
        if value is not None:
            lines += [name, b": ", value, b"\r\n"]
    if head.method == b"POST":
        lines.append(b"content-length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    return [b"".join(lines), body] if body else [b"".join(lines)]


class Forward:
    """One exchange from the client's request to the end of the upstream's answer."""

    def __init__(
        self,
        client: ClientSide,
        pool: UpstreamPool,
        request: list[bytes],
        limit: int | None,
        timeout: float,
    ) -> None:
        self.client = client
        self.pool = pool
        self.request = request
        self.limit = limit
        self.timeout = timeout
        self.conn: UpstreamConnection | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.retried = False
        self.done = False
        self.paused = False
        self.first = b""  # the client's response head, once the upstream's arrived
        self.cap = 0
        self.close = False
        self.chunked = False
        self.written = False
        self.held: list[bytes | memoryview] = []
        self.held_bytes = 0

    def start(self, *, fresh: bool = False) -> None:
        conn = None if fresh else self.pool.take()
        if conn is None:
            self.connecting = asyncio.get_running_loop().create_task(self._connect())
        else:
            self._send(conn)

    async def _connect(self) -> None:
        try:
            conn = await self.pool.connect()
        except UpstreamFailed as failure:
            self.connecting = None
            self._refuse(Refusal(502, str(failure), close=False))
            return
        self.connecting = None
        if self.done:
            conn.abort()
            return
        self._send(conn)

    def _send(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        conn.send(self.request, self, self.timeout)
        if self.paused:
            conn.pause(True)

    # -- upstream.Sink ------------------------------------------------------------------

    def on_head(self, head: ResponseHead) -> int | None:
        cap = response_cap(head.status, self.limit)
        declared = head.content_length
        if declared is not None and declared > cap:
            self._drop_conn()
            message = f"the upstream answer exceeds the bound of {cap} bytes"
            self._refuse(Refusal(502, message, close=False))
            return None
        self.cap, self.close, self.chunked = cap, self.client.must_close(), declared is None
        framing = [b"content-length: %d" % declared] if declared is not None else []
        framing += [b"transfer-encoding: chunked"] if declared is None else []
        framing += [b"connection: close"] if self.close else []
        self.first = response_head(head.status, head.reason, head.headers, framing)
        return cap

    def on_body(self, data: bytes | memoryview) -> None:
        write = self.client.write
        if self.chunked:
            out = [b"%x\r\n" % len(data), data, b"\r\n"]
            write([self.first, *out] if not self.written else out)
            self.written = True
        elif self.written:
            write([data])
        else:
            self.held.append(data)
            self.held_bytes += len(data)
            if self.held_bytes >= FLUSH_BYTES:
                write([self.first, *self.held])
                self.held, self.written = [], True

    def on_end(self) -> None:
        out: list[bytes | memoryview] = [] if self.written else [self.first, *self.held]
        out += [b"0\r\n\r\n"] if self.chunked else []
        self.held = []
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.release(conn)
        self._finish(lambda: self.client.finished(out, keep=not self.close))

    def on_fail(self, failure: UpstreamFailed) -> None:
        self.conn = None
        if self.done:
            return
        if isinstance(failure, StaleConnection) and not self.retried:
            self.retried = True
            self.start(fresh=True)
            return
        if self.written:
            self._finish(self.client.cut)
            return
        message = str(failure)
        if isinstance(failure, OverBound):
            message = f"the upstream answer exceeds the bound of {self.cap} bytes"
        status = 504 if failure.timeout else 502
        self._refuse(Refusal(status, message, close=bool(self.first)))

    # -- the client side -----------------------------------------------------------------

    def pause(self, paused: bool) -> None:
        """The client's transport is full (or drained again): stop (or resume) reading."""
        self.paused = paused
        if self.conn is not None:
            self.conn.pause(paused)

    def cancel(self) -> None:
        """The client went away: give up on the exchange."""
        if self.connecting is not None:
            self.connecting.cancel()
            self.connecting = None
        self._drop_conn()
        self._finish(lambda: None)

    def _drop_conn(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()

    def _refuse(self, refusal: Refusal) -> None:
        self._finish(lambda: self.client.refuse(refusal))

    def _finish(self, then: Callable[[], None]) -> None:
        if self.done:
            return
        self.done = True
        self.client.gateway.in_flight -= 1
        then()
