"""A lean keep-alive HTTP/1.1 client for the job queue's scoring requests.

A scoring job sends thousands of small prompt-logprobs requests to one
teacher.  Through httpx each costs the registry 1.2-1.9 ms of CPU, more than
parsing and verifying the answer, and on a shared host that CPU is taken from
the teacher (``bench/RESULTS.md``, job queue).  ``TeacherWire`` frames the
same exchange with h11 (the HTTP/1.1 state machine under httpx) over asyncio
streams and keeps idle connections to the one origin: about 0.4 ms.  h11 reads
each response head (up to its blank line, never a body byte); a body framed by
Content-Length alone is then read straight from the stream, which h11 would
copy twice more, and a kept-alive connection starts a fresh h11 cycle; chunked
bodies go through h11.

Deliberately narrow: POST only, one origin (``http``, or ``https`` verified
with the caller's ``ssl.SSLContext`` from ``teacher_tls_context``), no
proxies, no redirects followed, no content codings, no HTTP/2.  It implements
``probe.transport.TeacherTransport``: the same request, head and body rules
as the probe client (``check_head``, ``body_cap``, the protocol's one overall
deadline in ``exchange``), and every failure below HTTP goes through
``transport_failure``.  The overall deadline always reads as a failure before
the head (``probe.unreachable``), as the lean client has always reported it.
A pooled connection the teacher has meanwhile closed is detected when it
answers nothing, and the request is sent once more on a fresh connection.
Messages never quote the teacher's bytes or the request headers (the bearer
value lives only in the bytes written to the socket).

Imports: standard library, h11 and ``probe.transport``/``probe.parse``; no
httpx of its own, no database or FastAPI.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import h11

from kiln_registry.domain.limits import MAX_RESPONSE_HEAD_BYTES
from kiln_registry.probe.parse import fail
from kiln_registry.probe.transport import (
    Request,
    TeacherTransport,
    body_cap,
    check_head,
    refuse_oversized,
    transport_failure,
)

# One read takes what the socket has, up to this; also the stream's buffer limit (it
# pauses reading at twice this).  At 64 KiB a 0.73 MB answer (one 511-token prompt at
# K=20) took a dozen pause/read/parse rounds: the teacher endpoint spent more time
# framing than checking it (bench/bench_endpoint.py, 2026-12-05: 0.936x -> 0.946x).
READ_BYTES: Final = 1024 * 1024
MAX_INTERIM_RESPONSES: Final = 4


class _NoAnswer(Exception):
    """The connection ended (or was reset) before any byte of a response head."""


@dataclass(frozen=True, slots=True)
class _Origin:
    scheme: str
    host: str
    port: int
    authority: str  # the Host header
    target: str  # path and query


def _origin(url: str) -> _Origin:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("TeacherWire needs an http or https URL with a host")
    if parts.username is not None or parts.password is not None or parts.fragment:
        raise ValueError("TeacherWire refuses URLs with user information or a fragment")
    if not parts.netloc.isascii():
        raise ValueError("TeacherWire needs an ASCII (IDNA-encoded) host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Origin(parts.scheme, parts.hostname, port, parts.netloc, target)


def _machine() -> h11.Connection:
    return h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_RESPONSE_HEAD_BYTES)


class _Connection:
    """One HTTP/1.1 connection and its h11 state; closed on any doubt."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = _machine()

    def close(self) -> None:
        # Nothing is in flight on a connection being dropped, so there is no TLS
        # close_notify to wait for: the socket closes on the loop's next turn.
        self.writer.transport.abort()

    async def send(self, request: bytes) -> None:
        self.writer.write(request)
        await self.writer.drain()

    async def event(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self._more())
                continue
            if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("the connection ended")
            assert isinstance(event, h11.Event)
            return event

    async def _more(self) -> bytes:
        """The next bytes for h11: a head up to its blank line (no body byte), else a read."""
        if self.h11.their_state is not h11.SEND_RESPONSE:
            return await self.reader.read(READ_BYTES)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial  # the stream ended: h11 sees these bytes, then the end
        except asyncio.LimitOverrunError:
            return await self.reader.read(READ_BYTES)  # h11 refuses a head this long
        if len(head) > MAX_RESPONSE_HEAD_BYTES:  # h11 bounds only a head it is still reading
            raise h11.RemoteProtocolError("the response head is too long", 431)
        return head

    async def sized_body(self, length: int, keep_alive: bool) -> bytes:
        """A Content-Length body read straight from the stream (h11 would copy it twice);
        a kept-alive connection then starts a fresh h11 cycle."""
        try:
            body = await self.reader.readexactly(length)
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the connection ended mid-body") from None
        self.h11 = _machine() if keep_alive else self.h11
        return body

    def reusable(self) -> bool:
        """Whether both sides finished the message and the connection may carry another."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return self.h11.our_state is h11.IDLE and self.h11.their_state is h11.IDLE


class TeacherWire(TeacherTransport):
    """Keep-alive POSTs to one teacher URL; ``async with`` closes the idle connections."""

    def __init__(
        self, url: str, *, tls: ssl.SSLContext | None, max_idle: int, report_timeouts: bool = False
    ) -> None:
        self._url = url
        # False (the job queue): the overall deadline always reads as probe.unreachable.
        # True (the teacher endpoint): once a head arrived it reads as probe.timeout, as
        # the httpx transport reports it.
        self._report_timeouts = report_timeouts
        self._origin = _origin(url)
        if self._origin.scheme == "https" and tls is None:
            raise ValueError("an https teacher needs a TLS context")
        self._tls = tls if self._origin.scheme == "https" else None
        self._max_idle = max(1, max_idle)
        self._idle: list[_Connection] = []

    @property
    def url(self) -> str:
        return self._url

    @property
    def origin(self) -> str:
        """``scheme://authority``, as messages name the teacher."""
        return f"{self._origin.scheme}://{self._origin.authority}"

    async def __aenter__(self) -> TeacherWire:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        await asyncio.sleep(0)  # let the transports finish closing their sockets

    async def send(self, request: Request) -> tuple[int, bytes]:
        """POST on a pooled or fresh connection (``TeacherTransport.send``).

        ``request.got_head`` is set once a head arrived only with ``report_timeouts``;
        otherwise the deadline reads as probe.unreachable.
        """
        head = [*request.headers.items(), ("content-length", str(len(request.content)))]
        marked = request if self._report_timeouts else None
        return await self._post(request.content, head, request.limit, marked)

    async def _post(
        self,
        content: bytes,
        head: Sequence[tuple[str, str]],
        limit: int,
        marked: Request | None,
    ) -> tuple[int, bytes]:
        while self._idle:
            conn = self._idle.pop()
            try:
                return await self._round_trip(conn, content, head, limit, marked, reused=True)
            except _NoAnswer:
                continue  # a kept-alive connection the teacher had closed: try the next
        conn = await self._connect()
        return await self._round_trip(conn, content, head, limit, marked, reused=False)

    async def _connect(self) -> _Connection:
        origin = self._origin
        try:
            reader, writer = await asyncio.open_connection(
                origin.host,
                origin.port,
                ssl=self._tls,
                server_hostname=origin.host if self._tls is not None else None,
                limit=READ_BYTES,
            )
        except (OSError, ssl.SSLError) as exc:  # an untrusted certificate among them
            raise transport_failure(
                exc, origin=self.origin, got_head=False, connecting=True
            ) from None
        return _Connection(reader, writer)

    def _request_bytes(
        self, conn: _Connection, content: bytes, head: Sequence[tuple[str, str]]
    ) -> bytes:
        headers = [("host", self._origin.authority), *head]
        try:
            request = conn.h11.send(h11.Request(method="POST", target=self._origin.target,
                                                headers=headers))  # fmt: skip
            return (
                request + conn.h11.send(h11.Data(data=content)) + conn.h11.send(h11.EndOfMessage())
            )
        except h11.LocalProtocolError as exc:
            raise transport_failure(exc, origin=self.origin, got_head=False) from None

    async def _round_trip(
        self,
        conn: _Connection,
        content: bytes,
        head: Sequence[tuple[str, str]],
        limit: int,
        marked: Request | None,
        *,
        reused: bool,
    ) -> tuple[int, bytes]:
        """One request on ``conn``; ``_NoAnswer`` when a ``reused`` one proves dead."""
        keep = got_head = False
        try:
            request = self._request_bytes(conn, content, head)
            try:
                await conn.send(request)
                response = await self._response_head(conn)
            except (ConnectionError, h11.RemoteProtocolError):
                if reused and not _got_bytes(conn):
                    raise _NoAnswer from None
                raise
            got_head = True
            if marked is not None:
                marked.got_head = True
            status = response.status_code
            check_head(
                status,
                _header(response, b"content-encoding"),
                _header(response, b"content-length"),
                limit,
            )
            body, complete = await self._body(conn, response, limit)
            keep = complete and conn.reusable()
            return status, body
        except (OSError, ssl.SSLError, h11.RemoteProtocolError) as exc:
            raise transport_failure(exc, origin=self.origin, got_head=got_head) from None
        finally:
            if keep and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            else:
                conn.close()

    async def _response_head(self, conn: _Connection) -> h11.Response:
        for _ in range(MAX_INTERIM_RESPONSES + 1):
            event = await conn.event()
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse):
                raise ConnectionResetError("no response head")
        fail("transport", f"teacher sent more than {MAX_INTERIM_RESPONSES} interim responses")

    async def _body(
        self, conn: _Connection, response: h11.Response, limit: int
    ) -> tuple[bytes, bool]:
        """The body up to ``body_cap``; (bytes, whether the message ended within the cap)."""
        status = response.status_code
        cap = body_cap(status, limit)
        length = _sized(response)
        if length is not None and length <= cap:
            return await conn.sized_body(length, _keep_alive(response)), True
        chunks: list[bytes] = []  # joined once at the end: one copy of the body
        size = 0
        while True:
            event = await conn.event()
            if isinstance(event, h11.EndOfMessage):
                return b"".join(chunks), True
            if not isinstance(event, h11.Data):
                raise ConnectionResetError("unexpected event in the body")
            if size + len(event.data) > cap:
                refuse_oversized(status, limit)
                chunks.append(event.data[: cap - size])
                return b"".join(chunks), False
            chunks.append(event.data)
            size += len(event.data)


def _sized(response: h11.Response) -> int | None:
    """The body's length where h11 frames it by Content-Length alone (a checked header),
    else None (chunked, until close, or no body)."""
    if response.status_code in (204, 304) or _header(response, b"transfer-encoding") is not None:
        return None
    declared = _header(response, b"content-length")
    return int(declared) if declared is not None else None


def _keep_alive(response: h11.Response) -> bool:
    """h11's own rule: HTTP/1.1 and no ``close`` token in Connection."""
    tokens = (_header(response, b"connection") or "").lower().replace(" ", "").split(",")
    return response.http_version >= b"1.1" and "close" not in tokens


def _header(response: h11.Response, name: bytes) -> str | None:
    """A header's values joined by ", " (h11 lowercases names), or None."""
    values = [value.decode("latin-1") for key, value in response.headers if key == name]
    return ", ".join(values) if values else None


def _got_bytes(conn: _Connection) -> bool:
    """Whether any response byte arrived (h11 buffers what it has not yet parsed)."""
    trailing, _closed = conn.h11.trailing_data
    return bool(trailing)
