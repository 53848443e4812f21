"""``AsyncRegistryClient``: ``RegistryClient``'s operations on ``httpx.AsyncClient``.

The same methods, arguments, answers and errors as the synchronous client
(``kiln_registry.client.sync``), awaited: both build their requests and parse their
answers with ``client_ops``/``client_base``, and share the wait and download
logic of ``kiln_registry.client.jobs``.  ``iter_teachers``/``iter_jobs`` are
async iterators; ``wait_job``'s ``on_progress`` may be a plain function or a
coroutine function; a downloaded corpus is verified in a worker thread so the
event loop keeps running.  Imports httpx and the ``client_*`` modules only;
nothing happens at import time.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx

from kiln_registry.api.jobs_schemas import DeleteJobResponse, JobPublic, JobsListResponse
from kiln_registry.api.schemas import (
    DeleteTeacherResponse,
    HealthResponse,
    ProbeReceipt,
    ProbeReportPublic,
    ReadyResponse,
    TeacherEntry,
    TeachersListResponse,
)
from kiln_registry.auth.wire import AuditEvent, ReleaseResponse
from kiln_registry.client import base as base
from kiln_registry.client import ops as ops
from kiln_registry.client.base import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT_S,
    MAX_RESPONSE_BYTES,
    MAX_RESULT_BYTES,
    ClientSettings,
)
from kiln_registry.client.jobs import (
    DownloadedCorpus,
    ProgressCallback,
    ResultSink,
    Waiter,
    check_verifiable,
)

T = TypeVar("T")


class AsyncRegistryClient:
    """``async with AsyncRegistryClient(url) as client: await client.list_teachers()``."""

    def __init__(
        self,
        base_url: str = DEFAULT_SERVER,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        trust_env: bool = False,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        token: str | None = None,
        token_env: str | None = None,
        ca_file: Path | None = None,
        client_cert: tuple[Path, Path] | None = None,
    ) -> None:
        settings = ClientSettings.build(
            base_url,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
            token=token,
            token_env=token_env,
            ca_file=ca_file,
            client_cert=client_cert,
        )
        self.base_url = settings.base_url
        self._limit = settings.max_response_bytes
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(settings.timeout),
            transport=transport,
            trust_env=trust_env,
            follow_redirects=False,
            headers=settings.headers,
            verify=settings.verify,
        )

    def __repr__(self) -> str:
        return f"AsyncRegistryClient(base_url={self.base_url!r})"

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

    # -- system and teachers ------------------------------------------------

    async def health(self) -> HealthResponse:
        return await self._run(ops.health())

    async def ready(self) -> ReadyResponse:
        return await self._run(ops.ready())

    async def teachers_page(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> TeachersListResponse:
        return await self._run(ops.teachers_page(limit, cursor))

    async def iter_teachers(self, *, page_size: int | None = None) -> AsyncIterator[TeacherEntry]:
        pager = base.Pager()
        while not pager.done:
            page = await self.teachers_page(limit=page_size, cursor=pager.cursor)
            for entry in page.teachers:
                yield entry
            pager.advance(page.next_cursor)

    async def list_teachers(self) -> list[TeacherEntry]:
        return [entry async for entry in self.iter_teachers()]

    async def get_teacher(self, alias: str) -> TeacherEntry:
        return await self._run(ops.get_teacher(alias))

    async def register_teacher(
        self,
        *,
        alias: str,
        kind: str,
        provider: str | None = None,
        model_id: str | None = None,
        url: str | None = None,
        credential_id: str | None = None,
        notes: str | None = None,
        adapter: str | None = None,
        launch_profile: str | None = None,
    ) -> TeacherEntry:
        fields = {"alias": alias, "kind": kind, "provider": provider, "model_id": model_id,
                  "url": url, "credential_id": credential_id, "notes": notes,
                  "adapter": adapter, "launch_profile": launch_profile}  # fmt: skip
        return await self._run(ops.register_teacher(fields))

    async def delete_teacher(self, alias: str) -> DeleteTeacherResponse:
        return await self._run(ops.delete_teacher(alias))

    async def probe_teacher(self, alias: str) -> ProbeReportPublic:
        return await self._run(ops.probe_teacher(alias))

    async def launch_teacher(self, alias: str) -> TeacherEntry:
        return await self._run(ops.launch_teacher(alias))

    async def receipts(self, alias: str, *, limit: int = 100) -> list[ProbeReceipt]:
        return await self._run(ops.receipts(alias, limit))

    async def audit(self, *, limit: int = 100, before: int | None = None) -> list[AuditEvent]:
        return await self._run(ops.audit(limit, before))

    async def release_alias(self, alias: str) -> ReleaseResponse:
        return await self._run(ops.release_alias(alias))

    # -- jobs ---------------------------------------------------------------

    async def submit_job(
        self,
        *,
        teacher: str,
        top_k: int,
        sequences: list[list[int]] | None = None,
        corpus: str | None = None,
    ) -> JobPublic:
        return await self.submit(ops.scoring_job_body(teacher, top_k, sequences, corpus))

    async def submit(self, body: Mapping[str, object]) -> JobPublic:
        return await self._run(ops.submit_job(body))

    async def jobs_page(
        self, *, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> JobsListResponse:
        return await self._run(ops.jobs_page(status, limit, cursor))

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

    async def get_job(self, job_id: str) -> JobPublic:
        return await self._run(ops.get_job(job_id))

    async def cancel_job(self, job_id: str) -> JobPublic:
        return await self._run(ops.cancel_job(job_id))

    async def delete_job(self, job_id: str) -> DeleteJobResponse:
        """Remove a finished job with its result (``409 job_conflict`` while it runs)."""
        return await self._run(ops.delete_job(job_id))

    async def wait_job(
        self,
        job_id: str,
        *,
        interval: float = 0.5,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> JobPublic:
        """Poll until a terminal status; ``on_progress`` (sync or async) on each change."""
        waiter = Waiter(job_id, interval, timeout, on_progress)
        while True:
            job = await self.get_job(job_id)
            pending = waiter.observe(job)
            if inspect.isawaitable(pending):
                await pending
            if waiter.finished(job):
                return job
            await asyncio.sleep(interval)

    async def signing_keys(self) -> dict[str, Any]:
        return await self._run(ops.signing_keys(self.base_url))

    async def download_result(
        self,
        job_id: str,
        output: Path,
        *,
        verify: bool = True,
        keys: dict[str, Any] | None = None,
        max_bytes: int = MAX_RESULT_BYTES,
    ) -> DownloadedCorpus:
        """As ``RegistryClient.download_result``; file work runs in a worker thread."""
        path = ops.result_path(job_id)
        if verify:
            check_verifiable(await self.get_job(job_id))
        if verify and keys is None:
            keys = await self.signing_keys()
        sink = await asyncio.to_thread(ResultSink, Path(output), max_bytes)
        try:
            headers = await self._stream_into(path, sink.write)
            digest = await asyncio.to_thread(sink.check_stream, headers)
            summary = await asyncio.to_thread(sink.verify, keys if verify else None)
            return await asyncio.to_thread(sink.commit, digest, summary)
        finally:
            await asyncio.to_thread(sink.discard)

    # -- the one place bytes move -------------------------------------------

    async def _run(self, op: base.Call[T]) -> T:
        content, headers = op.content()
        try:
            async with self._http.stream(
                op.method, op.path, content=content, headers=headers
            ) as resp:
                raw = await self._read(resp)
                return base.interpret(op, resp.status_code, raw, resp.headers)
        except httpx.TimeoutException as exc:
            raise base.unreachable(self.base_url, f"timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise base.unreachable(self.base_url, f"failed ({type(exc).__name__})") from exc

    async def _stream_into(self, path: str, write: Callable[[bytes], None]) -> httpx.Headers:
        try:
            async with self._http.stream("GET", path) as resp:
                if resp.status_code != 200:
                    base.check_status(resp.status_code, await self._read(resp), resp.headers)
                    raise base.invalid(f"GET {path} answered HTTP {resp.status_code}")
                async for chunk in resp.aiter_raw():
                    write(chunk)
                return resp.headers
        except httpx.TimeoutException as exc:
            raise base.unreachable(self.base_url, f"timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise base.unreachable(self.base_url, f"failed ({type(exc).__name__})") from exc

    async def _read(self, response: httpx.Response) -> bytes:
        error = base.declared_too_large(response.headers, self._limit)
        if error is not None:
            raise error
        body = bytearray()
        async for chunk in response.aiter_raw():
            if len(body) + len(chunk) > self._limit:
                raise base.too_large(self._limit)
            body += chunk
        return bytes(body)
