"""Cross-site and DNS-rebinding defences (issue 15, attack 2), as one pure ASGI layer.

``HostGuard`` is the outermost layer of the application:

* the ``Host`` header must name an allowed host (``[server] allowed_hosts``;
  unset: the bound address, ``localhost`` and the loopback names, with or
  without a port).  A page served from ``evil.example`` that rebinds its
  name to 127.0.0.1 still sends ``Host: evil.example`` and is refused with
  400 ``host_not_allowed``; a missing ``Host`` is refused too.
* a request that carries a body must declare ``Content-Type:
  application/json`` (parameters such as ``charset`` allowed), so a
  cross-origin HTML form (``text/plain``, ``application/x-www-form-urlencoded``,
  ``multipart/form-data``) never reaches a route: 415 ``unsupported_media_type``.
* a state-changing request (any method but ``GET``/``HEAD``/``OPTIONS``),
  with or without a body and with auth on or off, must come from the
  server's own origin (issue 27, item 6: an empty-body cross-origin form
  post ran ``/probe``, ``/release``, ``/launch`` and ``/cancel``).  An
  ``Origin`` header must name this server (its ``scheme://`` plus the
  ``Host`` it was sent, any scheme of the two) or one of ``[server]
  cors_origins``; ``Origin: null``, a foreign origin, two ``Origin`` headers
  or, without ``Origin``, ``Sec-Fetch-Site: cross-site``/``same-site`` are
  refused with 403 ``cross_origin_refused`` before auth or a route runs.
  Every browser sends ``Origin`` on a cross-origin ``POST``; a request with
  neither header is not a browser's cross-site request (the CLI, a script).

CORS headers are sent only when ``[server] cors_origins`` lists origins
(``install_host_guard`` then adds Starlette's ``CORSMiddleware`` for exactly
those); otherwise a browser's cross-origin read is refused by the browser.

The check is a scan of the header list and a set lookup, so the cached
alias lookup behind it stays cheap.  Imports Starlette and the standard
library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from starlette.middleware.cors import CORSMiddleware

from kiln_registry.domain.asgi import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "localhost.localdomain", "ip6-localhost")
WILDCARD_BINDS = ("0.0.0.0", "::")
JSON_TYPES = (b"application/json",)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_SITE_FETCH = (b"same-origin", b"none")
ORIGIN_SCHEMES = ((b"http://", b":80"), (b"https://", b":443"))


def default_hosts(bound: str) -> tuple[str, ...]:
    """The bound address (bracketed when IPv6) and the loopback names."""
    names = list(LOOPBACK_NAMES)
    if bound not in WILDCARD_BINDS:
        names.append(f"[{bound}]" if ":" in bound else bound)
    return tuple(names)


class HostRule:
    """Which ``Host`` values are served: exact names (any port), ``name:port``, ``*.suffix``."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.any = False
        self.exact: set[str] = set()
        self.suffixes: list[str] = []
        for pattern in patterns:
            if pattern == "*":
                self.any = True
            elif pattern.startswith("*."):
                self.suffixes.append(pattern[1:])
            else:
                self.exact.add(pattern)

    def allows(self, host: str) -> bool:
        if self.any or host in self.exact:
            return True
        name = _host_name(host)
        if name is None:
            return False
        return name in self.exact or any(name.endswith(s) for s in self.suffixes)


def _host_name(host: str) -> str | None:
    """``host`` without its ``:port``; None when it is not ``name[:port]`` or ``[v6][:port]``."""
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1 :]
        if end < 0 or not (rest == "" or (rest[:1] == ":" and rest[1:].isdigit())):
            return None
        return host[: end + 1]
    name, sep, port = host.partition(":")
    if not name or (sep and not port.isdigit()):
        return None
    return name


def _refusal(status: int, code: str, message: str, hint: str) -> tuple[list[Any], bytes]:
    body = json.dumps({"error": {"code": code, "message": message, "hint": hint}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return headers, body


BAD_HOST = _refusal(
    400,
    "host_not_allowed",
    "the Host header names a host this registry does not serve",
    "connect through an allowed name, or add it to [server] allowed_hosts",
)
CROSS_ORIGIN = _refusal(
    403,
    "cross_origin_refused",
    "a state-changing request must come from this server's own origin (the Origin or"
    " Sec-Fetch-Site header names another site)",
    "send it from the registry's own pages or a non-browser client, or list the page's"
    " origin in [server] cors_origins",
)
BAD_TYPE = _refusal(
    415,
    "unsupported_media_type",
    "a request body must be sent as Content-Type: application/json",
    "send the body as JSON with Content-Type: application/json",
)


def _json_type(value: bytes) -> bool:
    return value.split(b";", 1)[0].strip().lower() in JSON_TYPES


def same_origin(
    origins: list[bytes], fetch_site: bytes | None, host: bytes, cors: frozenset[bytes]
) -> bool:
    """Whether a state-changing request comes from this server (or a listed CORS origin)."""
    if len(origins) > 1:
        return False
    if not origins:
        return fetch_site is None or fetch_site.lower() in SAME_SITE_FETCH
    origin = origins[0].lower()
    if origin in cors:
        return True
    for scheme, default_port in ORIGIN_SCHEMES:
        if origin.startswith(scheme):
            ours = host.lower().removesuffix(default_port)
            return bool(ours) and origin[len(scheme) :].removesuffix(default_port) == ours
    return False  # "null", or not an origin at all


class HostGuard:
    """Refuse foreign ``Host`` headers, non-JSON bodies and cross-origin state changes."""

    def __init__(self, app: ASGIApp, *, hosts: HostRule, cors: Iterable[str] = ()) -> None:
        self._app = app
        self._hosts = hosts
        self._cors = frozenset(o.lower().encode("latin-1") for o in cors)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        host = b""
        ctype: bytes | None = None
        has_body = False
        origins: list[bytes] = []
        fetch_site: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"content-type":
                ctype = value
            elif name == b"origin":
                origins.append(value)
            elif name == b"sec-fetch-site":
                fetch_site = value
            elif (name == b"content-length" and value not in (b"0", b"")) or (
                name == b"transfer-encoding"
            ):
                has_body = True
        if not self._hosts.allows(host.decode("latin-1").lower()):
            await _send(send, 400, BAD_HOST)
        elif has_body and (ctype is None or not _json_type(ctype)):
            await _send(send, 415, BAD_TYPE)
        elif scope["method"] not in SAFE_METHODS and not same_origin(
            origins, fetch_site, host, self._cors
        ):
            await _send(send, 403, CROSS_ORIGIN)
        else:
            await self._app(scope, receive, send)


async def _send(send: Send, status: int, refusal: tuple[list[Any], bytes]) -> None:
    headers, body = refusal
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_host_guard(
    app: Any, *, bound: str, allowed: Iterable[str] | None, cors: Iterable[str]
) -> None:
    """Add CORS (only for listed origins) and then the guard, outermost."""
    origins = list(cors)
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type"],
        )
    patterns = default_hosts(bound) if allowed is None else tuple(allowed)
    app.add_middleware(HostGuard, hosts=HostRule(patterns), cors=origins)
