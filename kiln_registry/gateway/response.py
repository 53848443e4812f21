"""The upstream's answer head, parsed strictly, and the ways an exchange fails.

``parse_response_head`` takes one head ending in CRLF CRLF: ``HTTP/1.1``, a
three-digit status and a visible-ASCII reason, at most ``MAX_HEADERS`` header
lines checked in one pass (token names, a colon right after the name,
visible-ASCII values; no folding), and unambiguous framing: at most one
``Content-Length`` of plain digits, or ``Transfer-Encoding: chunked``, never
both.  Failures carry a short reason that never quotes upstream bytes.

Imports: standard library and ``kiln_registry.domain.limits`` only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from kiln_registry.domain.limits import MAX_RESPONSE_HEAD_BYTES

MAX_HEADERS = 128
_STATUS_LINE = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) ([\x20-\x7e\t]*)")
# Every header line with its CRLF, checked in one pass (token name, colon, visible ASCII).
_HEADER_BLOCK = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}:[\x20-\x7e\t]*\r\n)*")
_DIGITS = re.compile(rb"[0-9]{1,12}")


class UpstreamFailed(Exception):
    """The upstream could not be reached, or its answer broke off or came too slowly."""

    def __init__(self, reason: str, *, timeout: bool = False) -> None:
        super().__init__(reason)
        self.timeout = timeout


class StaleConnection(UpstreamFailed):
    """A reused connection ended before it answered anything (the upstream had closed it)."""


class OverBound(UpstreamFailed):
    """The answer's body passed the bound its sink set."""


class ResponseHead(NamedTuple):
    """A final response head: header names keep the upstream's spelling."""

    status: int
    reason: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    content_length: int | None  # None: chunked, or delimited by the connection's close
    chunked: bool
    close: bool


def parse_response_head(raw: bytes) -> ResponseHead:
    """Parse a response head ending in CRLF CRLF (the terminator included)."""
    if len(raw) > MAX_RESPONSE_HEAD_BYTES:
        raise UpstreamFailed("the upstream's response head is too large")
    first = raw.find(b"\r\n")
    status = _STATUS_LINE.fullmatch(raw, 0, first)
    if status is None or raw.count(b"\n", first + 2) - 1 > MAX_HEADERS:
        raise UpstreamFailed("the upstream sent a malformed response head")
    if _HEADER_BLOCK.fullmatch(raw, first + 2, len(raw) - 2) is None:
        raise UpstreamFailed("the upstream sent a malformed header line")
    headers = []
    for line in raw[first + 2 : -4].split(b"\r\n") if len(raw) - 4 > first + 2 else ():
        name, _, value = line.partition(b":")
        headers.append((name, value.strip(b" \t")))
    return _framed(int(status[1]), status[2], tuple(headers))


def _framed(status: int, reason: bytes, headers: tuple[tuple[bytes, bytes], ...]) -> ResponseHead:
    lengths, codings, connection = [], [], []
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length":
            lengths.append(value)
        elif lower == b"transfer-encoding":
            codings.append(value.strip().lower())
        elif lower == b"connection":
            connection.append(value)
    if len(lengths) > 1 or (lengths and codings) or codings not in ([], [b"chunked"]):
        raise UpstreamFailed("the upstream's answer has ambiguous framing")
    if lengths and _DIGITS.fullmatch(lengths[0]) is None:
        raise UpstreamFailed("the upstream sent a malformed Content-Length")
    bodiless = status < 200 or status in (204, 304)
    length = 0 if bodiless else (int(lengths[0]) if lengths else None)
    tokens = b",".join(connection).lower().split(b",") if connection else ()
    close = b"close" in (token.strip() for token in tokens)
    return ResponseHead(status, reason, headers, length, bool(codings) and not bodiless, close)
