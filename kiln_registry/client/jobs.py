"""Job helpers shared by both registry clients: waiting and verified result downloads.

``Waiter`` decides, poll by poll, whether ``wait`` goes on (a terminal
status ends it, a deadline refuses it with ``client.wait_timeout``) and calls
the progress callback whenever the job's status or progress changed.

``ResultSink`` receives a corpus as it streams in: it creates the output's
parent directory, writes a hidden ``.<name>.partial`` file beside the output,
hashes it, and on ``finish`` checks the byte count and the SHA-256 the
registry announced (``x-kiln-result-sha256``), verifies the corpus with
``jobs.kinds.verify_corpus`` against the registry's signing keys
(signature trailer, manifest, every line), fsyncs, and only then renames it
into place (and fsyncs the directory).  An off-policy generation corpus
(which Kiln reads line by line, so its signature is detached) comes with its
trailer line in ``x-kiln-corpus-signature``: the sink writes it to
``<partial>.sig`` so the same verifier finds it, and renames it to
``<output>.sig`` before the corpus.  Any failure removes the partial
files; the output is never a half-written or unverified corpus.

``Waiter`` and ``Download`` are the ``client.base.Request``s behind
``wait_job`` and ``download_result``: each runs on either client.

Imports the standard library, ``client.base`` and (lazily, since it brings
numpy) ``jobs.kinds``; never httpx or FastAPI.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln_registry.client.base import TERMINAL, AwaitingClient, BlockingClient, Request, invalid
from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.domain.vocabulary import JobKind
from kiln_registry.wire.jobs import JobPublic

if TYPE_CHECKING:
    from kiln_registry.jobs.scoring.corpus_signed import CorpusSummary

ProgressCallback = Callable[[JobPublic], object]
MAX_WAIT_S = 7 * 24 * 3600.0


class WaitTimeout(KilnError):
    status = 504
    code = "job_wait_timeout"


@dataclass(frozen=True)
class DownloadedCorpus:
    """A verified corpus on disk: where, how many bytes, its SHA-256 and what it holds."""

    path: Path
    bytes: int
    sha256: str
    summary: CorpusSummary | None


class Waiter(Request[JobPublic]):
    """``wait_job``: polls until a terminal status, calling back on each change."""

    def __init__(
        self,
        job_id: str,
        interval: float,
        timeout: float | None,
        on_progress: ProgressCallback | None,
    ) -> None:
        if not 0 < interval <= 3600:
            raise InputError("wait interval must be in (0, 3600] seconds", rule="client.interval")
        if timeout is not None and not 0 < timeout <= MAX_WAIT_S:
            raise InputError("wait timeout must be in (0, 7 days]", rule="client.wait_timeout")
        self.job_id = job_id
        self.interval = interval
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._timeout = timeout
        self._callback = on_progress
        self._last: tuple[object, ...] | None = None

    def observe(self, job: JobPublic) -> object:
        """Note one poll; the callback's return value (awaited by the async client)."""
        key = (job.status, job.progress, job.error, job.result)
        result: object = None
        if key != self._last and self._callback is not None:
            result = self._callback(job)
        self._last = key
        return result

    def finished(self, job: JobPublic) -> bool:
        if job.status in TERMINAL:
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise WaitTimeout(
                f"job {self.job_id} is still {job.status} after {self._timeout:g} s",
                rule="client.wait_timeout",
                hint="wait again, or cancel it with `kiln jobs cancel`",
            )
        return False

    def blocking(self, client: BlockingClient) -> JobPublic:
        while True:
            job = client.get_job(self.job_id)
            self.observe(job)
            if self.finished(job):
                return job
            time.sleep(self.interval)

    async def awaiting(self, client: AwaitingClient) -> JobPublic:
        while True:
            job = await client.get_job(self.job_id)
            pending = self.observe(job)
            if inspect.isawaitable(pending):
                await pending
            if self.finished(job):
                return job
            await asyncio.sleep(self.interval)


VERIFIABLE_KINDS = (JobKind.teacher_scoring.value, JobKind.off_policy_generation.value)
SIGNATURE_HEADER = "x-kiln-corpus-signature"
MAX_SIGNATURE_CHARS = 1024


def check_verifiable(job: JobPublic) -> None:
    """The corpus kinds ``verify_corpus`` knows (trailer line, or detached signature)."""
    if job.kind not in VERIFIABLE_KINDS:
        raise InputError(
            f"job {job.id} is a {job.kind} job: this client verifies teacher_scoring and"
            " off_policy_generation corpora only",
            rule="client.verify_kind",
            hint="download it with verify=False and check its detached signature",
        )


class ResultSink:
    """A corpus streaming into ``output`` (see the module docstring)."""

    def __init__(self, output: Path, limit: int) -> None:
        self.output = output
        self._limit = limit
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(
                f"cannot create the directory {output.parent} ({exc.strerror})",
                rule="client.output",
            ) from None
        if output.is_dir():
            raise InputError(f"{output} is a directory; name a file", rule="client.output")
        self.partial = output.with_name(f".{output.name}.partial")
        self._handle = self.partial.open("wb")
        self._sha = hashlib.sha256()
        self.written = 0

    def write(self, chunk: bytes) -> None:
        if self.written + len(chunk) > self._limit:
            raise invalid(f"the result is larger than {self._limit} bytes")
        self._handle.write(chunk)
        self._sha.update(chunk)
        self.written += len(chunk)

    def check_stream(self, headers: Any) -> str:
        """The bytes match the announced length and SHA-256; the SHA-256."""
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        digest = self._sha.hexdigest()
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) != self.written:
            raise invalid(f"the result ended after {self.written} of {declared} bytes")
        announced = headers.get("x-kiln-result-sha256", "")
        if announced and announced != digest:
            raise invalid("the downloaded result does not hash to the SHA-256 the registry sent")
        signature = headers.get(SIGNATURE_HEADER)
        if signature is not None:
            if len(signature) > MAX_SIGNATURE_CHARS or not signature.isascii():
                raise invalid(f"the {SIGNATURE_HEADER} header is not a signature trailer line")
            self._sig(self.partial).write_text(signature + "\n", encoding="ascii")
        return digest

    def _sig(self, corpus: Path) -> Path:
        return corpus.with_name(corpus.name + ".sig")

    def verify(self, keys: dict[str, Any] | None) -> CorpusSummary | None:
        if keys is None:
            return None
        from kiln_registry.jobs.kinds import verify_corpus

        return verify_corpus(self.partial, keys)

    def commit(self, digest: str, summary: CorpusSummary | None) -> DownloadedCorpus:
        sig = self._sig(self.partial)
        if sig.exists():
            _fsync_file(sig)
            os.replace(sig, self._sig(self.output))
        os.replace(self.partial, self.output)
        fd = os.open(self.output.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return DownloadedCorpus(self.output, self.written, digest, summary)

    def discard(self) -> None:
        self._handle.close()
        self.partial.unlink(missing_ok=True)
        self._sig(self.partial).unlink(missing_ok=True)


@dataclass(frozen=True)
class Download(Request[DownloadedCorpus]):
    """``download_result``: the job checked, the keys fetched, the corpus streamed and verified.

    The async client runs the file work (open, hash check, verification,
    rename) in a worker thread so its event loop keeps running.
    """

    job_id: str
    path: str
    output: Path
    verify: bool
    keys: dict[str, Any] | None
    max_bytes: int

    def blocking(self, client: BlockingClient) -> DownloadedCorpus:
        keys = self.keys
        if self.verify:
            check_verifiable(client.get_job(self.job_id))
        if self.verify and keys is None:
            keys = client.signing_keys()
        sink = ResultSink(self.output, self.max_bytes)
        try:
            headers = client._stream_into(self.path, sink.write)
            digest = sink.check_stream(headers)
            summary = sink.verify(keys if self.verify else None)
            return sink.commit(digest, summary)
        finally:
            sink.discard()

    async def awaiting(self, client: AwaitingClient) -> DownloadedCorpus:
        keys = self.keys
        if self.verify:
            check_verifiable(await client.get_job(self.job_id))
        if self.verify and keys is None:
            keys = await client.signing_keys()
        sink = await asyncio.to_thread(ResultSink, self.output, self.max_bytes)
        try:
            headers = await client._stream_into(self.path, sink.write)
            digest = await asyncio.to_thread(sink.check_stream, headers)
            summary = await asyncio.to_thread(sink.verify, keys if self.verify else None)
            return await asyncio.to_thread(sink.commit, digest, summary)
        finally:
            await asyncio.to_thread(sink.discard)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
