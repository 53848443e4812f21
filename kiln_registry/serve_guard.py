"""Connection and log limits of ``kiln serve`` (issue 15, attack 8: slowloris and log floods).

* ``HeaderDeadlineH11`` is uvicorn's h11 protocol with a header-read
  deadline: a connection whose next request's headers are not complete
  ``HEADER_TIMEOUT_S`` after it opened (or after its previous response) is
  closed.  uvicorn's own ``timeout_keep_alive`` only covers a silent idle
  connection; a client trickling header bytes would otherwise hold its
  connection (and a file descriptor) for ever.
* ``uvicorn_limits()`` is the keyword set ``run_server`` passes to
  ``uvicorn.run``: that protocol, the keep-alive timeout, the largest
  incomplete h11 event (request line + headers), and ``limit_concurrency``
  (past it uvicorn answers 503 at once instead of queueing).
* ``RepeatFilter`` rate-limits repeated log lines: at most ``burst`` records
  with the same logger, level and message template per ``window_s``; the
  first record after a quiet window says how many were dropped.  Keys are
  bounded (the oldest is forgotten first).

Imports the standard library, h11 and uvicorn's h11 protocol only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 16 * 1024
MAX_CONCURRENCY = 1024
LOG_BURST = 10
LOG_WINDOW_S = 60.0
MAX_LOG_KEYS = 1024


class HeaderDeadlineH11(H11Protocol):
    """h11 with a deadline on each request's headers (see the module docstring)."""

    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

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
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


def uvicorn_limits() -> dict[str, Any]:
    """The connection limits ``kiln serve`` hands to ``uvicorn.run``."""
    return {
        "http": HeaderDeadlineH11,
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        "limit_concurrency": MAX_CONCURRENCY,
    }


class RepeatFilter(logging.Filter):
    """Drop repeats of one log line past ``burst`` per ``window_s`` (see the module docstring)."""

    def __init__(self, burst: int = LOG_BURST, window_s: float = LOG_WINDOW_S) -> None:
        super().__init__()
        self._burst = burst
        self._window = window_s
        # key -> [window start, records seen in the window, dropped in the window]
        self._seen: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = time.monotonic()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= self._window:
            dropped = int(entry[2]) if entry is not None else 0
            self._seen[key] = [now, 1.0, 0.0]
            self._seen.move_to_end(key)
            while len(self._seen) > MAX_LOG_KEYS:
                self._seen.popitem(last=False)
            if dropped:
                record.msg = f"{record.msg} [{dropped} identical lines suppressed]"
            return True
        entry[1] += 1
        if entry[1] <= self._burst:
            return True
        entry[2] += 1
        return False
