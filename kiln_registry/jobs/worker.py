"""The job workers (in ``kiln serve`` or ``kiln worker``): leases, claims, wake-ups, cancellation.

Several worker processes may share one database.  A claim is a lease owned
by this process's ``worker_id`` (host name, pid, random part): the worker
renews it every ``[jobs] lease_heartbeat_s`` while the job runs, and a job
whose lease was not renewed for ``[jobs] lease_timeout_s`` is requeued by
whichever worker notices first (``_recover``: at start and before every
claim).  Requeued jobs start again from phase (a) (or become ``cancelled``
when that was requested); their stale partial corpora and orphaned device
leases are removed.  A worker whose renewal finds the claim gone (or that
cannot renew before its lease runs out) stops that job at once; its writes
are fenced by the claim token, so it changes nothing more.

``JobWorkers.start()`` loads the corpus-signing key (created on the first
start, beside the database), recovers, then starts ``[jobs] workers`` asyncio
tasks.  Each task claims the oldest queued job under a fresh claim token and
runs it (``jobs.runner.JobRun``) beside its heartbeat.  Workers sleep until
``wake()`` (called after a submission) or a short poll interval.
``cancel(job_id)`` reaches a running job at its next request boundary; the
database flag (read back at every heartbeat and flush) makes it durable and
reaches jobs held by other processes.  ``stop()`` cancels the tasks and
waits for them: a job in progress goes back to ``queued``.  Start-up also
finishes deletions a crash interrupted, and with ``[jobs] retain_days`` one
more task deletes expired finished jobs at start and every
``jobs.core.retention.SWEEP_INTERVAL_S`` (``jobs.core.retention``).  The process also
keeps its ``job_workers`` heartbeat row (``jobs.core.liveness``) from start to stop,
renewed every ``[jobs] lease_heartbeat_s``, so ``/ready`` can tell a queued job
that no live worker will claim.

Imports: standard library, ``kiln_registry.db`` and ``jobs``; never the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
import time
from typing import Final

from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.lease_repository import DeviceLeases
from kiln_registry.jobs.core.liveness import WorkerBeats, WorkerSlot
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.core.retention import SWEEP_INTERVAL_S, recover_deletions, sweep_expired
from kiln_registry.jobs.core.service import result_dir
from kiln_registry.jobs.core.signing import key_path, load_or_create_signer
from kiln_registry.jobs.core.state import ClaimedJob, JobEnvironment
from kiln_registry.jobs.runner import JobRun

log = logging.getLogger("kiln_registry.jobs")

IDLE_POLL_S: Final = 1.0
MAX_STALE_PARTIALS: Final = 64  # partial files removed per requeued job
ERROR_BACKOFF_S: Final = 2.0


def worker_id() -> str:
    """This process's lease owner name: host name, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class JobWorkers:
    """``[jobs] workers`` claim loops sharing one environment."""

    def __init__(self, env: JobEnvironment) -> None:
        self.env = env
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._cancels: dict[str, asyncio.Event] = {}
        self._stopping = False
        self.worker_id = worker_id()
        self._slot = WorkerSlot(
            worker_id=self.worker_id, host=socket.gethostname(), pid=os.getpid(),
            slots=env.config.jobs.workers,
        )  # fmt: skip

    def _recover(self) -> list[str]:
        """Requeue jobs whose lease expired; drop their partial corpora and device leases."""
        with unit_of_work(self.env.sessions) as session:
            requeued = JobRepository(session).requeue_expired()
            DeviceLeases(session, self.env.config.jobs.devices).release_orphans()
        root = result_dir(self.env.config)
        for job_id in requeued:
            # Every claim's partial files (corpus and, for generation jobs, its signature).
            stale = itertools.islice(root.glob(f".{job_id}.jsonl*.partial"), MAX_STALE_PARTIALS)
            for path in stale:
                path.unlink(missing_ok=True)
        if requeued:
            log.info("requeued %d job(s) whose lease expired: %s", len(requeued),
                     ", ".join(requeued))  # fmt: skip
        return requeued

    def _start(self) -> None:
        self.env.signer = load_or_create_signer(key_path(self.env.config.server.state_path))
        self._beat()
        self._recover()
        recover_deletions(self.env.config, self.env.sessions)

    def _beat(self) -> None:
        with unit_of_work(self.env.sessions) as session:
            WorkerBeats(session).beat(self._slot, timeout_s=self.env.config.jobs.lease_timeout_s)

    def _forget(self) -> None:
        with unit_of_work(self.env.sessions) as session:
            WorkerBeats(session).forget(self.worker_id)

    async def start(self) -> None:
        await asyncio.to_thread(self._start)
        log.info("job worker %s started", self.worker_id)
        for index in range(self.env.config.jobs.workers):
            self._tasks.append(asyncio.create_task(self._loop(index), name=f"kiln-job-{index}"))
        if self.env.config.jobs.retain_days is not None:
            self._tasks.append(asyncio.create_task(self._sweep(), name="kiln-job-retention"))
        self._tasks.append(asyncio.create_task(self._beats(), name="kiln-job-worker-beat"))

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        try:
            await asyncio.to_thread(self._forget)
        except Exception:  # the row then expires after [jobs] lease_timeout_s
            log.exception("job worker %s: heartbeat row not removed", self.worker_id)

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, job_id: str) -> None:
        """Signal a job running in this process; harmless for any other job."""
        event = self._cancels.get(job_id)
        if event is not None:
            event.set()

    def _claim(self, token: str) -> JobRow | None:
        """The oldest queued job, claimed only while some device is free to run it."""
        self._recover()
        jobs = self.env.config.jobs
        with unit_of_work(self.env.sessions) as session:
            if DeviceLeases(session, jobs.devices).free_count() < 1:
                return None
            repo = JobRepository(session)
            row = repo.claim_next(token, owner=self.worker_id, timeout_s=jobs.lease_timeout_s)
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

    async def _beats(self) -> None:
        """Renew this process's ``job_workers`` row every ``[jobs] lease_heartbeat_s``."""
        while not self._stopping:
            await asyncio.sleep(self.env.config.jobs.lease_heartbeat_s)
            try:
                await asyncio.to_thread(self._beat)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("job worker %s: heartbeat failed; retrying", self.worker_id)

    async def _run(self, job: JobRow) -> None:
        cancel = asyncio.Event()
        if job.cancel_requested:
            cancel.set()
        self._cancels[job.id] = cancel
        log.info("job %s claimed by %s (attempt %d)", job.id, self.worker_id, job.attempts)
        run = JobRun(self.env, job, cancel)
        task = asyncio.create_task(run.run(), name=f"kiln-job-run-{job.id}")
        beat = asyncio.create_task(self._heartbeat(run.claimed, task), name="kiln-job-lease")
        try:
            await asyncio.wait({task})
        finally:
            for pending in (beat, task):
                pending.cancel()
            await asyncio.gather(beat, task, return_exceptions=True)
            self._cancels.pop(job.id, None)
            # Another worker may have gone idle while this one held the only device.
            self._wake.set()

    async def _heartbeat(self, claimed: ClaimedJob, task: asyncio.Task[None]) -> None:
        """Renew the job's lease until ``task`` ends; stop the job at once if it is lost."""
        interval = self.env.config.jobs.lease_heartbeat_s
        while not task.done():
            await asyncio.sleep(interval)
            try:
                flag = await asyncio.to_thread(claimed.renew)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("job %s: lease renewal failed", claimed.job.id)
                if time.monotonic() < claimed.lease_until:
                    continue  # still surely ours; try again at the next beat
                flag = None
            if flag is None:
                log.warning("job %s: lease lost; stopping it without further writes",
                            claimed.job.id)  # fmt: skip
                claimed.lost = True
                task.cancel()
                return
            if flag:
                claimed.cancel.set()  # requested through the database, maybe elsewhere
