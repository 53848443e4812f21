"""The gateway's HTTP/1.1 wire rules: a strict request-head parser and response framing.

Client bytes are untrusted, so the head is parsed here by a small strict
parser instead of a lenient one: exactly ``METHOD SP target SP HTTP/1.1``,
header names that are tokens, values of visible ASCII, space and tab, no
line folding, at most ``MAX_HEADERS`` lines in at most ``MAX_HEAD_BYTES``.
Body framing is fail-closed against request smuggling: any
``Transfer-Encoding`` is refused, ``Content-Length`` must appear at most once
as plain digits, a POST must carry it and a GET must not carry a body.

Response framing copies the upstream status line's code and reason and the
upstream headers in order (minus hop-by-hop ones); the body bytes are
written as received.

Imports: standard library and ``gateway.refusals`` only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from http import HTTPStatus

from kiln_registry.gateway.refusals import Refusal

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
MAX_CONTENT_LENGTH_DIGITS = 12
_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) ([\x21-\x7e]{1,8192}) HTTP/1\.1")
# The header block (every line after the request line, each with its CRLF) is checked in
# one pass: token names, a colon right after the name, values of visible ASCII, space and
# tab, no folding (a line starting with white space is no token).
HEADER_BLOCK = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}:[\x20-\x7e\t]*\r\n)*")
_DIGITS = re.compile(rb"[0-9]{1,%d}" % MAX_CONTENT_LENGTH_DIGITS)
# Headers that describe one connection, not the message (RFC 9110 section 7.6.1),
# plus the framing headers the gateway writes itself.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
    }
)


class RequestHead:
    """One parsed request head; header names are lower-case, ``index`` maps each to its values."""

    __slots__ = ("headers", "index", "method", "target", "wants_close")

    def __init__(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.method = method
        self.target = target
        self.headers = tuple(headers)
        self.index: dict[bytes, list[bytes]] = {}
        for name, value in headers:
            self.index.setdefault(name, []).append(value)
        connection = self.index.get(b"connection")
        tokens = b",".join(connection).lower().split(b",") if connection else ()
        self.wants_close = b"close" in (token.strip() for token in tokens)

    def values(self, name: bytes) -> list[bytes]:
        return self.index.get(name, [])

    def single(self, name: bytes) -> bytes | None:
        """The one value of ``name``, None when absent; a repeated header is refused."""
        found = self.index.get(name)
        if found is None:
            return None
        if len(found) > 1:
            raise Refusal(400, f"the {name.decode()} header appears more than once")
        return found[0]


def parse_head(raw: bytes) -> RequestHead:
    """Parse a request head ending in CRLF CRLF (the terminator included)."""
    if len(raw) > MAX_HEAD_BYTES:
        raise Refusal(431, f"the request head exceeds {MAX_HEAD_BYTES} bytes")
    first = raw.find(b"\r\n")
    request = _REQUEST_LINE.fullmatch(raw, 0, first)
    if request is None:
        raise Refusal(400, "malformed request line (only HTTP/1.1 is served)")
    if raw.count(b"\n", first + 2) - 1 > MAX_HEADERS:
        raise Refusal(431, f"the request has more than {MAX_HEADERS} header lines")
    if HEADER_BLOCK.fullmatch(raw, first + 2, len(raw) - 2) is None:
        raise Refusal(400, "malformed header line (no folding, no control characters)")
    headers = []
    for line in raw[first + 2 : -4].split(b"\r\n") if len(raw) - 4 > first + 2 else ():
        name, _, value = line.partition(b":")
        headers.append((name.lower(), value.strip(b" \t")))
    return RequestHead(request[1], request[2], headers)


def body_length(head: RequestHead) -> int:
    """The request body's length under the smuggling rules (see the module docstring)."""
    if head.values(b"transfer-encoding"):
        raise Refusal(400, "Transfer-Encoding is not accepted; send one Content-Length")
    declared = head.single(b"content-length")
    if declared is not None and _DIGITS.fullmatch(declared) is None:
        raise Refusal(400, "Content-Length must be plain decimal digits")
    length = int(declared) if declared is not None else None
    if head.method == b"POST" and length is None:
        raise Refusal(411, "a POST needs a Content-Length")
    if head.method != b"POST" and length not in (None, 0):
        raise Refusal(400, f"a {head.method.decode()} request carries no body")
    return length or 0


def response_head(
    status: int, reason: bytes, headers: Iterable[tuple[bytes, bytes]], framing: Sequence[bytes]
) -> bytes:
    """``HTTP/1.1`` status line, the end-to-end upstream headers in order, then ``framing``."""
    out = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
    for name, value in headers:
        if name.lower() not in HOP_BY_HOP:
            out.append(name + b": " + value + b"\r\n")
    out.extend(line + b"\r\n" for line in framing)
    out.append(b"\r\n")
    return b"".join(out)


def refusal_bytes(refusal: Refusal) -> bytes:
    """A complete response for a refusal the gateway answers itself."""
    body = refusal.body()
    framing = [b"content-type: application/json", b"content-length: %d" % len(body)]
    if refusal.close:
        framing.append(b"connection: close")
    reason = HTTPStatus(refusal.status).phrase.encode()
    return response_head(refusal.status, reason, (), framing) + body
