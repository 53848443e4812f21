"""The gateway's keep-alive HTTP/1.1 client to vLLM over its private Unix socket.

``UpstreamPool`` keeps idle connections (at most ``max_idle``) to the one
socket; an ``UpstreamConnection`` is an ``asyncio.Protocol`` that runs one
exchange at a time for a ``Sink`` (the forwarding side).  It sits on the
hot path of every scoring request and moves bodies of hundreds of
kilobytes, so it is callback-driven: the request goes out in one
``writelines``, the answer's head is parsed strictly
(``response.parse_response_head``), and the body bytes each read
returns are handed to the sink as they are, without a stream buffer, a task
or a copy in between.  Bytes past a declared Content-Length are dropped and
the connection is not reused.  A chunked answer is handed on chunk by chunk
(a chunk is buffered whole, after its size was checked against the bound).

The answer's body is bounded by the ``cap`` the sink returns for its head:
more is an ``OverBound`` failure.  Each wait for upstream bytes lasts at most
``timeout`` seconds (one timer per connection, re-armed lazily).  A reused
connection that ends before it answers anything fails as ``StaleConnection``
so the caller can send once more on a fresh one.  Failures carry a short
reason that never quotes upstream bytes.

Imports: standard library and ``gateway.response`` (the answer's head and the failures).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Protocol, cast

from kiln_registry.domain.limits import MAX_RESPONSE_HEAD_BYTES
from kiln_registry.gateway.response import (
    OverBound,
    ResponseHead,
    StaleConnection,
    UpstreamFailed,
    parse_response_head,
)

__all__ = [
    "OverBound",
    "ResponseHead",
    "Sink",
    "StaleConnection",
    "UpstreamConnection",
    "UpstreamFailed",
    "UpstreamPool",
]

MAX_INTERIM = 4
MAX_CHUNK_LINE = 1024
MAX_TRAILER_LINES = 64
CONNECT_TIMEOUT = 5.0
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})(;[\x20-\x7e\t]*)?\r\n")
# Exchange states.
IDLE, HEAD, LENGTH, UNTIL_CLOSE, CHUNK_SIZE, CHUNK_DATA, TRAILER, CLOSED = range(8)


class Sink(Protocol):
    """Where one exchange's answer goes (``forward.Forward``)."""

    def on_head(self, head: ResponseHead) -> int | None:
        """The body's bound, or None when the sink gave up on the exchange (it closed it)."""

    def on_body(self, data: bytes | memoryview) -> None:
        """Body bytes (one whole chunk's payload for a chunked answer)."""

    def on_end(self) -> None:
        """The body is complete; the connection is idle again."""

    def on_fail(self, failure: UpstreamFailed) -> None:
        """The exchange failed; the connection is closed."""


class UpstreamConnection(asyncio.Protocol):
    """One connection to the upstream socket; at most one exchange at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.state = IDLE
        self.buffer = bytearray()
        self.reused = False
        self.received = False
        self.keep = False
        self.timeout = 0.0
        self.last = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.remaining = 0  # LENGTH: body bytes still due; CHUNK_DATA: payload plus CRLF
        self.left = 0  # bytes the bound still allows
        self.lines = 0  # interim answers, then trailer lines
        self.paused = False

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if self.state in (IDLE, CLOSED):
            self._close()  # bytes nobody asked for: never reused
            return
        self.received = True
        self.last = self.loop.time()
        try:
            self._feed(data)
        except UpstreamFailed as failure:
            self._fail(failure)

    def eof_received(self) -> bool:
        if self.state == UNTIL_CLOSE:
            self.keep = False
            self._end()
        self._lost()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    # -- one exchange -----------------------------------------------------------------

    def send(self, request: Sequence[bytes], sink: Sink, timeout: float) -> None:
        """Write ``request`` and deliver its answer to ``sink``."""
        assert self.transport is not None and self.state == IDLE
        self.sink, self.state, self.received, self.lines = sink, HEAD, False, 0
        self.timeout, self.last = timeout, self.loop.time()
        if self.timer is None:  # one timer, re-armed lazily when it fires
            self.timer = self.loop.call_at(self.last + timeout, self._check_timer)
        self.transport.writelines(request)

    def abort(self) -> None:
        """Give up on the exchange (the client went away or refused the answer)."""
        self.sink = None
        self._close()

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading while the client cannot take more."""
        if self.transport is None or self.state == CLOSED or paused == self.paused:
            return
        self.paused = paused
        if paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def _feed(self, data: bytes | memoryview) -> None:
        if self.state == LENGTH:
            self._length(data)  # the hot path: body bytes straight to the sink
            return
        while self.state == HEAD:
            rest = self._head(data)
            if rest is None:
                return
            data = rest
        if self.state == LENGTH:
            self._length(data)
        elif self.state == UNTIL_CLOSE:
            self._counted(data)
        elif self.state != IDLE:
            self.buffer += data
            while self.sink is not None and self._chunked(self.state):
                pass

    def _head(self, data: bytes | memoryview) -> memoryview | None:
        """Parse one head; the bytes after it, or None when more are needed or it ended."""
        raw = bytes(self.buffer + data) if self.buffer else bytes(data)
        end = raw.find(b"\r\n\r\n", 0, MAX_RESPONSE_HEAD_BYTES)
        if end < 0:
            if len(raw) >= MAX_RESPONSE_HEAD_BYTES:
                raise UpstreamFailed("the upstream sent an over-long head or line")
            self.buffer = bytearray(raw)
            return None
        self.buffer = bytearray()
        head = parse_response_head(raw[: end + 4])
        rest = memoryview(raw)[end + 4 :]
        if head.status < 200:
            self.lines += 1
            if self.lines > MAX_INTERIM:
                raise UpstreamFailed("the upstream sent too many interim responses")
            return rest
        assert self.sink is not None
        self.keep = not head.close and (head.chunked or head.content_length is not None)
        cap = self.sink.on_head(head)
        if cap is None:
            return None
        self.left, self.lines = cap, 0
        if head.chunked:
            self.state = CHUNK_SIZE
        elif head.content_length is None:
            self.state = UNTIL_CLOSE
        else:
            self.state, self.remaining = LENGTH, head.content_length
        if self.state == LENGTH and not self.remaining:
            self.keep = self.keep and not rest
            self._end()
            return None
        return rest

    def _length(self, data: bytes | memoryview) -> None:
        if len(data) >= self.remaining:
            if len(data) > self.remaining:
                self.keep = False  # bytes past the declared length: never reused
                data = data[: self.remaining]
            self.remaining = 0
            self._counted(data)
            if self.sink is not None:
                self._end()
            return
        self.remaining -= len(data)
        self._counted(data)

    def _counted(self, data: bytes | memoryview) -> None:
        self.left -= len(data)
        if self.left < 0:
            raise OverBound("the upstream answer exceeds its bound")
        if data:
            assert self.sink is not None
            self.sink.on_body(data)

    def _chunked(self, state: int) -> bool:
        """Advance the chunked framing; False when more bytes are needed."""
        if state == CHUNK_DATA:
            if len(self.buffer) < self.remaining:
                return False
            payload = bytes(self.buffer[: self.remaining - 2])
            if self.buffer[self.remaining - 2 : self.remaining] != b"\r\n":
                raise UpstreamFailed("the upstream broke the chunked framing")
            del self.buffer[: self.remaining]
            self.state = CHUNK_SIZE
            self._counted(payload)
            return True
        line = self._line()
        if line is None:
            return False
        if state == TRAILER:
            self.lines += 1
            if line == b"\r\n":
                self._end()
            elif self.lines >= MAX_TRAILER_LINES:
                raise UpstreamFailed("the upstream sent too many trailer lines")
            return True
        match = _CHUNK_SIZE.fullmatch(line)
        if match is None:
            raise UpstreamFailed("the upstream broke the chunked framing")
        size = int(match[1], 16)
        if size > self.left:
            raise OverBound("the upstream answer exceeds its bound")
        self.state, self.remaining = (CHUNK_DATA, size + 2) if size else (TRAILER, 0)
        return True

    def _line(self) -> bytes | None:
        end = self.buffer.find(b"\r\n", 0, MAX_CHUNK_LINE)
        if end < 0:
            if len(self.buffer) >= MAX_CHUNK_LINE:
                raise UpstreamFailed("the upstream sent an over-long head or line")
            return None
        line = bytes(self.buffer[: end + 2])
        del self.buffer[: end + 2]
        return line

    def _end(self) -> None:
        sink, self.sink, self.state = self.sink, None, IDLE
        self.pause(False)  # an idle connection reads, so the upstream's close is seen
        if self.buffer:
            self.keep = False  # bytes past the answer: never reused
        assert sink is not None
        sink.on_end()

    def _fail(self, failure: UpstreamFailed) -> None:
        sink, self.sink = self.sink, None
        self._close()
        if sink is not None:
            sink.on_fail(failure)

    def _lost(self) -> None:
        if self.state == CLOSED:
            return
        if self.sink is None:
            self._close()
            return
        reason = "the upstream closed the connection mid-answer"
        stale = self.reused and not self.received
        self._fail(StaleConnection(reason) if stale else UpstreamFailed(reason))

    def _check_timer(self) -> None:
        self.timer = None
        if self.sink is None:
            return
        due = self.last + self.timeout
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._check_timer)
            return
        self._fail(UpstreamFailed("the upstream did not answer in time", timeout=True))

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _close(self) -> None:
        self.state = CLOSED
        self._cancel_timer()
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()

    def reusable(self) -> bool:
        return self.state == IDLE and self.keep and not self.buffer


class UpstreamPool:
    """Idle connections to one Unix socket, reused in LIFO order."""

    def __init__(self, path: str, *, max_idle: int = 64) -> None:
        self.path = path
        self.max_idle = max_idle
        self.idle: list[UpstreamConnection] = []

    def take(self) -> UpstreamConnection | None:
        """An idle connection the upstream has not closed, or None."""
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable():
                conn.reused = True
                return conn
            conn.abort()
        return None

    async def connect(self) -> UpstreamConnection:
        """A fresh connection (``UpstreamFailed`` when the socket does not accept one)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, conn = await loop.create_unix_connection(
                    lambda: UpstreamConnection(self), self.path
                )
        except (OSError, TimeoutError):
            raise UpstreamFailed("the upstream socket does not accept connections") from None
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """Keep ``conn`` for the next request when its exchange ended cleanly."""
        if conn.reusable() and len(self.idle) < self.max_idle:
            self.idle.append(conn)
        else:
            conn.abort()

    def forget(self, conn: UpstreamConnection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        while self.idle:
            self.idle.pop().abort()
