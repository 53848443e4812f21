"""``HttpxTransport``: the teacher transport over an injected ``httpx.AsyncClient``.

Implements ``probe.transport.TeacherTransport`` for the probes (registration,
re-probe, job start, parity): a streamed POST, no redirects followed, httpx's
own timeouts under ``timed_exchange``'s overall deadline, the head checked by
``check_head`` and the body read up to ``body_cap``.  TLS trust is the
injected client's (the registry builds it with ``teacher_tls_context``).
Every failure below HTTP goes through ``transport_failure``.

Never creates an httpx client and does nothing at import time.  Imports
httpx and ``probe.transport``; no database or FastAPI.
"""

from __future__ import annotations

import httpx

from kiln_registry.probe.transport import (
    Exchange,
    Progress,
    SecretSource,
    body_cap,
    check_head,
    origin_of,
    refuse_oversized,
    timed_exchange,
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


class HttpxTransport:
    """POSTs to one teacher URL through a shared, injected ``httpx.AsyncClient``."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self._http = http
        self._url = url
        self._origin = origin_of(url)

    @property
    def url(self) -> str:
        return self._url

    async def exchange(
        self,
        payload: dict[str, object],
        *,
        secret: SecretSource | None,
        timeout_s: float,
        limit: int,
    ) -> Exchange:
        """POST ``payload`` and read the bounded body before one overall deadline."""

        async def send(
            content: bytes, headers: dict[str, str], progress: Progress
        ) -> tuple[int, bytes]:
            try:
                async with self._http.stream(
                    "POST",
                    self._url,
                    content=content,
                    headers=headers,
                    timeout=httpx.Timeout(timeout_s),
                    follow_redirects=False,
                ) as response:
                    progress.got_head = True
                    check_head(
                        response.status_code,
                        response.headers.get("content-encoding"),
                        response.headers.get("content-length"),
                        limit,
                    )
                    return response.status_code, await read_bounded(response, limit)
            except httpx.HTTPError as exc:
                raise transport_failure(
                    exc, origin=self._origin, got_head=progress.got_head
                ) from exc

        return await timed_exchange(
            send, payload, origin=self._origin, secret=secret, timeout_s=timeout_s
        )
