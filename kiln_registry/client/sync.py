"""The typed, synchronous registry client: teachers, jobs, keys and the admin routes.

Owns ``RegistryClient``: one method per API operation (the operations
themselves, their paths, bodies and answer parsing, live in
``kiln_registry.client.ops``; ``kiln_registry.client.core`` makes them methods
of this client and of ``AsyncRegistryClient``), plus paging (``iter_teachers``,
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
store or ``ca_file`` (else ``$KILN_CA_FILE``), with ``client_cert`` (cert, key;
else ``$KILN_CLIENT_CERT_FILE`` / ``$KILN_CLIENT_KEY_FILE``) for mutual TLS
(``kiln_registry.client.tls``).  Imports httpx, pydantic and the
``client_*`` modules; never FastAPI, the database, the probe or the
launcher.  Nothing happens at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import TracebackType
from typing import BinaryIO, ClassVar, TypeVar

import httpx

from kiln_registry.client import base as base
from kiln_registry.client import ops as ops
from kiln_registry.client.base import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT_S,
    MAX_RECEIPTS,
    MAX_RESPONSE_BYTES,
    RegistryClientError,
    alias_path,
    check_base_url,
)
from kiln_registry.client.core import Blocking, BoundedBody, translate_errors
from kiln_registry.client.jobs import DownloadedCorpus
from kiln_registry.wire.jobs import JobPublic
from kiln_registry.wire.teachers import TeacherEntry

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


class RegistryClient(Blocking):
    """``with RegistryClient("http://127.0.0.1:8420") as client: client.list_teachers()``.

    The operations (``health``, ``get_teacher``, ``submit_job``,
    ``wait_job``, ``download_result`` ...) come from ``client.core``'s table;
    the methods here page and stream.
    """

    _label: ClassVar[str] = "RegistryClient"

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
        with (
            translate_errors(self.base_url),
            self._http.stream(op.method, op.path, content=content, headers=headers) as resp,
        ):
            raw = self._read(resp)
            return base.interpret(op, resp.status_code, raw, resp.headers)

    def _stream_into(self, path: str, write: Callable[[bytes], None]) -> httpx.Headers:
        with translate_errors(self.base_url), self._http.stream("GET", path) as resp:
            if resp.status_code != 200:
                base.check_status(resp.status_code, self._read(resp), resp.headers)
                raise base.invalid(f"GET {path} answered HTTP {resp.status_code}")
            for chunk in resp.iter_raw():
                write(chunk)
            return resp.headers

    def _read(self, response: httpx.Response) -> bytes:
        body = BoundedBody(response.headers, self._limit)
        for chunk in response.iter_raw():
            body.add(chunk)
        return body.bytes()
