"""The gateway server: accept, admit, forward to the Unix socket, drain.

``Gateway`` listens on the configured host and port; each client connection
is a ``ClientConnection`` (an ``asyncio.Protocol``: no stream reader, no
task per request).  Per request: collect one head (at most
``MAX_HEAD_BYTES``) and parse it (``http1.parse_head``), route it, check
credentials, frame the body under its bound (413 before it is read), admit
a completion body, then hand the exchange to a ``forward.Forward`` over the
upstream pool.  Only an allowlist of request headers is forwarded
(``content-type``, ``accept``, plus the gateway's own ``host``,
``content-length`` and ``accept-encoding: identity``), so client
credentials, hop-by-hop and request-id headers never reach vLLM.

Requests on one connection are served in order; bytes of a pipelined next
request wait in the connection's buffer (reading pauses past
``MAX_HEAD_BYTES`` of them) and are judged on their own afterwards.  A
refusal the gateway answers itself keeps the connection open only when its
framing is known and nothing asked to close.

Connections are unproven until one of their requests passes the key check on
a ``/v1`` route (with no key configured: until one names a ``/v1`` route);
``/health`` proves nothing.  Unproven connections are counted apart, at most
``max_unproven`` of them, and each gets ``head_timeout`` for a whole head
(then it is closed without an answer); when they are all taken, a new
connection closes the oldest one that has waited for a head at least
``evict_after`` (so a burst of real clients does not close itself), else it
gets a 503; silent or trickling sockets cannot keep a keyed client out.  Proven connections, at
most ``max_connections`` (then the proving request is a 503), wait
``idle_timeout`` for a head and as long again for a body (then 400).

Drain (``Gateway.drain``): stop listening, close idle connections, let
requests in flight finish (their answers say ``connection: close``) until
the deadline, then abort what remains.

Imports: standard library and sibling gateway modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import cast

from kiln_registry.gateway.admission import (
    COMPLETIONS,
    HEALTH,
    admit_completion,
    check_credentials,
    route,
)
from kiln_registry.gateway.config import GatewayConfig
from kiln_registry.gateway.forward import Forward, upstream_request
from kiln_registry.gateway.http1 import (
    MAX_HEAD_BYTES,
    RequestHead,
    body_length,
    parse_head,
    refusal_bytes,
)
from kiln_registry.gateway.refusals import Refusal
from kiln_registry.gateway.upstream import UpstreamPool

DRAIN_POLL_SECONDS = 0.02
WRITE_HIGH_WATER = 256 * 1024
SEND_BUFFER = 512 * 1024
_END_OF_HEAD = b"\r\n\r\n"


class Gateway:
    """One gateway: ``await start()``, then ``await drain()`` to stop."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.pool = UpstreamPool(config.upstream_uds, max_idle=config.max_concurrent)
        self.server: asyncio.Server | None = None
        self.port = config.port
        self.draining = False
        self.in_flight = 0
        self.clients: set[ClientConnection] = set()
        self.unproven: dict[ClientConnection, None] = {}  # in order of arrival
        self.proven: set[ClientConnection] = set()

    def admit(self, client: ClientConnection) -> bool:
        """Count a new connection as unproven, closing the oldest idle one when all are taken."""
        if self.draining:
            return False
        if len(self.unproven) >= self.config.max_unproven:
            ripe = client.accepted - self.config.evict_after
            oldest = next((c for c in self.unproven if not c.busy), None)
            if oldest is None or oldest.accepted > ripe:
                return False
            oldest.close()  # waited for a head the longest: no answer, as at its deadline
            self.forget(oldest)
        self.clients.add(client)
        self.unproven[client] = None
        return True

    def prove(self, client: ClientConnection) -> None:
        """Move ``client`` to the proven connections, or refuse its request when they are full."""
        if len(self.proven) >= self.config.max_connections:
            raise Refusal(503, "the gateway has too many open connections")
        self.unproven.pop(client, None)
        self.proven.add(client)

    def forget(self, client: ClientConnection) -> None:
        self.clients.discard(client)
        self.unproven.pop(client, None)
        self.proven.discard(client)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: ClientConnection(self), self.config.host, self.config.port
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def drain(self, seconds: float | None = None) -> None:
        """Stop accepting, finish in-flight requests until the deadline, abort the rest."""
        self.draining = True
        if self.server is not None:
            self.server.close()
        deadline = time.monotonic() + (self.config.drain_seconds if seconds is None else seconds)
        for client in list(self.clients):
            if not client.busy:
                client.close()
        while any(c.busy for c in self.clients) and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        for client in list(self.clients):
            client.abort()
        await asyncio.sleep(0)  # let the aborted connections' callbacks run
        self.pool.close()


class ClientConnection(asyncio.Protocol):
    """One client connection: its requests, one at a time, in order."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head: RequestHead | None = None  # set from a parsed head to the end of its answer
        self.kind = ""
        self.length = 0
        self.forward: Forward | None = None
        self.closing = False
        self.eof = False
        self.reading_paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.deadline: float | None = None
        self.proven = False
        self.accepted = self.loop.time()

    @property
    def busy(self) -> bool:
        return self.head is not None and not self.closing

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = client = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        if not self.gateway.admit(self):
            client.write(refusal_bytes(Refusal(503, "the gateway is not accepting connections")))
            self.close()
            return
        sock = client.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # SNDBUF: a whole answer in one send
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        client.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.buffer += data
        if self.forward is None:
            self._advance()
        elif len(self.buffer) > MAX_HEAD_BYTES and not self.reading_paused:
            self._pause_reading(True)  # a pipelined request waits its turn, bounded

    def eof_received(self) -> bool:
        self.eof = True
        if self.forward is not None:
            return True  # answer the request in flight, then close
        self._advance()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._drop_timer()
        self.gateway.forget(self)
        if self.forward is not None:
            forward, self.forward = self.forward, None
            forward.cancel()

    def pause_writing(self) -> None:
        if self.forward is not None:
            self.forward.pause(True)

    def resume_writing(self) -> None:
        if self.forward is not None:
            self.forward.pause(False)

    # -- requests -----------------------------------------------------------------------

    def _advance(self) -> None:
        """Serve what the buffer holds; at its end, wait for more or close on EOF."""
        while not self.closing and self.forward is None:
            try:
                if self._step():
                    continue
            except Refusal as refusal:
                self.refuse(refusal)  # schedules what the buffer still holds
                return
            if self.eof and self.head is None:
                self.close()  # no (complete) head before the client's end
            elif self.eof:
                self.refuse(Refusal(400, "the request body ended early or arrived too slowly"))
            return

    def _step(self) -> bool:
        """Take one request from the buffer; False when more bytes are needed."""
        if self.head is None:
            end = self.buffer.find(_END_OF_HEAD, 0, MAX_HEAD_BYTES + 4)
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise Refusal(431, f"the request head exceeds {MAX_HEAD_BYTES} bytes")
                return False
            raw = bytes(self.buffer[: end + 4])
            del self.buffer[: end + 4]
            self._read_head(raw)
        if len(self.buffer) < self.length:
            return False
        body = bytes(self.buffer[: self.length])
        del self.buffer[: self.length]
        self._dispatch(body)
        return True

    def _read_head(self, raw: bytes) -> None:
        head = parse_head(raw)
        self.head = head
        self.kind = route(head)
        if self.kind != HEALTH:
            check_credentials(head, self.config.api_key)
            if not self.proven:
                self.gateway.prove(self)
                self.proven = True
        self.length = body_length(head)
        if self.length > self.config.body_limit:
            raise Refusal(413, f"the request body exceeds {self.config.body_limit} bytes")
        expect = head.single(b"expect")
        if expect is not None:
            if expect.lower() != b"100-continue":
                raise Refusal(417, "only Expect: 100-continue is understood")
            self.write([b"HTTP/1.1 100 Continue\r\n\r\n"])
        if len(self.buffer) < self.length:
            self._arm()  # the body has its own deadline

    def _dispatch(self, body: bytes) -> None:
        assert self.head is not None
        config = self.config
        admitted = admit_completion(body, config) if self.kind == COMPLETIONS else None
        request = upstream_request(self.head, body)
        if self.gateway.in_flight >= config.max_concurrent:
            raise Refusal(503, "too many requests in flight at the gateway", close=False)
        self._disarm()
        limit = admitted.response_limit if admitted is not None else None
        self.forward = Forward(self, self.gateway.pool, request, limit, config.upstream_timeout)
        self.gateway.in_flight += 1
        self.forward.start()

    # -- called by Forward --------------------------------------------------------------

    def must_close(self) -> bool:
        """Whether this answer ends the connection (asked for, draining, or half-closed)."""
        wants = self.head is not None and self.head.wants_close
        return wants or self.gateway.draining or self.eof

    def write(self, data: list[bytes | memoryview]) -> None:
        if self.transport is not None and not self.closing:
            self.transport.writelines(data)

    def finished(self, tail: list[bytes | memoryview], *, keep: bool) -> None:
        """The answer is complete once ``tail`` is written; serve the next request or close."""
        self.forward = None
        self.write(tail)
        self._next(keep)

    def refuse(self, refusal: Refusal) -> None:
        """Answer a refusal ourselves; the connection stays only when its framing is known."""
        refusal.close = refusal.close or self.must_close()
        self.forward = None
        self.write([refusal_bytes(refusal)])
        self._next(not refusal.close)

    def cut(self) -> None:
        """End the connection mid-answer: the client sees an incomplete body."""
        self.forward = None
        self.abort()

    def _next(self, keep: bool) -> None:
        self.head, self.length = None, 0
        if not keep or self.gateway.draining:
            self.close()
            return
        self._arm()
        if self.reading_paused:
            self._pause_reading(False)
        if self.buffer or self.eof:
            self.loop.call_soon(self._advance)

    # -- connection state ---------------------------------------------------------------

    def close(self) -> None:
        self.closing = True
        self._drop_timer()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        self._drop_timer()
        if self.transport is not None:
            self.transport.abort()

    def _pause_reading(self, paused: bool) -> None:
        assert self.transport is not None
        self.reading_paused = paused
        if paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def _arm(self) -> None:
        """Start the wait for a head or a body (one timer, re-armed lazily when it fires)."""
        config = self.config
        wait = config.idle_timeout if self.proven else min(config.head_timeout, config.idle_timeout)
        self.deadline = self.loop.time() + wait
        if self.timer is None:
            self.timer = self.loop.call_at(self.deadline, self._idle)

    def _disarm(self) -> None:
        self.deadline = None

    def _drop_timer(self) -> None:
        self.deadline = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _idle(self) -> None:
        self.timer = None
        if self.deadline is None or self.closing or self.forward is not None:
            return
        if self.loop.time() < self.deadline:
            self.timer = self.loop.call_at(self.deadline, self._idle)
            return
        if self.head is None:
            self.close()  # no head in time: closed without an answer
        else:
            self.refuse(Refusal(400, "the request body ended early or arrived too slowly"))
