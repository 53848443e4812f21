"""The gateway server: accept, admit, forward to the Unix socket, drain.

``Gateway`` listens with ``asyncio.start_server`` on the configured host and
port.  Per connection: read one head (``http1.parse_head``), route it,
check credentials, frame and read the body under its bound, admit a
completion body, then forward the exchange over the upstream pool.  Only an
allowlist of request headers is forwarded (``content-type``, ``accept``,
plus the gateway's own ``host``, ``content-length`` and
``accept-encoding: identity``), so client credentials, hop-by-hop and
request-id headers never reach vLLM.  The answer's status, reason and
end-to-end headers are copied in order (hop-by-hop ones dropped, framing
rewritten) and the body bytes are relayed as received: a Content-Length
answer keeps its length, any other answer is relayed chunk for chunk.

Bounds: an answer whose Content-Length exceeds its bound is replaced by a
502 before anything is written; a streamed answer that passes it mid-way
ends the client connection without a terminating chunk (an incomplete body,
never a silently cut one), as does an upstream that breaks off mid-body.
An upstream that does not answer within ``upstream_timeout`` is a 504.

Drain (``Gateway.drain``): stop listening, close idle connections, let
requests in flight finish (their answers say ``connection: close``) until
the deadline, then abort what remains.

Imports: standard library and sibling gateway modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from kiln_registry.gateway.admission import (
    COMPLETIONS,
    HEALTH,
    admit_completion,
    check_credentials,
    response_cap,
    route,
)
from kiln_registry.gateway.config import GatewayConfig
from kiln_registry.gateway.http1 import (
    MAX_HEAD_BYTES,
    RequestHead,
    body_length,
    parse_head,
    refusal_bytes,
    response_head,
)
from kiln_registry.gateway.refusals import Refusal
from kiln_registry.gateway.upstream import (
    ResponseHead,
    StaleConnection,
    Upstream,
    UpstreamFailed,
    UpstreamPool,
)

FLUSH_BYTES = 64 * 1024
DRAIN_POLL_SECONDS = 0.02
_FORWARDED = (b"content-type", b"accept")


class Gateway:
    """One gateway: ``await start()``, then ``await drain()`` to stop."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.pool = UpstreamPool(config.upstream_uds, max_idle=config.max_concurrent)
        self.server: asyncio.Server | None = None
        self.port = config.port
        self.draining = False
        self.in_flight = 0
        self.connections: dict[asyncio.Task[None], bool] = {}  # task -> busy

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self._connection, self.config.host, self.config.port, limit=MAX_HEAD_BYTES
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def drain(self, seconds: float | None = None) -> None:
        """Stop accepting, finish in-flight requests until the deadline, abort the rest."""
        self.draining = True
        if self.server is not None:
            self.server.close()
        deadline = time.monotonic() + (self.config.drain_seconds if seconds is None else seconds)
        for task, busy in list(self.connections.items()):
            if not busy:
                task.cancel()
        while any(self.connections.values()) and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        tasks = list(self.connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.pool.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self.draining or len(self.connections) >= self.config.max_connections:
            writer.write(refusal_bytes(Refusal(503, "the gateway is not accepting connections")))
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        self.connections[task] = False
        try:
            while await self._serve_one(reader, writer, task):
                pass
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.connections.pop(task, None)
            writer.close()

    async def _serve_one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, task: asyncio.Task[None]
    ) -> bool:
        """Serve one request; True when the connection stays open for another."""
        try:
            async with asyncio.timeout(self.config.idle_timeout):
                raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raw = b""  # parse_head refuses it with 431 below
        except (asyncio.IncompleteReadError, TimeoutError):
            return False
        self.connections[task] = True
        try:
            return await self._answer(raw, reader, writer)
        except Refusal as refusal:
            writer.write(refusal_bytes(refusal))
            await writer.drain()
            return not refusal.close and not self.draining
        finally:
            self.connections[task] = False

    async def _answer(
        self, raw: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if not raw:
            raise Refusal(431, f"the request head exceeds {MAX_HEAD_BYTES} bytes")
        head = parse_head(raw)
        close = head.wants_close or self.draining
        try:
            kind = route(head)
            if kind != HEALTH:
                check_credentials(head, self.config.api_key)
            body = await self._body(head, reader, writer)
            admitted = admit_completion(body, self.config) if kind == COMPLETIONS else None
            if self.in_flight >= self.config.max_concurrent:
                raise Refusal(503, "too many requests in flight at the gateway", close=False)
            limit = admitted.response_limit if admitted is not None else None
            self.in_flight += 1
            try:
                kept = await self._forward(head, body, limit, writer, close=close)
            finally:
                self.in_flight -= 1
        except Refusal as refusal:
            refusal.close = refusal.close or close
            raise
        return kept and not close and not self.draining

    async def _body(
        self, head: RequestHead, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes:
        length = body_length(head)
        if length > self.config.body_limit:
            raise Refusal(413, f"the request body exceeds {self.config.body_limit} bytes")
        expect = head.single(b"expect")
        if expect is not None:
            if expect.lower() != b"100-continue":
                raise Refusal(417, "only Expect: 100-continue is understood")
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not length:
            return b""
        try:
            async with asyncio.timeout(self.config.idle_timeout):
                return await reader.readexactly(length)
        except (asyncio.IncompleteReadError, TimeoutError):
            raise Refusal(400, "the request body ended early or arrived too slowly") from None

    async def _exchange(self, head: RequestHead, body: bytes) -> tuple[Upstream, ResponseHead]:
        """Send the request upstream; one retry on a fresh connection if a pooled one was stale."""
        headers = _upstream_headers(head, len(body))
        for attempt in range(2):
            conn = await self._acquire(fresh=attempt > 0)
            try:
                await conn.send(head.method, head.target, headers, body)
                return conn, await conn.head(self.config.upstream_timeout)
            except StaleConnection:
                conn.close()
            except UpstreamFailed as exc:
                conn.close()
                raise Refusal(504 if exc.timeout else 502, str(exc), close=False) from None
        raise Refusal(502, "the upstream closed the connection before answering", close=False)

    async def _acquire(self, *, fresh: bool) -> Upstream:
        try:
            return await self.pool.acquire(fresh=fresh)
        except UpstreamFailed as exc:
            raise Refusal(502, str(exc), close=False) from None

    async def _forward(
        self,
        head: RequestHead,
        body: bytes,
        limit: int | None,
        writer: asyncio.StreamWriter,
        *,
        close: bool,
    ) -> bool:
        """Relay one exchange; False when the client connection had to be ended."""
        conn, answer = await self._exchange(head, body)
        cap = response_cap(answer.status, limit)
        declared = answer.content_length
        if declared is not None and declared > cap:
            conn.close()
            raise Refusal(502, f"the upstream answer exceeds the bound of {cap} bytes", close=False)
        framing = [b"content-length: %d" % declared] if declared is not None else []
        framing += [] if declared is not None else [b"transfer-encoding: chunked"]
        framing += [b"connection: close"] if close else []
        first = response_head(answer.status, answer.reason, answer.headers, framing)
        try:
            relayed = await self._relay(conn, answer, writer, first, cap)
        except Refusal:
            conn.close()
            raise
        if relayed:
            self.pool.release(conn)
        else:
            conn.close()
            writer.transport.abort()
        return relayed

    async def _relay(
        self,
        conn: Upstream,
        answer: ResponseHead,
        writer: asyncio.StreamWriter,
        first: bytes,
        cap: int,
    ) -> bool:
        """Copy the body; False when it broke off or passed ``cap`` after bytes were written
        (the client is cut off), a 502 refusal when that happens before any were."""
        chunked = answer.content_length is None
        pending, sent, written = [first], 0, False
        try:
            async for data in conn.body(answer, self.config.upstream_timeout):
                sent += len(data)
                if sent > cap:
                    if written:
                        return False
                    raise Refusal(502, f"the upstream answer exceeds the bound of {cap} bytes")
                pending += [b"%x\r\n" % len(data), data, b"\r\n"] if chunked else [data]
                if chunked or sent >= FLUSH_BYTES:
                    writer.write(b"".join(pending))
                    pending, written = [], True
                    await writer.drain()
        except UpstreamFailed as exc:
            if written:
                return False
            raise Refusal(504 if exc.timeout else 502, str(exc)) from None
        pending += [b"0\r\n\r\n"] if chunked else []
        writer.write(b"".join(pending))
        await writer.drain()
        return True


def _upstream_headers(head: RequestHead, length: int) -> list[tuple[bytes, bytes]]:
    headers = [(b"host", b"localhost"), (b"accept-encoding", b"identity")]
    for name in _FORWARDED:
        value = head.single(name)
        if value is not None:
            headers.append((name, value))
    if head.method == b"POST":
        headers.append((b"content-length", b"%d" % length))
    return headers
