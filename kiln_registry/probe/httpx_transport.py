"""``HttpxTransport``: the teacher transport over an injected ``httpx.AsyncClient``.

Implements ``probe.transport.TeacherTransport`` for the probes (registration,
re-probe, job start, parity): a streamed POST, no redirects followed, httpx's
own timeouts under the protocol's overall deadline (``exchange``), the head checked by
``check_head`` and the body read up to ``body_cap``.  TLS trust is the
injected client's (the registry builds it with ``teacher_tls_context``).
Every failure below HTTP goes through ``transport_failure``, also for
``get_side``, the bounded GET of a side request (parity's ``GET /v1/models``).

Never creates an httpx client and does nothing at import time.  Imports
httpx and ``probe.transport``; no database or FastAPI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe.transport import (
    Request,
    TeacherTransport,
    body_cap,
    check_head,
    origin_of,
    refuse_oversized,
    transport_failure,
)


async def read_bounded(response: httpx.Response, limit: int) -> bytes:
    """Read at most ``body_cap`` bytes; a 2xx body over ``limit`` is refused."""
    cap = body_cap(response.status_code, limit)
    body = bytearray()
    async for chunk in response.aiter_raw():
        if len(body) + len(chunk) > cap:
            refuse_oversized(response.status_code, limit)
            body += chunk[: cap - len(body)]
            break
        body += chunk
    return bytes(body)


class HttpxTransport(TeacherTransport):
    """POSTs to one teacher URL through a shared, injected ``httpx.AsyncClient``."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self._http = http
        self._url = url
        self._origin = origin_of(url)

    @property
    def url(self) -> str:
        return self._url

    @property
    def origin(self) -> str:
        return self._origin

    async def send(self, request: Request) -> tuple[int, bytes]:
        """One streamed POST: the head checked, the body read up to ``body_cap``."""
        try:
            async with self._http.stream(
                "POST",
                self._url,
                content=request.content,
                headers=request.headers,
                timeout=httpx.Timeout(request.timeout_s),
                follow_redirects=False,
            ) as response:
                request.got_head = True
                check_head(
                    response.status_code,
                    response.headers.get("content-encoding"),
                    response.headers.get("content-length"),
                    request.limit,
                )
                return response.status_code, await read_bounded(response, request.limit)
        except httpx.HTTPError as exc:
            raise transport_failure(exc, origin=self._origin, got_head=request.got_head) from exc


async def get_side(
    http: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    limit: int,
    timeout_s: float,
    side: tuple[str, str],
) -> tuple[int, bytes]:
    """One GET of a side request (no redirects) within ``timeout_s``: (status, body).

    ``side`` is (name, rule), e.g. ``("GET /v1/models", "parity.models")``: a
    body over ``limit`` bytes and every failure below HTTP are ``ProbeFailed``
    under that rule (``transport_failure``), so the caller never sees httpx.
    """
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async with http.stream("GET", url, headers=headers, follow_redirects=False) as resp:
                async for chunk in resp.aiter_raw():
                    if len(body) + len(chunk) > limit:
                        path = side[0].split(" ", 1)[-1]
                        raise ProbeFailed(f"{path} body is too large", rule=side[1])
                    body += chunk
                return resp.status_code, bytes(body)
    except (TimeoutError, httpx.HTTPError) as exc:
        raise transport_failure(exc, origin=origin_of(url), got_head=False, side=side) from exc
