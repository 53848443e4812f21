"""Connection and log limits of ``kiln serve`` (issue 15, attack 8: slowloris and log floods).

* ``HeaderDeadlineHttpTools`` (uvicorn's httptools protocol, used where
  httptools is installed) and ``HeaderDeadlineH11`` (h11, the fallback) add a
  header-read deadline: a connection whose next request's headers are not complete
  ``HEADER_TIMEOUT_S`` after it opened (or after its previous response) is
  closed.  uvicorn's own ``timeout_keep_alive`` only covers a silent idle
  connection; a client trickling header bytes would otherwise hold its
  connection (and a file descriptor) for ever.
* ``uvicorn_limits()`` is the keyword set ``run_server`` passes to
  ``uvicorn.run``: that protocol, the keep-alive timeout, the largest
  incomplete h11 event (request line + headers), and ``limit_concurrency``
  (past it uvicorn answers 503 at once instead of queueing).
* ``RepeatFilter``, the log-flood cap, lives in ``observability.repeats``
  (re-exported here).

Imports the standard library, h11, uvicorn's HTTP/1.1 protocols and
observability.repeats.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from kiln_registry.observability.repeats import RepeatFilter as RepeatFilter

HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 16 * 1024
MAX_CONCURRENCY = 1024


class _HeaderDeadline:
    """A deadline on each request's headers, for either of uvicorn's HTTP/1.1 protocols.

    Armed when the connection opens and after each response; a request whose
    headers complete in time starts a new cycle, so the timer finds another
    cycle and does nothing.  One timer per connection, re-armed per response.
    """

    _header_deadline: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        if not self.transport.is_closing():
            self._header_deadline = self.loop.call_later(
                HEADER_TIMEOUT_S, self._headers_overdue, self.cycle
            )

    def _headers_overdue(self, cycle: Any) -> None:
        self._header_deadline = None
        if self.cycle is not cycle or self.transport.is_closing():
            return  # a new request's headers arrived in time
        self._close_overdue()

    def _close_overdue(self) -> None:
        self.transport.close()

    # The overrides both protocols share: ``super()`` is the uvicorn protocol
    # that follows this mixin in the subclass's bases (mypy sees ``object``).

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)  # type: ignore[misc]


class HeaderDeadlineH11(_HeaderDeadline, H11Protocol):
    """uvicorn's h11 protocol with the header deadline; h11 bounds the header bytes."""

    def _close_overdue(self) -> None:
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


def _httptools_protocol() -> type[asyncio.Protocol] | None:
    """``HeaderDeadlineHttpTools`` where httptools is installed (uvicorn's faster parser)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class HeaderDeadlineHttpTools(_HeaderDeadline, HttpToolsProtocol):
        """httptools with the header deadline and a bound on header bytes.

        httptools has no header-size option.  A head that completes is measured
        from its parsed parts (target and header lines); one still incomplete
        after a read is measured by the bytes read so far (at most one read
        over).  Past ``MAX_HEADER_BYTES`` the client gets 431 and the connection
        is closed; a head and its body in one read are never miscounted.
        """

        _head_bytes = 0  # bytes read while the head is incomplete
        _head_size = 0  # the parsed head: request target and header lines
        _in_head = True
        _refused = False

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._in_head and self._head_bytes > MAX_HEADER_BYTES:
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
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            self._in_head, self._head_bytes = True, 0
            super().on_response_complete()  # the protocol's, then the deadline re-armed

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._refused:
                super().on_message_complete()

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


def uvicorn_limits(*, prefer_httptools: bool = True) -> dict[str, Any]:
    """The connection limits ``kiln serve`` hands to ``uvicorn.run``.

    uvicorn's httptools protocol where it is installed (several times cheaper
    per request than h11), else h11; both with the header deadline and bound.
    """
    fast = _httptools_protocol() if prefer_httptools else None
    limits: dict[str, Any] = {
        "http": fast or HeaderDeadlineH11,
        "timeout_keep_alive": KEEP_ALIVE_S,
        "limit_concurrency": MAX_CONCURRENCY,
    }
    if fast is None:
        limits["h11_max_incomplete_event_size"] = MAX_HEADER_BYTES
    return limits
