"""The job workers embedded in ``kiln serve``: recovery, atomic claims, wake-ups, cancellation.

``JobWorkers.start()`` first recovers from an earlier run (jobs left
``probing`` or ``running`` go back to ``queued`` and start again from phase
(a), or become ``cancelled`` when that was requested; every device lease is
dropped; stale partial corpora are removed; the corpus-signing key is loaded,
or created on the first start, beside the database), then starts ``[jobs] workers``
asyncio tasks.  Each task claims the oldest queued job with one atomic
UPDATE under a fresh claim token and runs it (``jobs.runner.JobRun``).
Workers sleep until ``wake()`` (called after a submission) or a short poll
interval.  ``cancel(job_id)`` reaches a running job at its next request
boundary; the database flag makes it durable.  ``stop()`` cancels the tasks
and waits for them: a job in progress goes back to ``queued``.  Start-up also
finishes deletions a crash interrupted, and with ``[jobs] retain_days`` one
more task deletes expired finished jobs at start and every
``jobs.retention.SWEEP_INTERVAL_S`` (``jobs.retention``).

Imports: standard library, ``kiln_registry.db`` and ``jobs``; never the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Final

from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.leases import DeviceLeases
from kiln_registry.jobs.models import JobRow
from kiln_registry.jobs.repository import JobRepository
from kiln_registry.jobs.retention import SWEEP_INTERVAL_S, recover_deletions, sweep_expired
from kiln_registry.jobs.runner import JobRun
from kiln_registry.jobs.service import result_dir
from kiln_registry.jobs.signing import key_path, load_or_create_signer
from kiln_registry.jobs.state import JobEnvironment

log = logging.getLogger("kiln_registry.jobs")

IDLE_POLL_S: Final = 1.0
ERROR_BACKOFF_S: Final = 2.0


class JobWorkers:
    """``[jobs] workers`` claim loops sharing one environment."""

    def __init__(self, env: JobEnvironment) -> None:
        self.env = env
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._cancels: dict[str, asyncio.Event] = {}
        self._stopping = False

    def _recover(self) -> list[str]:
        self.env.signer = load_or_create_signer(key_path(self.env.config.server.database))
        with unit_of_work(self.env.sessions) as session:
            requeued = JobRepository(session).requeue_interrupted()
            DeviceLeases(session, self.env.config.jobs.devices).release_all()
        root = result_dir(self.env.config)
        for job_id in requeued:
            (root / f".{job_id}.jsonl.partial").unlink(missing_ok=True)
            (root / f".{job_id}.jsonl.sig.partial").unlink(missing_ok=True)  # generation jobs
        recover_deletions(self.env.config, self.env.sessions)
        return requeued

    async def start(self) -> None:
        requeued = await asyncio.to_thread(self._recover)
        if requeued:
            log.info("requeued %d interrupted job(s): %s", len(requeued), ", ".join(requeued))
        for index in range(self.env.config.jobs.workers):
            self._tasks.append(asyncio.create_task(self._loop(index), name=f"kiln-job-{index}"))
        if self.env.config.jobs.retain_days is not None:
            self._tasks.append(asyncio.create_task(self._sweep(), name="kiln-job-retention"))

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, job_id: str) -> None:
        """Signal a job running in this process; harmless for any other job."""
        event = self._cancels.get(job_id)
        if event is not None:
            event.set()

    def _claim(self, token: str) -> JobRow | None:
        """The oldest queued job, claimed only while some device is free to run it."""
        with unit_of_work(self.env.sessions) as session:
            if DeviceLeases(session, self.env.config.jobs.devices).free_count() < 1:
                return None
            row = JobRepository(session).claim_next(token)
            if row is not None:
                session.expunge(row)
            return row

    async def _idle(self) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), IDLE_POLL_S)

    async def _loop(self, index: int) -> None:
        while not self._stopping:
            try:
                job = await asyncio.to_thread(self._claim, secrets.token_hex(16))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("job worker %d could not claim a job", index)
                await asyncio.sleep(ERROR_BACKOFF_S)
                continue
            if job is None:
                await self._idle()
                continue
            await self._run(job)

    async def _sweep(self) -> None:
        """``[jobs] retain_days``: delete expired finished jobs now and periodically."""
        env = self.env
        while not self._stopping:
            try:
                await asyncio.to_thread(sweep_expired, env.config, env.sessions)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("job retention sweep failed; retrying at the next interval")
            await asyncio.sleep(SWEEP_INTERVAL_S)

    async def _run(self, job: JobRow) -> None:
        cancel = asyncio.Event()
        if job.cancel_requested:
            cancel.set()
        self._cancels[job.id] = cancel
        log.info("job %s claimed (attempt %d)", job.id, job.attempts)
        try:
            await JobRun(self.env, job, cancel).run()
        finally:
            self._cancels.pop(job.id, None)
            # Another worker may have gone idle while this one held the only device.
            self._wake.set()
