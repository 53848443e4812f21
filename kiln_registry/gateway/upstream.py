"""The gateway's keep-alive HTTP/1.1 client to vLLM over its private Unix socket.

``UpstreamPool`` keeps idle connections (at most ``max_idle``) to the one
socket; ``Upstream`` frames one exchange with h11 (the upstream is vLLM, so a
full state machine is used, and h11 enforces its framing rules).  Each read
waits at most ``timeout`` seconds; a read that gets nothing from a reused
connection is reported as ``StaleConnection`` so the caller can send once
more on a fresh one.  Failures are ``UpstreamFailed`` with a short reason
that never quotes upstream bytes.

Imports: standard library and h11 only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import h11

READ_BYTES = 64 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_INTERIM = 4
CONNECT_TIMEOUT = 5.0


class UpstreamFailed(Exception):
    """The upstream could not be reached, or its answer broke off or came too slowly."""

    def __init__(self, reason: str, *, timeout: bool = False) -> None:
        super().__init__(reason)
        self.timeout = timeout


class StaleConnection(UpstreamFailed):
    """A reused connection answered nothing (the upstream had closed it)."""


class Upstream:
    """One connection to the upstream socket."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, reused: bool
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = reused
        self.received = False
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)

    async def send(
        self, method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> None:
        parts = [self.h11.send(h11.Request(method=method, target=target, headers=list(headers)))]
        if body:
            parts.append(self.h11.send(h11.Data(data=body)))
        parts.append(self.h11.send(h11.EndOfMessage()))
        data = b"".join(part or b"" for part in parts)
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError:
            raise self._lost("the upstream connection failed while sending") from None

    async def head(self, timeout: float) -> h11.Response:
        """The final response head (interim 1xx answers are skipped, at most 4)."""
        for _ in range(MAX_INTERIM + 1):
            event = await self.next_event(timeout)
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse):
                raise UpstreamFailed("the upstream answered without a response head")
        raise UpstreamFailed("the upstream sent too many interim responses")

    async def next_event(self, timeout: float) -> object:
        """The next h11 event, reading as needed; each read waits at most ``timeout``."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError:
                raise UpstreamFailed("the upstream broke the HTTP/1.1 framing") from None
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.ConnectionClosed):
                    raise self._lost("the upstream closed the connection mid-answer")
                return event
            try:
                data = await asyncio.wait_for(self.reader.read(READ_BYTES), timeout)
            except TimeoutError:
                raise UpstreamFailed("the upstream did not answer in time", timeout=True) from None
            except OSError:
                raise self._lost("the upstream connection failed") from None
            if data:
                self.received = True
            self.h11.receive_data(data)

    def reusable(self) -> bool:
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    def _lost(self, reason: str) -> UpstreamFailed:
        if self.reused and not self.received:
            return StaleConnection(reason)
        return UpstreamFailed(reason)


class UpstreamPool:
    """Idle connections to one Unix socket, reused in LIFO order."""

    def __init__(self, path: str, *, max_idle: int = 64) -> None:
        self.path = path
        self.max_idle = max_idle
        self.idle: list[Upstream] = []

    async def acquire(self, *, fresh: bool = False) -> Upstream:
        while self.idle and not fresh:
            conn = self.idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                conn.reused, conn.received = True, False
                return conn
            conn.close()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.path, limit=READ_BYTES), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            raise UpstreamFailed("the upstream socket does not accept connections") from None
        return Upstream(reader, writer, reused=False)

    def release(self, conn: Upstream) -> None:
        """Keep ``conn`` for the next request when its exchange ended cleanly."""
        if conn.reusable() and len(self.idle) < self.max_idle:
            conn.h11.start_next_cycle()
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()
