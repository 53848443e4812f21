"""``AsyncRegistryClient``: ``RegistryClient``'s operations on ``httpx.AsyncClient``.

The same methods, arguments, answers and errors as the synchronous client
(``kiln_registry.client.sync``), awaited: both take their one-request
operations from ``client.core``'s table (built on ``client.ops`` and
``client.base``), and share the wait and download logic of
``kiln_registry.client.jobs``.  ``iter_teachers``/``iter_jobs`` are async
iterators; ``wait_job``'s ``on_progress`` may be a plain function or a
coroutine function; a downloaded corpus is verified in a worker thread so the
event loop keeps running.  Imports httpx and the ``client.*`` modules only;
nothing happens at import time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import ClassVar, TypeVar

import httpx

from kiln_registry.client import base as base
from kiln_registry.client import ops as ops
from kiln_registry.client.core import Awaiting, BoundedBody, translate_errors
from kiln_registry.wire.jobs import JobPublic
from kiln_registry.wire.teachers import TeacherEntry

T = TypeVar("T")


class AsyncRegistryClient(Awaiting):
    """``async with AsyncRegistryClient(url) as client: await client.list_teachers()``."""

    _label: ClassVar[str] = "AsyncRegistryClient"

    async def __aenter__(self) -> AsyncRegistryClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def iter_teachers(self, *, page_size: int | None = None) -> AsyncIterator[TeacherEntry]:
        pager = base.Pager()
        while not pager.done:
            page = await self.teachers_page(limit=page_size, cursor=pager.cursor)
            for entry in page.teachers:
                yield entry
            pager.advance(page.next_cursor)

    async def list_teachers(self) -> list[TeacherEntry]:
        return [entry async for entry in self.iter_teachers()]

    async def iter_jobs(
        self, *, status: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[JobPublic]:
        pager = base.Pager()
        while not pager.done:
            page = await self.jobs_page(status=status, limit=page_size, cursor=pager.cursor)
            for job in page.jobs:
                yield job
            pager.advance(ops.next_cursor(page))

    async def list_jobs(self, *, status: str | None = None, limit: int = 100) -> list[JobPublic]:
        return (await self.jobs_page(status=status, limit=limit)).jobs

    # -- the one place bytes move -------------------------------------------

    async def _run(self, op: base.Call[T]) -> T:
        content, headers = op.content()
        with translate_errors(self.base_url):
            async with self._http.stream(
                op.method, op.path, content=content, headers=headers
            ) as resp:
                raw = await self._read(resp)
                return base.interpret(op, resp.status_code, raw, resp.headers)

    async def _stream_into(self, path: str, write: Callable[[bytes], None]) -> httpx.Headers:
        with translate_errors(self.base_url):
            async with self._http.stream("GET", path) as resp:
                if resp.status_code != 200:
                    base.check_status(resp.status_code, await self._read(resp), resp.headers)
                    raise base.invalid(f"GET {path} answered HTTP {resp.status_code}")
                async for chunk in resp.aiter_raw():
                    write(chunk)
                return resp.headers

    async def _read(self, response: httpx.Response) -> bytes:
        body = BoundedBody(response.headers, self._limit)
        async for chunk in response.aiter_raw():
            body.add(chunk)
        return body.bytes()
