"""Phase (d)'s shared loop: a claimed job's rows, requested concurrently, written in order.

``OrderedPipeline`` is what teacher scoring (``jobs.scoring.pipeline``) and
off-policy generation (``jobs.generation.pipeline``) have in common.  Rows are read
from the job in pages; with the cache on, each page's hits are looked up in
the same transaction.  Misses are requested with at most ``[jobs]
concurrency`` requests in flight, and results are written in input order
through a bounded reorder window, so memory does not grow with the job.
Verified results are committed to the cache in small batches together with
the progress counters (and the durable cancel flag is read back then).  When
any answer fails, every outstanding request is cancelled, the unflushed batch
is dropped and the partial corpus deleted by the caller (``discard``).  The
corpus is built in a partial file named for this claim (``claim_tag``), sealed
(signed, fsynced), and renamed into place inside the one transaction that
marks the job ``succeeded`` only if this worker's claim still holds: a worker
whose lease was taken over (frozen, partitioned) never publishes over the new
holder's corpus, and the job's result is recorded exactly once.  A subclass
says how rows are read, requested, cached and written.

Imports: standard library, ``kiln_registry.db`` and ``jobs``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import deque
from pathlib import Path
from typing import ClassVar, Final, Generic, Protocol, TypeVar

from sqlalchemy.orm import Session

from kiln_registry.db.repository import unit_of_work
from kiln_registry.domain.vocabulary import JobStatus
from kiln_registry.jobs.core.lease_repository import DeviceLeases
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.core.service import result_root
from kiln_registry.jobs.core.state import ClaimedJob, ClaimLost

log = logging.getLogger("kiln_registry.jobs")

# A flush is one write transaction (cache rows, fenced progress update, cancel flag read):
# 3-8 ms of registry CPU, about 5% of a cold job's (bench/RESULTS.md, job queue).  It stays
# at every 64 rows or 0.5 s: progress shows within a second (the fault tests freeze or kill
# a worker once a job shows progress) and a cancellation made through another process
# arrives within FLUSH_SECONDS while answers arrive.
FLUSH_ROWS: Final = 64
FLUSH_SECONDS: Final = 0.5


class Row(Protocol):
    @property
    def idx(self) -> int: ...

    @property
    def token_sha256(self) -> str: ...


class Writer(Protocol):
    @property
    def final(self) -> Path: ...

    @property
    def partial(self) -> Path: ...

    def seal(self) -> tuple[str, int]: ...

    def publish(self) -> None: ...

    def discard(self) -> None: ...


RowT = TypeVar("RowT", bound=Row)
ResultT = TypeVar("ResultT")
WriterT = TypeVar("WriterT", bound=Writer)


class _Abandoned(Exception):
    """An earlier row failed; this one never sent its request."""


class OrderedPipeline(Generic[RowT, ResultT, WriterT]):
    """Runs one claimed job's rows through ``_request`` and publishes its corpus."""

    page_size: ClassVar[int]
    noun: ClassVar[str]  # what a row is, in the log line ("sequences", "prompts")

    def __init__(self, claimed: ClaimedJob, *, use_cache: bool) -> None:
        self.claimed = claimed
        self.use_cache = use_cache
        self.gate = asyncio.Semaphore(claimed.env.config.jobs.concurrency)
        self.window = 4 * claimed.env.config.jobs.concurrency + 8
        self.writer: WriterT | None = None
        self.pending: list[tuple[str, ResultT]] = []
        self.failure: BaseException | None = None  # the first request's failure

    # -- what a subclass says -----------------------------------------------

    def _open_writer(self, final: Path) -> WriterT:
        raise NotImplementedError

    def _rows(self, session: Session, after: int) -> list[RowT]:
        raise NotImplementedError

    def _lookup(self, session: Session, shas: list[str]) -> dict[str, ResultT]:
        raise NotImplementedError

    def _store(self, session: Session, pending: list[tuple[str, ResultT]]) -> None:
        raise NotImplementedError

    async def _request(self, row: RowT) -> ResultT:
        raise NotImplementedError

    def _write(self, writer: WriterT, row: RowT, result: ResultT) -> None:
        raise NotImplementedError

    def _hit(self, row: RowT, hits: dict[str, ResultT]) -> ResultT | None:
        return hits.get(row.token_sha256)

    async def _settle(self, row: RowT, result: ResultT) -> ResultT:
        """A requested result about to be written: kept, or replaced (replica fencing)."""
        return result

    def _requested(self, seconds: float) -> None:
        """One row answered by a request (after ``seconds``)."""

    def _cached(self) -> None:
        """One row answered from the cache."""

    # -- the loop -----------------------------------------------------------

    @property
    def claim_tag(self) -> str:
        """Names this claim's partial files: two holders of one job never share a file."""
        return hashlib.sha256(self.claimed.token.encode("utf-8")).hexdigest()[:16]

    def discard(self) -> None:
        """Drop this claim's partial corpus and the uncommitted results."""
        if self.writer is not None:
            self.writer.discard()
            self.writer = None
        self.pending.clear()

    async def run(self) -> None:
        final = result_root(self.claimed.env.config) / f"{self.claimed.job.id}.jsonl"
        self.writer = await asyncio.to_thread(self._open_writer, final)
        after = -1
        while True:
            rows, hits = await asyncio.to_thread(self._page, after)
            if not rows:
                break
            await self._run_page(rows, hits)
            after = rows[-1].idx
        await self._publish()

    def _page(self, after: int) -> tuple[list[RowT], dict[str, ResultT]]:
        with unit_of_work(self.claimed.env.sessions) as session:
            rows = self._rows(session, after)
            if not self.use_cache or not rows:
                return rows, {}
            return rows, self._lookup(session, [r.token_sha256 for r in rows])

    def _flush(self) -> None:
        pending = list(self.pending)
        progress = self.claimed.progress
        with unit_of_work(self.claimed.env.sessions) as session:
            if self.use_cache:
                self._store(session, pending)
            repo = JobRepository(session)
            job_id, token = self.claimed.job.id, self.claimed.token
            if not repo.update_claimed(job_id, token, **progress.counters()):
                raise ClaimLost(job_id)
            if repo.cancel_requested(job_id):
                self.claimed.cancel.set()
        del self.pending[: len(pending)]
        progress.flushed_at = time.monotonic()

    async def _one(self, row: RowT) -> ResultT:
        async with self.gate:
            if self.failure is not None:
                raise _Abandoned
            self.claimed.check_cancel()
            started = time.perf_counter()
            try:
                result = await self._request(row)
            except BaseException as exc:
                # Set before the gate opens: no queued row starts a request after it.
                if self.failure is None:
                    self.failure = exc
                raise
            self._requested(time.perf_counter() - started)
            return result

    def count_request(self) -> None:
        self.claimed.progress.requests += 1

    def count_retry(self) -> None:
        self.claimed.progress.retries += 1

    async def _run_page(self, rows: list[RowT], hits: dict[str, ResultT]) -> None:
        queue: deque[tuple[RowT, ResultT | asyncio.Task[ResultT]]] = deque()
        try:
            for row in rows:
                self.claimed.check_cancel()
                hit = self._hit(row, hits)
                queue.append((row, hit if hit is not None
                              else asyncio.create_task(self._one(row))))  # fmt: skip
                while len(queue) > self.window:
                    await self._drain(queue)
            while queue:
                await self._drain(queue)
        except BaseException:
            tasks = [item for _, item in queue if isinstance(item, asyncio.Task)]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _drain(self, queue: deque[tuple[RowT, ResultT | asyncio.Task[ResultT]]]) -> None:
        row, item = queue[0]
        progress = self.claimed.progress
        if isinstance(item, asyncio.Task):
            try:
                result = await self._settle(row, await item)
            except _Abandoned:
                # A redo (its replica fenced since it answered) asked after a later row
                # failed: that failure, not the abandoned redo, is the job's.
                if self.failure is None:
                    raise
                raise self.failure from None
            self.pending.append((row.token_sha256, result))
            progress.scored += 1
        else:
            result = item
            progress.cache_hits += 1
            self._cached()
        queue.popleft()
        assert self.writer is not None
        self._write(self.writer, row, result)
        due = time.monotonic() - progress.flushed_at > FLUSH_SECONDS
        if len(self.pending) >= FLUSH_ROWS or due:
            await asyncio.to_thread(self._flush)
            self.claimed.check_cancel()

    async def _publish(self) -> None:
        self.claimed.check_cancel()
        self.claimed.check_lease()
        assert self.writer is not None
        sha, size = await asyncio.to_thread(self.writer.seal)
        await self._committed(self.writer.partial, sha)
        await asyncio.to_thread(self._succeed, self.writer, sha, size)
        self.writer = None

    async def _committed(self, path: Path, sha256: str) -> None:
        """After the corpus is sealed (``path``: this claim's partial file), before the job
        succeeds and the corpus is published (a failure fails the job)."""

    def _succeed(self, writer: WriterT, sha: str, size: int) -> None:
        """Record the result and rename it into place in one transaction, if still ours.

        The conditional update runs under the database's write lock, so no other worker
        can take the job over between the proof and the rename; a failed commit leaves a
        file nobody's row points at, which the job's next holder renames over.
        """
        claimed = self.claimed
        with unit_of_work(claimed.env.sessions) as session:
            if self.use_cache:
                self._store(session, list(self.pending))
            done = JobRepository(session).finish(
                claimed.job.id, claimed.token, JobStatus.succeeded.value,
                result_path=str(writer.final), result_sha256=sha, result_bytes=size,
                **claimed.progress.counters(),
            )  # fmt: skip
            if not done:
                raise ClaimLost(claimed.job.id)
            DeviceLeases(session, claimed.devices).release(claimed.job.id, claimed.token)
            writer.publish()
        self.pending.clear()
        total = claimed.progress.scored + claimed.progress.cache_hits
        log.info("job %s succeeded: %d %s, %d from the cache", claimed.job.id, total,
                 self.noun, claimed.progress.cache_hits)  # fmt: skip
