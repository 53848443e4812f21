"""Phase (d): scoring a claimed job's sequences into its identity-bound corpus.

Sequences are read from the job in pages; each page's cache hits are looked
up in one query (only for the job's identity and K).  Misses are scored with
at most ``[jobs] concurrency`` requests in flight, and results are written in
input order through a bounded reorder window, so memory does not grow with
the job.  Verified scores are committed to the cache in small batches
together with the progress counters (and the durable cancel flag is read
back then).  When any answer fails, every outstanding request is cancelled,
the unflushed batch is dropped and the partial corpus deleted by the caller.
The corpus is signed (once, over the digest taken while writing) and published
atomically before the job is marked ``succeeded``.

Imports: standard library, numpy, ``kiln_registry.db`` and ``jobs``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Final

import numpy as np
import numpy.typing as npt

from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs import cache as score_cache
from kiln_registry.jobs.cache import ScoredSequence
from kiln_registry.jobs.corpus import CorpusWriter, RowContext
from kiln_registry.jobs.leases import DeviceLeases
from kiln_registry.jobs.repository import JobRepository, SequenceItem
from kiln_registry.jobs.scoring import ScoringTarget, score_sequence
from kiln_registry.jobs.service import result_root
from kiln_registry.jobs.state import ClaimedJob, ClaimLost

log = logging.getLogger("kiln_registry.jobs")

PAGE_SIZE: Final = 1_000
FLUSH_ROWS: Final = 64
FLUSH_SECONDS: Final = 0.5

Tokens = npt.NDArray[np.int32]
# A sequence in the reorder window: its row, its ids, and its scores or the task scoring it.
Item = tuple[SequenceItem, Tokens, "ScoredSequence | asyncio.Task[ScoredSequence]"]


class _Abandoned(Exception):
    """An earlier sequence failed; this one never sent its request."""


class ScoringPipeline:
    """Scores one claimed job against ``target`` and publishes its corpus."""

    def __init__(self, claimed: ClaimedJob, target: ScoringTarget) -> None:
        self.claimed = claimed
        self.target = target
        self.use_cache = claimed.env.config.jobs.cache
        self.gate = asyncio.Semaphore(claimed.env.config.jobs.concurrency)
        self.window = 4 * claimed.env.config.jobs.concurrency + 8
        self.writer: CorpusWriter | None = None
        self.failed = False

    @property
    def _key(self) -> tuple[str, int]:
        return self.claimed.identity.digest(), self.claimed.job.top_k

    def discard(self) -> None:
        """Drop the partial corpus and the uncommitted scores."""
        if self.writer is not None:
            self.writer.discard()
            self.writer = None
        self.claimed.progress.pending.clear()

    async def run(self) -> None:
        job = self.claimed.job
        ctx = RowContext(job.id, job.teacher_alias, self.claimed.identity, job.top_k)
        final = result_root(self.claimed.env.config) / f"{job.id}.jsonl"
        signer = self.claimed.env.signer
        assert signer is not None, "JobWorkers.start loads the corpus-signing key"
        self.writer = await asyncio.to_thread(CorpusWriter, final, ctx, signer)
        after = -1
        while True:
            rows, hits = await asyncio.to_thread(self._page, after)
            if not rows:
                break
            await self._score_page(rows, hits)
            after = rows[-1].idx
        await self._publish()

    def _page(self, after: int) -> tuple[list[SequenceItem], dict[str, ScoredSequence]]:
        sessions = self.claimed.env.sessions
        with unit_of_work(sessions) as session:
            rows = JobRepository(session).sequences(
                self.claimed.job.id, after=after, limit=PAGE_SIZE
            )
        if not self.use_cache or not rows:
            return rows, {}
        with unit_of_work(sessions) as session:
            shas = [r.token_sha256 for r in rows]
            return rows, score_cache.lookup(session, *self._key, shas)

    def _flush(self) -> None:
        progress = self.claimed.progress
        pending = list(progress.pending)
        with unit_of_work(self.claimed.env.sessions) as session:
            repo = JobRepository(session)
            if self.use_cache:
                score_cache.store(session, *self._key, pending)
            job_id, token = self.claimed.job.id, self.claimed.token
            if not repo.update_claimed(job_id, token, **progress.counters()):
                raise ClaimLost(job_id)
            if repo.cancel_requested(job_id):
                self.claimed.cancel.set()
        del progress.pending[: len(pending)]
        progress.flushed_at = time.monotonic()

    async def _score_one(self, tokens: Tokens) -> ScoredSequence:
        async with self.gate:
            if self.failed:
                raise _Abandoned
            self.claimed.check_cancel()
            started = time.perf_counter()
            try:
                scored = await score_sequence(
                    self.target, tokens, on_request=self._count_request, on_retry=self._count_retry
                )
            except BaseException:
                # Set before the gate is released: no queued sequence starts another request.
                self.failed = True
                raise
            count = self.claimed.env.count_sequence
            if count is not None:
                count(False, time.perf_counter() - started)
            return scored

    def _count_request(self) -> None:
        self.claimed.progress.requests += 1

    def _count_retry(self) -> None:
        self.claimed.progress.retries += 1

    async def _score_page(self, rows: list[SequenceItem], hits: dict[str, ScoredSequence]) -> None:
        queue: deque[Item] = deque()
        try:
            for row in rows:
                self.claimed.check_cancel()
                tokens = np.frombuffer(row.token_ids, dtype="<i4")
                hit = hits.get(row.token_sha256)
                if hit is not None and hit.row_count == tokens.size:
                    queue.append((row, tokens, hit))
                else:
                    queue.append((row, tokens, asyncio.create_task(self._score_one(tokens))))
                while len(queue) > self.window:
                    await self._drain(queue)
            while queue:
                await self._drain(queue)
        except BaseException:
            tasks = [item for _, _, item in queue if isinstance(item, asyncio.Task)]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _drain(self, queue: deque[Item]) -> None:
        row, tokens, item = queue[0]
        progress = self.claimed.progress
        if isinstance(item, asyncio.Task):
            scored = await item
            progress.pending.append((row.token_sha256, scored))
            progress.scored += 1
        else:
            scored = item
            progress.cache_hits += 1
            if self.claimed.env.count_sequence is not None:
                self.claimed.env.count_sequence(True, None)
        queue.popleft()
        assert self.writer is not None
        self.writer.write(row.seq_id, tokens, scored, row.token_sha256)
        due = time.monotonic() - progress.flushed_at > FLUSH_SECONDS
        if len(progress.pending) >= FLUSH_ROWS or due:
            await asyncio.to_thread(self._flush)
            self.claimed.check_cancel()

    async def _publish(self) -> None:
        self.claimed.check_cancel()
        assert self.writer is not None
        sha, size = await asyncio.to_thread(self.writer.commit)
        path = str(self.writer.final)
        self.writer = None
        await asyncio.to_thread(self._succeed, path, sha, size)

    def _succeed(self, path: str, sha: str, size: int) -> None:
        claimed = self.claimed
        with unit_of_work(claimed.env.sessions) as session:
            if self.use_cache:
                score_cache.store(session, *self._key, list(claimed.progress.pending))
            done = JobRepository(session).finish(
                claimed.job.id, claimed.token, "succeeded", result_path=path,
                result_sha256=sha, result_bytes=size, **claimed.progress.counters(),
            )  # fmt: skip
            if not done:
                raise ClaimLost(claimed.job.id)
            DeviceLeases(session, claimed.devices).release(claimed.job.id, claimed.token)
        claimed.progress.pending.clear()
        total = claimed.progress.scored + claimed.progress.cache_hits
        log.info("job %s succeeded: %d sequences, %d from the cache", claimed.job.id, total,
                 claimed.progress.cache_hits)  # fmt: skip
