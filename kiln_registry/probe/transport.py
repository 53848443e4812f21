"""The teacher transport contract and the one mapping of transport failures to KilnErrors.

Owns what every client that sends Kiln's requests to a teacher must do, so
the probe client (httpx, ``probe.httpx_transport``) and the job queue's lean
keep-alive client (h11, ``probe.wire``) cannot drift apart:

* ``TeacherTransport``: POST a JSON payload to one teacher URL and return an
  ``Exchange`` (status, bounded body, elapsed time, whether a credential was
  sent) before one overall deadline: implementations subclass it and supply
  ``send``, the protocol's own ``exchange`` prepares, times and bounds it;
* the request: compact JSON, ``request_headers`` (JSON in and out, identity
  encoding only, the bearer value read from a ``SecretSource`` just before
  the request and never kept);
* the response head and body bounds: ``check_head`` (no redirect, no content
  coding, Content-Length within the bound), ``body_cap`` (a 2xx up to the
  bound, refused beyond it; at most 64 KiB of an error body);
* TLS trust: ``teacher_tls_context`` (the system store, or exactly the
  configured CA bundle), one context for both clients;
* ``transport_failure``: the only place a failure below HTTP becomes a
  ``ProbeFailed`` -- ``probe.unreachable`` before a response head (one message
  for refused, reset, DNS, TLS and untrusted certificates; the detail, with
  the certificate's verification message when one is anywhere in the cause
  chain, is only logged), ``probe.timeout`` or ``probe.incomplete_body`` after
  it, ``probe.transport`` for a request that cannot be framed.

Messages name exception types, a side request's name and at most 40
characters of a Content-Encoding; never a body or a request header.  Imports
the standard library, h11, httpx (its exception types), ``kiln_registry.domain``
(errors, text) and ``probe.parse``/``probe.exposure``; no database or FastAPI;
nothing happens at import time.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import h11
import httpx

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.domain.limits import ERROR_BODY_READ_LIMIT as ERROR_BODY_READ_LIMIT
from kiln_registry.domain.text import quoted
from kiln_registry.probe.exposure import unreachable
from kiln_registry.probe.parse import fail

CAUSE_CHAIN_DEPTH = 8


class SecretSource(Protocol):
    """A credential handle: ``read()`` returns the bearer value, fresh each time."""

    def read(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Exchange:
    status: int
    body: bytes
    elapsed_ms: float
    authenticated: bool


def teacher_tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """TLS verification for teachers: the system store, or exactly the given CA bundle."""
    if ca_file is None:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=str(ca_file))


def origin_of(url: str) -> str:
    """``scheme://authority`` of a teacher URL, as messages name the teacher."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def request_headers(secret: SecretSource | None, *, json_body: bool = True) -> dict[str, str]:
    """Kiln's request headers; the bearer value is read from ``secret`` now, never kept."""
    headers = {"content-type": "application/json"} if json_body else {}
    headers["accept"] = "application/json"
    headers["accept-encoding"] = "identity"
    if secret is not None:
        headers["authorization"] = "Bearer " + secret.read()
    return headers


def check_head(status: int, encoding: str | None, declared: str | None, limit: int) -> None:
    """The response head's rules: no redirect, no content coding, Content-Length in bounds."""
    if 300 <= status < 400:
        fail("redirect", f"teacher answered HTTP {status}; redirects are refused")
    encoding = (encoding or "identity").strip().lower()
    if encoding not in ("", "identity"):
        fail("content_encoding", f"teacher used Content-Encoding {quoted(encoding, 40)}")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        fail("body_too_large", f"Content-Length {declared} exceeds the bound of {limit} bytes")


def body_cap(status: int, limit: int) -> int:
    """How much of a body is read: all of a 2xx up to ``limit``, at most 64 KiB of an error."""
    return limit if status < 300 else min(limit, ERROR_BODY_READ_LIMIT)


def refuse_oversized(status: int, limit: int) -> None:
    """A 2xx body past ``limit`` is refused; an error body is only cut at ``body_cap``."""
    if status < 300:
        fail("body_too_large", f"response body exceeds the bound of {limit} bytes")


@dataclass(slots=True)
class Request:
    """One prepared POST: the JSON bytes, the headers, its bounds, and how far it got."""

    content: bytes
    headers: dict[str, str] = field(repr=False)  # may hold the bearer value
    limit: int
    timeout_s: float
    got_head: bool = False  # set by ``send`` once a response head arrived


class TeacherTransport(Protocol):
    """POSTs of Kiln's JSON requests to one teacher URL, under this module's rules.

    An implementation subclasses this protocol and provides ``url``, ``origin``
    and ``send``; ``exchange`` is shared: it prepares the request, runs
    ``send`` before one overall deadline, and times it.
    """

    @property
    def url(self) -> str: ...

    @property
    def origin(self) -> str:
        """``scheme://authority``, as messages name the teacher."""
        ...

    async def send(self, request: Request) -> tuple[int, bytes]:
        """POST ``request`` once: (status, body read up to ``body_cap``), or ``ProbeFailed``."""
        ...

    async def exchange(
        self,
        payload: dict[str, object],
        *,
        secret: SecretSource | None,
        timeout_s: float,
        limit: int,
    ) -> Exchange:
        """POST ``payload``; the bounded answer, or ``ProbeFailed`` from ``transport_failure``."""
        content = json.dumps(payload, separators=(",", ":")).encode()
        request = Request(content, request_headers(secret), limit, timeout_s)
        start = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                status, body = await self.send(request)
        except TimeoutError as exc:
            failure = transport_failure(exc, origin=self.origin, got_head=request.got_head)
            raise failure from None
        elapsed = (time.perf_counter() - start) * 1000.0
        return Exchange(status, body, elapsed, secret is not None)


def untrusted_certificate(origin: str, cert: ssl.SSLCertVerificationError) -> ProbeFailed:
    """A teacher certificate the configured authorities do not vouch for, and what to do."""
    return unreachable(
        f"the TLS certificate of {origin} is not trusted"
        f" ({cert.verify_message or 'verification failed'}): set [server] teacher_ca_file"
        " to the PEM bundle of the CA that signed it"
    )


def certificate_error(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error somewhere in ``exc``'s cause chain (bounded walk)."""
    seen: BaseException | None = exc
    for _ in range(CAUSE_CHAIN_DEPTH):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def transport_failure(
    exc: BaseException,
    *,
    origin: str,
    got_head: bool,
    connecting: bool = False,
    side: tuple[str, str] | None = None,
) -> ProbeFailed:
    """The ``ProbeFailed`` for a request that failed below HTTP (see the module docstring).

    ``connecting``: the failure happened while opening the connection (the
    lean client says so; httpx says it with its exception types).  ``side``:
    (name, rule) of a side request such as parity's ``GET /v1/models``, whose
    every transport failure reads ``<name> failed (<type>)`` under that rule.
    """
    name = type(exc).__name__
    if side is not None:
        return ProbeFailed(f"{side[0]} failed ({name})", rule=side[1])
    if isinstance(exc, h11.LocalProtocolError):
        return ProbeFailed(
            "the scoring request could not be framed as HTTP/1.1", rule="probe.transport"
        )
    if not got_head:
        # One answer for every failure before an HTTP head: no port-scan oracle (issue 15).
        cert = certificate_error(exc)
        if cert is not None:
            return untrusted_certificate(origin, cert)
        stage = "connecting" if connecting else "before the response head"
        return unreachable(f"{name} {stage}: {str(exc)[:300]}")
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return ProbeFailed(f"teacher request timed out ({name})", rule="probe.timeout")
    return ProbeFailed(
        f"teacher connection ended before the complete body ({name})",
        rule="probe.incomplete_body",
    )
