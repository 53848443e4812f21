"""Phase (d) of an off-policy generation job: prompts to a signed Kiln off-policy corpus.

Prompts are read in pages; with deterministic settings each page's cache
hits are looked up in one query.  Misses are generated with at most ``[jobs]
concurrency`` requests in flight and written in input order through a
bounded reorder window.  Verified generations are committed to the cache in
small batches with the progress counters.  When any answer fails (a changed
fingerprint above all) every outstanding request is cancelled, the unflushed
batch dropped and the partial corpus deleted by the caller: nothing produced
after the failure is kept, and the job fails.  A killed job is requeued and
starts again; its cached generations make that fast.

Imports: standard library, ``kiln_registry.db`` and ``jobs``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Final

from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs import generation_output as out
from kiln_registry.jobs.generation_output import ExampleContext, ExampleWriter, PromptItem
from kiln_registry.jobs.generation_sources import GenerationSettings
from kiln_registry.jobs.generation_wire import Generated, GenerationTarget, generate
from kiln_registry.jobs.leases import DeviceLeases
from kiln_registry.jobs.repository import JobRepository
from kiln_registry.jobs.service import result_root
from kiln_registry.jobs.state import ClaimedJob, ClaimLost

log = logging.getLogger("kiln_registry.jobs")

PAGE_SIZE: Final = 500
FLUSH_ROWS: Final = 64
FLUSH_SECONDS: Final = 0.5
Item = tuple[PromptItem, "Generated | asyncio.Task[Generated]"]


class _Abandoned(Exception):
    """An earlier prompt failed; this one never sent its request."""


class GenerationPipeline:
    """Generates one claimed job's prompts against ``target`` and publishes its corpus."""

    def __init__(self, claimed: ClaimedJob, target: GenerationTarget, tokenizer: Any) -> None:
        self.claimed = claimed
        self.target = target
        self.settings: GenerationSettings = target.settings
        self.use_cache = claimed.env.config.jobs.cache and self.settings.deterministic
        self.gate = asyncio.Semaphore(claimed.env.config.jobs.concurrency)
        self.window = 4 * claimed.env.config.jobs.concurrency + 8
        job = claimed.job
        self.ctx = ExampleContext(job.id, job.teacher_alias, claimed.identity, self.settings,
                                  tokenizer)  # fmt: skip
        self.key = (claimed.identity.digest(), self.settings.sha256())
        self.writer: ExampleWriter | None = None
        self.pending: list[tuple[str, Generated]] = []
        self.failed = False

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.discard()
            self.writer = None
        self.pending.clear()

    async def run(self) -> None:
        final = result_root(self.claimed.env.config) / f"{self.claimed.job.id}.jsonl"
        signer = self.claimed.env.signer
        assert signer is not None, "JobWorkers.start loads the corpus-signing key"
        self.writer = await asyncio.to_thread(ExampleWriter, final, self.claimed.identity, signer)
        after = -1
        while True:
            rows, hits = await asyncio.to_thread(self._page, after)
            if not rows:
                break
            await self._generate_page(rows, hits)
            after = rows[-1].idx
        await self._publish()

    def _page(self, after: int) -> tuple[list[PromptItem], dict[str, Generated]]:
        with unit_of_work(self.claimed.env.sessions) as session:
            rows = out.prompt_page(session, self.claimed.job.id, after=after, limit=PAGE_SIZE)
            if not self.use_cache or not rows:
                return rows, {}
            return rows, out.cache_lookup(session, *self.key, [r.token_sha256 for r in rows])

    def _flush(self) -> None:
        pending = list(self.pending)
        progress = self.claimed.progress
        with unit_of_work(self.claimed.env.sessions) as session:
            if self.use_cache:
                out.cache_store(session, *self.key, pending)
            repo = JobRepository(session)
            job_id, token = self.claimed.job.id, self.claimed.token
            if not repo.update_claimed(job_id, token, **progress.counters()):
                raise ClaimLost(job_id)
            if repo.cancel_requested(job_id):
                self.claimed.cancel.set()
        del self.pending[: len(pending)]
        progress.flushed_at = time.monotonic()

    async def _one(self, prompt: list[int]) -> Generated:
        async with self.gate:
            if self.failed:
                raise _Abandoned
            self.claimed.check_cancel()
            try:
                return await generate(
                    self.target, prompt, on_request=self._count_request, on_retry=self._count_retry
                )
            except BaseException:
                self.failed = True  # before the gate opens: no queued prompt starts a request
                raise

    def _count_request(self) -> None:
        self.claimed.progress.requests += 1

    def _count_retry(self) -> None:
        self.claimed.progress.retries += 1

    async def _generate_page(self, rows: list[PromptItem], hits: dict[str, Generated]) -> None:
        queue: deque[Item] = deque()
        try:
            for row in rows:
                self.claimed.check_cancel()
                hit = hits.get(row.token_sha256)
                queue.append((row, hit if hit is not None
                              else asyncio.create_task(self._one(row.token_ids))))  # fmt: skip
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

    async def _drain(self, queue: deque[Item]) -> None:
        row, item = queue[0]
        progress = self.claimed.progress
        if isinstance(item, asyncio.Task):
            gen = await item
            self.pending.append((row.token_sha256, gen))
            progress.scored += 1
        else:
            gen = item
            progress.cache_hits += 1
        queue.popleft()
        assert self.writer is not None
        line = out.encode_example(self.ctx, row.seq_id, row.messages_json, row.token_sha256, gen)
        self.writer.write(line)
        due = time.monotonic() - progress.flushed_at > FLUSH_SECONDS
        if len(self.pending) >= FLUSH_ROWS or due:
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
                out.cache_store(session, *self.key, list(self.pending))
            done = JobRepository(session).finish(
                claimed.job.id, claimed.token, "succeeded", result_path=path,
                result_sha256=sha, result_bytes=size, **claimed.progress.counters(),
            )  # fmt: skip
            if not done:
                raise ClaimLost(claimed.job.id)
            DeviceLeases(session, claimed.devices).release(claimed.job.id, claimed.token)
        self.pending.clear()
        log.info("job %s succeeded: %d prompts, %d from the cache", claimed.job.id,
                 claimed.progress.scored + claimed.progress.cache_hits,
                 claimed.progress.cache_hits)  # fmt: skip
