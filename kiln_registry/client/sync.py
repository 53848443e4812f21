"""The typed, synchronous registry client: teachers, jobs, keys and the admin routes.

Owns ``RegistryClient``: one method per API operation (the operations
themselves, their paths, bodies and answer parsing, live in
``kiln_registry.client.ops``, shared with ``AsyncRegistryClient`` in
``kiln_registry.client.asynchronous``), plus paging (``iter_teachers``,
``iter_jobs`` follow ``next_cursor``), ``wait_job`` with a progress callback,
and ``download_result``, which streams a corpus to disk and verifies it
(``kiln_registry.client.jobs``).  Every failure is a ``RegistryClientError``
(or an ``InputError`` for an argument refused before anything is sent);
response bodies are read bounded and validated into the wire schemas, never
half-trusted.

Transport rules: redirects are never followed (a 3xx is an error), proxy and
certificate settings are taken from the environment only when
``trust_env=True`` is asked for, and the base URL may not carry userinfo, a
query or a fragment.  Access (issue 15): ``token`` (else the variable
``token_env`` names, else ``$KILN_TOKEN``) is sent as ``Authorization:
Bearer`` (never in ``repr`` or an error); TLS is verified against the system
store or ``ca_file``, with ``client_cert`` (cert, key) for mutual TLS
(``kiln_registry.client.tls``).  Imports httpx, pydantic and the
``client_*`` modules; never FastAPI, the database, the probe or the
launcher.  Nothing happens at import time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

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
    MAX_RECEIPTS,
    MAX_RESPONSE_BYTES,
    MAX_RESULT_BYTES,
    ClientSettings,
    RegistryClientError,
    alias_path,
    check_base_url,
)
from kiln_registry.client.jobs import (
    DownloadedCorpus,
    ProgressCallback,
    ResultSink,
    Waiter,
    check_verifiable,
)

__all__ = [
    "DEFAULT_SERVER",
    "DEFAULT_TIMEOUT_S",
    "MAX_RECEIPTS",
    "MAX_RESPONSE_BYTES",
    "DownloadedCorpus",
    "RegistryClient",
    "RegistryClientError",
    "alias_path",
    "check_base_url",
]

T = TypeVar("T")


class RegistryClient:
    """``with RegistryClient("http://127.0.0.1:8420") as client: client.list_teachers()``."""

    def __init__(
        self,
        base_url: str = DEFAULT_SERVER,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
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
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(settings.timeout),
            transport=transport,
            trust_env=trust_env,
            follow_redirects=False,
            headers=settings.headers,
            verify=settings.verify,
        )

    def __repr__(self) -> str:
        return f"RegistryClient(base_url={self.base_url!r})"

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- system -------------------------------------------------------------

    def health(self) -> HealthResponse:
        return self._run(ops.health())

    def ready(self) -> ReadyResponse:
        return self._run(ops.ready())

    # -- teachers -----------------------------------------------------------

    def teachers_page(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> TeachersListResponse:
        """One page of ``GET /v1/teachers`` (pass its ``next_cursor`` for the next)."""
        return self._run(ops.teachers_page(limit, cursor))

    def iter_teachers(self, *, page_size: int | None = None) -> Iterator[TeacherEntry]:
        """Every registered teacher, ordered by alias, page after page."""
        pager = base.Pager()
        while not pager.done:
            page = self.teachers_page(limit=page_size, cursor=pager.cursor)
            yield from page.teachers
            pager.advance(page.next_cursor)

    def list_teachers(self) -> list[TeacherEntry]:
        """Every registered teacher (all pages)."""
        return list(self.iter_teachers())

    def get_teacher(self, alias: str) -> TeacherEntry:
        return self._run(ops.get_teacher(alias))

    def register_teacher(
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
        """``POST /v1/teachers``; fields left as None are not sent (the server validates)."""
        fields = {"alias": alias, "kind": kind, "provider": provider, "model_id": model_id,
                  "url": url, "credential_id": credential_id, "notes": notes,
                  "adapter": adapter, "launch_profile": launch_profile}  # fmt: skip
        return self._run(ops.register_teacher(fields))

    def delete_teacher(self, alias: str) -> DeleteTeacherResponse:
        return self._run(ops.delete_teacher(alias))

    def probe_teacher(self, alias: str) -> ProbeReportPublic:
        """Re-run the probes against the stored identity; returns the probe report."""
        return self._run(ops.probe_teacher(alias))

    def launch_teacher(self, alias: str) -> TeacherEntry:
        """Relaunch an ``unavailable`` local alias with its stored identity."""
        return self._run(ops.launch_teacher(alias))

    def receipts(self, alias: str, *, limit: int = 100) -> list[ProbeReceipt]:
        return self._run(ops.receipts(alias, limit))

    # -- admin --------------------------------------------------------------

    def audit(self, *, limit: int = 100, before: int | None = None) -> list[AuditEvent]:
        """``GET /v1/audit`` (admin): state changes, newest first."""
        return self._run(ops.audit(limit, before))

    def release_alias(self, alias: str) -> ReleaseResponse:
        """Free a deleted (reserved) alias (admin)."""
        return self._run(ops.release_alias(alias))

    # -- jobs ---------------------------------------------------------------

    def submit_job(
        self,
        *,
        teacher: str,
        top_k: int,
        sequences: list[list[int]] | None = None,
        corpus: str | None = None,
    ) -> JobPublic:
        """Queue a ``teacher_scoring`` job over inline ``sequences`` or a server-side ``corpus``."""
        return self.submit(ops.scoring_job_body(teacher, top_k, sequences, corpus))

    def submit(self, body: Mapping[str, object]) -> JobPublic:
        """``POST /v1/jobs`` with a complete body (any job kind the server knows)."""
        return self._run(ops.submit_job(body))

    def jobs_page(
        self, *, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> JobsListResponse:
        """One page of ``GET /v1/jobs``, newest first."""
        return self._run(ops.jobs_page(status, limit, cursor))

    def iter_jobs(
        self, *, status: str | None = None, page_size: int | None = None
    ) -> Iterator[JobPublic]:
        """Every job (of ``status``), newest first, following ``next_cursor``."""
        pager = base.Pager()
        while not pager.done:
            page = self.jobs_page(status=status, limit=page_size, cursor=pager.cursor)
            yield from page.jobs
            pager.advance(ops.next_cursor(page))

    def list_jobs(self, *, status: str | None = None, limit: int = 100) -> list[JobPublic]:
        """The newest ``limit`` jobs (of ``status``): the first page."""
        return self.jobs_page(status=status, limit=limit).jobs

    def get_job(self, job_id: str) -> JobPublic:
        return self._run(ops.get_job(job_id))

    def cancel_job(self, job_id: str) -> JobPublic:
        return self._run(ops.cancel_job(job_id))

    def delete_job(self, job_id: str) -> DeleteJobResponse:
        """Remove a finished job with its result (``409 job_conflict`` while it runs)."""
        return self._run(ops.delete_job(job_id))

    def wait_job(
        self,
        job_id: str,
        *,
        interval: float = 0.5,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> JobPublic:
        """Poll until the job succeeded, failed or was cancelled; ``on_progress`` on changes."""
        waiter = Waiter(job_id, interval, timeout, on_progress)
        while True:
            job = self.get_job(job_id)
            waiter.observe(job)
            if waiter.finished(job):
                return job
            time.sleep(interval)

    def signing_keys(self) -> dict[str, Any]:
        """The registry's corpus-signing public keys by key id (``GET /v1/keys``)."""
        return self._run(ops.signing_keys(self.base_url))

    def download_result(
        self,
        job_id: str,
        output: Path,
        *,
        verify: bool = True,
        keys: dict[str, Any] | None = None,
        max_bytes: int = MAX_RESULT_BYTES,
    ) -> DownloadedCorpus:
        """Stream the job's corpus into ``output`` (parents created), verified, atomically.

        With ``verify`` (the default) the corpus is checked against ``keys``
        (default: this registry's ``GET /v1/keys``) before it is renamed into
        place; a corpus that fails is never left at ``output``.
        """
        path = ops.result_path(job_id)
        if verify:
            check_verifiable(self.get_job(job_id))
        if verify and keys is None:
            keys = self.signing_keys()
        sink = ResultSink(Path(output), max_bytes)
        try:
            headers = self._stream_into(path, sink.write)
            digest = sink.check_stream(headers)
            summary = sink.verify(keys if verify else None)
            return sink.commit(digest, summary)
        finally:
            sink.discard()

    def stream_result(self, job_id: str, sink: BinaryIO) -> int:
        """Copy the job's corpus into ``sink`` unverified; the bytes written."""
        written = [0]

        def write(chunk: bytes) -> None:
            sink.write(chunk)
            written[0] += len(chunk)

        self._stream_into(ops.result_path(job_id), write)
        return written[0]

    # -- the one place bytes move -------------------------------------------

    def _run(self, op: base.Call[T]) -> T:
        content, headers = op.content()
        try:
            with self._http.stream(op.method, op.path, content=content, headers=headers) as resp:
                raw = self._read(resp)
                return base.interpret(op, resp.status_code, raw, resp.headers)
        except httpx.TimeoutException as exc:
            raise base.unreachable(self.base_url, f"timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise base.unreachable(self.base_url, f"failed ({type(exc).__name__})") from exc

    def _stream_into(self, path: str, write: Callable[[bytes], None]) -> httpx.Headers:
        try:
            with self._http.stream("GET", path) as resp:
                if resp.status_code != 200:
                    base.check_status(resp.status_code, self._read(resp), resp.headers)
                    raise base.invalid(f"GET {path} answered HTTP {resp.status_code}")
                for chunk in resp.iter_raw():
                    write(chunk)
                return resp.headers
        except httpx.TimeoutException as exc:
            raise base.unreachable(self.base_url, f"timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise base.unreachable(self.base_url, f"failed ({type(exc).__name__})") from exc

    def _read(self, response: httpx.Response) -> bytes:
        error = base.declared_too_large(response.headers, self._limit)
        if error is not None:
            raise error
        body = bytearray()
        for chunk in response.iter_raw():
            if len(body) + len(chunk) > self._limit:
                raise base.too_large(self._limit)
            body += chunk
        return bytes(body)
