"""Connection limits of ``kiln serve`` (issue 15 attack 8; issue 27 items 3 and 12).

* ``HeaderDeadlineHttpTools`` (uvicorn's httptools protocol, used where
  httptools is installed) and ``HeaderDeadlineH11`` (h11, the fallback) add a
  header-read deadline: a connection whose next request's headers are not complete
  ``HEADER_TIMEOUT_S`` after it opened (or after its previous response) is
  closed.  uvicorn's own ``timeout_keep_alive`` only covers a silent idle
  connection; a client trickling header bytes would otherwise hold its
  connection (and a file descriptor) for ever.
* A per-client connection cap (``[server] max_connections_per_client``, by
  address): a connection past it gets a short head deadline
  (``OVERFLOW_HEAD_S``), is answered only on ``/health`` and ``/ready``
  (``503 server_busy`` with ``Retry-After`` for anything else) and is closed
  after one response, so a client reopening trickling sockets holds at most
  its cap for long.  ``/health`` and ``/ready`` are never refused by
  uvicorn's ``limit_concurrency`` either: their reserved slot.
* A request answered before its body was read (a 401, a 413) leaves the
  connection in step: the rest of its body is drained and discarded when at
  most ``MAX_DRAIN_BYTES`` remain (within the header deadline), else the
  connection is closed after the answer (a lingering close: our side is
  shut, what the client still sends is discarded for ``LINGER_S``); so is
  one whose client waits for ``100 Continue`` (it may never send the body).
  The head-size counter counts only head bytes, never a body's.
* ``uvicorn_limits()`` is the keyword set ``run_server`` passes to
  ``uvicorn.run``: that protocol, the keep-alive timeout, the largest
  incomplete h11 event (request line + headers), and ``limit_concurrency``
  (past it uvicorn answers 503 at once instead of queueing).
* ``RepeatFilter``, the log-flood cap, lives in ``observability.repeats``
  (re-exported here).

Imports the standard library, h11, uvicorn's HTTP/1.1 protocols,
``config.edge`` and observability.repeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from kiln_registry.config.edge import MAX_CONNECTIONS_PER_CLIENT, ServerEdgeKeys
from kiln_registry.observability.repeats import RepeatFilter as RepeatFilter

HEADER_TIMEOUT_S = 10.0
OVERFLOW_HEAD_S = 2.0
KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 16 * 1024
MAX_DRAIN_BYTES = 64 * 1024
LINGER_S = 1.0
MAX_CONCURRENCY = 1024
HEALTH_PATHS = frozenset({"/health", "/ready"})
_CLIENTS_ATTR = "kiln_connections_by_client"

_CAP_BODY = json.dumps(
    {
        "error": {
            "code": "server_busy",
            "message": "too many connections are open from this address",
            "hint": "close idle connections or reuse one; retry after the Retry-After seconds",
        }
    }
).encode()


async def _client_cap_refusal(scope: Any, receive: Any, send: Any) -> None:
    """The answer on a connection past the per-client cap (anything but /health, /ready)."""
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_CAP_BODY)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": _CAP_BODY})


def _clients(server_state: Any) -> dict[str, int]:
    """Open connections per client address, kept on uvicorn's per-server state."""
    clients = getattr(server_state, _CLIENTS_ATTR, None)
    if clients is None:
        clients = {}
        setattr(server_state, _CLIENTS_ATTR, clients)
    return clients


class _EdgeGuard:
    """The header deadline, the per-client cap and the health slot, for either protocol.

    The deadline is armed when the connection opens and after each response; a
    request whose headers complete in time starts a new cycle, so the timer
    finds another cycle and does nothing.  uvicorn reads ``limit_concurrency``
    and ``app`` where it picks the app for a request whose head is complete
    (``scope`` is that request then): both are properties here.
    """

    max_per_client = MAX_CONNECTIONS_PER_CLIENT
    _header_deadline: asyncio.TimerHandle | None = None
    _client_key: str | None = None
    _overflow = False
    _limit: int | None = None
    _app: Any = None
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    scope: Any
    server_state: Any
    client: tuple[str, int] | None

    def _health_request(self) -> bool:
        scope = self.__dict__.get("scope")
        if not isinstance(scope, dict):
            return False
        return scope.get("path") in HEALTH_PATHS and scope.get("method") in ("GET", "HEAD")

    @property
    def limit_concurrency(self) -> int | None:
        return None if self._health_request() else self._limit

    @limit_concurrency.setter
    def limit_concurrency(self, value: int | None) -> None:
        self._limit = value

    @property
    def app(self) -> Any:
        if self._overflow and not self._health_request():
            return _client_cap_refusal
        return self._app

    @app.setter
    def app(self, value: Any) -> None:
        self._app = value

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        if not self.transport.is_closing():
            delay = min(OVERFLOW_HEAD_S, HEADER_TIMEOUT_S) if self._overflow else HEADER_TIMEOUT_S
            self._header_deadline = self.loop.call_later(delay, self._headers_overdue, self.cycle)

    def _headers_overdue(self, cycle: Any) -> None:
        self._header_deadline = None
        if self.cycle is not cycle or self.transport.is_closing():
            return  # a new request's headers arrived in time
        self._close_overdue()

    def _close_overdue(self) -> None:
        self.transport.close()

    def _count_client(self) -> None:
        key = self.client[0] if self.client else ""
        clients = _clients(self.server_state)
        count = clients.get(key, 0) + 1
        clients[key] = count
        self._client_key = key
        self._overflow = count > self.max_per_client

    def _uncount_client(self) -> None:
        key, self._client_key = self._client_key, None
        if key is None:
            return
        clients = _clients(self.server_state)
        left = clients.get(key, 0) - 1
        if left > 0:
            clients[key] = left
        else:
            clients.pop(key, None)

    def _close_unread(self) -> None:
        """Close a connection whose request body is still coming, after the answer.

        Our side is shut first so the answer is not lost to a reset; what the
        client still sends is discarded (``_discarding``) for ``LINGER_S``.
        """
        self._discarding = True
        transport = self.transport
        if transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    _discarding = False

    def _body_unread(self) -> bool:
        """Whether the request just answered still has body bytes on the way."""
        return False

    # The overrides both protocols share: ``super()`` is the uvicorn protocol
    # that follows this mixin in the subclass's bases (mypy sees ``object``).

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._count_client()
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if not self._discarding:
            super().data_received(data)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._body_unread():
            self._close_unread()
        elif self._overflow:  # one answer per connection past the cap
            self._discarding = True
            self.transport.close()
        else:
            self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        self._uncount_client()
        super().connection_lost(exc)  # type: ignore[misc]


class HeaderDeadlineH11(_EdgeGuard, H11Protocol):
    """uvicorn's h11 protocol with the edge guard; h11 bounds the header bytes.

    h11 does not say how much of an unread body remains: a request answered
    before its body was read always closes the connection.
    """

    def _body_unread(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY

    def _close_overdue(self) -> None:
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


def _declared_body(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body's declared length: 0 for none, None when unknown (chunked)."""
    length = 0
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            length = int(value) if value.isdigit() and len(value) < 20 else 0
    return length


def _httptools_protocol() -> type[asyncio.Protocol] | None:
    """``HeaderDeadlineHttpTools`` where httptools is installed (uvicorn's faster parser)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class HeaderDeadlineHttpTools(_EdgeGuard, HttpToolsProtocol):
        """httptools with the edge guard and a bound on header bytes.

        httptools has no header-size option.  A head that completes is measured
        from its parsed parts (target and header lines); one still incomplete
        after a read is measured by the head bytes read so far: a read that
        starts inside a head counts whole, a read that ends a message's body
        counts nothing (at most one read under, never a body byte).  Past
        ``MAX_HEADER_BYTES`` the client gets 431 and the connection is closed.
        """

        _head_bytes = 0  # bytes read while the head is incomplete
        _head_size = 0  # the parsed head: request target and header lines
        _in_head = True  # between messages or inside a head (not inside a body)
        _refused = False
        _body_left: int | None = 0  # declared body bytes not yet parsed (None: chunked)

        def data_received(self, data: bytes) -> None:
            if self._refused or self._discarding:
                return
            in_head = self._in_head
            if in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if in_head and self._in_head and self._head_bytes > MAX_HEADER_BYTES:
                self._refuse_head()

        def on_message_begin(self) -> None:
            self._in_head, self._head_size = True, 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._head_size += len(url)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_size += len(name) + len(value) + 4
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head, self._head_bytes = False, 0
            if self._head_size > MAX_HEADER_BYTES:  # a whole head that arrived in one read
                self._refuse_head()
                return
            # A client told to wait for ``100 Continue`` may never send the body: unknown.
            self._body_left = None if self.expect_100_continue else _declared_body(self.headers)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._body_left is not None:
                self._body_left -= len(body)
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._in_head, self._head_bytes, self._body_left = True, 0, 0
            if not self._refused:
                super().on_message_complete()

        def _body_unread(self) -> bool:
            if self._in_head or self.cycle is None or not self.cycle.response_complete:
                return False  # the parser is past the answered request (or in a head)
            left = self._body_left
            return left is None or left > MAX_DRAIN_BYTES  # else drained, then served

        def _refuse_head(self) -> None:
            self._refused = True
            if not self.transport.is_closing():
                self.transport.write(HEAD_TOO_LARGE)
                self.transport.close()

    return HeaderDeadlineHttpTools


HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"content-length: 31\r\nconnection: close\r\n\r\nRequest header fields too large"
)


def uvicorn_limits(
    edge: ServerEdgeKeys | None = None, *, prefer_httptools: bool = True
) -> dict[str, Any]:
    """The connection limits ``kiln serve`` hands to ``uvicorn.run``.

    uvicorn's httptools protocol where it is installed (several times cheaper
    per request than h11), else h11; both with the header deadline and bound
    and ``edge``'s per-client connection cap (the default when None).
    """
    fast = _httptools_protocol() if prefer_httptools else None
    base: type[asyncio.Protocol] = fast or HeaderDeadlineH11
    per_client = (edge or ServerEdgeKeys()).max_connections_per_client
    protocol = type(base.__name__, (base,), {"max_per_client": per_client})
    limits: dict[str, Any] = {
        "http": protocol,
        "timeout_keep_alive": KEEP_ALIVE_S,
        "limit_concurrency": MAX_CONCURRENCY,
    }
    if fast is None:
        limits["h11_max_incomplete_event_size"] = MAX_HEADER_BYTES
    return limits
