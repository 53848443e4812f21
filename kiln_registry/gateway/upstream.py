"""The gateway's keep-alive HTTP/1.1 client to vLLM over its private Unix socket.

``UpstreamPool`` keeps idle connections (at most ``max_idle``) to the one
socket; ``Upstream`` runs one exchange.  The client is hand-framed rather
than a general state machine because it sits on the hot path of every
scoring request and moves bodies of hundreds of kilobytes: the request is
written in one call, the answer's head is parsed strictly (status line,
token header names, visible-ASCII values, one ``Content-Length`` or
``Transfer-Encoding: chunked``, never both), and body bytes are handed on
as each ``recv`` returns them, without a stream buffer in between.  Bytes
past a declared Content-Length are dropped and the connection is not reused.

Each read waits at most ``timeout`` seconds.  A reused connection that
answers nothing is reported as ``StaleConnection`` so the caller can send
once more on a fresh one.  Failures are ``UpstreamFailed`` with a short
reason that never quotes upstream bytes.

Imports: standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

READ_BYTES = 64 * 1024  # below malloc's mmap threshold: no mmap/munmap per read
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 128
MAX_INTERIM = 4
MAX_CHUNK_LINE = 1024
MAX_TRAILER_LINES = 64
CONNECT_TIMEOUT = 5.0
_STATUS_LINE = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) ([\x20-\x7e\t]*)")
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}):[ \t]*([\x20-\x7e\t]*?)[ \t]*")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})(;[\x20-\x7e\t]*)?\r\n")
_DIGITS = re.compile(rb"[0-9]{1,12}")


class UpstreamFailed(Exception):
    """The upstream could not be reached, or its answer broke off or came too slowly."""

    def __init__(self, reason: str, *, timeout: bool = False) -> None:
        super().__init__(reason)
        self.timeout = timeout


class StaleConnection(UpstreamFailed):
    """A reused connection answered nothing (the upstream had closed it)."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A final response head: header names keep the upstream's spelling."""

    status: int
    reason: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    content_length: int | None  # None: chunked, or delimited by the connection's close
    chunked: bool
    close: bool


class Upstream:
    """One connection to the upstream socket (a non-blocking socket read with ``sock_recv``,
    so body bytes go from one ``recv`` to the client's ``send`` without another copy)."""

    def __init__(self, sock: socket.socket, *, reused: bool) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.buffer = b""
        self.reused = reused
        self.received = False
        self.finished = False
        self.keep = False

    async def send(
        self, method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> None:
        lines = [method + b" " + target + b" HTTP/1.1"]
        lines += [name + b": " + value for name, value in headers]
        try:
            await self.loop.sock_sendall(self.sock, b"\r\n".join(lines) + b"\r\n\r\n" + body)
        except OSError:
            raise self._lost("the upstream connection failed while sending") from None

    async def head(self, timeout: float) -> ResponseHead:
        """The final response head (interim 1xx answers are skipped, at most 4)."""
        for _ in range(MAX_INTERIM + 1):
            raw = await self._until(b"\r\n\r\n", MAX_HEAD_BYTES, timeout)
            head = _parse_head(raw)
            if head.status >= 200:
                self.keep = not head.close and (head.chunked or head.content_length is not None)
                return head
        raise UpstreamFailed("the upstream sent too many interim responses")

    async def body(self, head: ResponseHead, timeout: float) -> AsyncIterator[bytes]:
        """The body's bytes as read (chunk payloads for a chunked answer)."""
        if head.chunked:
            async for data in self._chunks(timeout):
                yield data
        else:
            remaining = head.content_length
            while remaining is None or remaining > 0:
                data = self._take(remaining) or await self._recv(timeout)
                if not data:
                    if remaining is None:
                        break
                    raise self._lost("the upstream closed the connection mid-answer")
                if remaining is not None and len(data) > remaining:
                    self.keep = False  # bytes past the declared length: never reused
                    data = data[:remaining]
                remaining = None if remaining is None else remaining - len(data)
                yield data
        self.finished = True

    async def _chunks(self, timeout: float) -> AsyncIterator[bytes]:
        while True:
            line = await self._until(b"\r\n", MAX_CHUNK_LINE, timeout)
            match = _CHUNK_SIZE.fullmatch(line)
            if match is None:
                raise UpstreamFailed("the upstream broke the chunked framing")
            size = int(match[1], 16)
            if size == 0:
                break
            data = await self._exactly(size + 2, timeout)
            if data[-2:] != b"\r\n":
                raise UpstreamFailed("the upstream broke the chunked framing")
            yield data[:-2]
        for _ in range(MAX_TRAILER_LINES):
            if await self._until(b"\r\n", MAX_CHUNK_LINE, timeout) == b"\r\n":
                return
        raise UpstreamFailed("the upstream sent too many trailer lines")

    def _take(self, limit: int | None) -> bytes:
        """Buffered bytes (at most ``limit``), removed from the buffer."""
        if limit is None or len(self.buffer) <= limit:
            data, self.buffer = self.buffer, b""
        else:
            data, self.buffer = self.buffer[:limit], self.buffer[limit:]
        return data

    async def _until(self, marker: bytes, limit: int, timeout: float) -> bytes:
        """Bytes up to and including ``marker`` (at most ``limit`` of them)."""
        while (end := self.buffer.find(marker)) < 0:
            if len(self.buffer) > limit:
                raise UpstreamFailed("the upstream sent an over-long head or line")
            data = await self._recv(timeout)
            if not data:
                raise self._lost("the upstream closed the connection mid-answer")
            self.buffer += data
        if end + len(marker) > limit:
            raise UpstreamFailed("the upstream sent an over-long head or line")
        return self._take(end + len(marker))

    async def _exactly(self, size: int, timeout: float) -> bytes:
        while len(self.buffer) < size:
            data = await self._recv(timeout)
            if not data:
                raise self._lost("the upstream closed the connection mid-answer")
            self.buffer += data
        return self._take(size)

    async def _recv(self, timeout: float) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                data = await self.loop.sock_recv(self.sock, READ_BYTES)
        except TimeoutError:
            raise UpstreamFailed("the upstream did not answer in time", timeout=True) from None
        except OSError:
            raise self._lost("the upstream connection failed") from None
        if data:
            self.received = True
        return data

    def usable(self) -> bool:
        """An idle connection the upstream has not closed and sent nothing on."""
        if self.buffer:
            return False
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True  # nothing readable: still open and quiet
        except OSError:
            return False
        return False  # end of stream, or bytes nobody asked for

    def reusable(self) -> bool:
        return self.finished and self.keep and not self.buffer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _lost(self, reason: str) -> UpstreamFailed:
        if self.reused and not self.received:
            return StaleConnection(reason)
        return UpstreamFailed(reason)


def _parse_head(raw: bytes) -> ResponseHead:
    if len(raw) > MAX_HEAD_BYTES:
        raise UpstreamFailed("the upstream's response head is too large")
    lines = raw[:-4].split(b"\r\n")
    status = _STATUS_LINE.fullmatch(lines[0])
    if status is None or len(lines) - 1 > MAX_HEADERS:
        raise UpstreamFailed("the upstream sent a malformed response head")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            raise UpstreamFailed("the upstream sent a malformed header line")
        headers.append((match[1], match[2]))
    return _framed(int(status[1]), status[2], tuple(headers))


def _framed(status: int, reason: bytes, headers: tuple[tuple[bytes, bytes], ...]) -> ResponseHead:
    lengths = [v for n, v in headers if n.lower() == b"content-length"]
    codings = [v.strip().lower() for n, v in headers if n.lower() == b"transfer-encoding"]
    connection = b",".join(v for n, v in headers if n.lower() == b"connection").lower()
    if len(lengths) > 1 or (lengths and codings) or codings not in ([], [b"chunked"]):
        raise UpstreamFailed("the upstream's answer has ambiguous framing")
    if lengths and _DIGITS.fullmatch(lengths[0]) is None:
        raise UpstreamFailed("the upstream sent a malformed Content-Length")
    bodiless = status < 200 or status in (204, 304)
    length = 0 if bodiless else (int(lengths[0]) if lengths else None)
    close = b"close" in (token.strip() for token in connection.split(b","))
    return ResponseHead(status, reason, headers, length, bool(codings) and not bodiless, close)


class UpstreamPool:
    """Idle connections to one Unix socket, reused in LIFO order."""

    def __init__(self, path: str, *, max_idle: int = 64) -> None:
        self.path = path
        self.max_idle = max_idle
        self.idle: list[Upstream] = []

    async def acquire(self, *, fresh: bool = False) -> Upstream:
        while self.idle and not fresh:
            conn = self.idle.pop()
            if conn.usable():
                conn.reused, conn.received, conn.finished = True, False, False
                return conn
            conn.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await asyncio.get_running_loop().sock_connect(sock, self.path)
        except (OSError, TimeoutError):
            sock.close()
            raise UpstreamFailed("the upstream socket does not accept connections") from None
        return Upstream(sock, reused=False)

    def release(self, conn: Upstream) -> None:
        """Keep ``conn`` for the next request when its exchange ended cleanly."""
        if conn.reusable() and len(self.idle) < self.max_idle:
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()
