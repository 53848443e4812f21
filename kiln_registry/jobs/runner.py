"""One claimed job, phase by phase: spec check, probes, device lease, then scoring.

The order is the rule this module exists for.  (a) the registry entry for
the alias must still equal the pinned spec (same row, same identity, URL,
credential id and model id), else the job fails "deleted or replaced after
submission"; (b) both probes run against the pinned spec through the one
probing seam (``teachers.probing.run_probes`` with ``pinned``, the job probe
timeout, the job limiter) and the discovered identity must be the pinned one
(``same_identity``); each probe leaves a scrubbed receipt on the alias, and a
failed one marks the alias unavailable as a failed re-probe does
(``teachers.job_probes``: only the very registration the job pinned); on
a replica-set alias every verified replica is proved at once, and those that
fail are fenced (``jobs.core.endpoints``); (c) only then is a device leased
and the score cache opened; (d) the pipeline of the job's kind
(``jobs.kinds``) runs over the proved endpoints, spread over every proved
replica whatever the kind.  A failure in (a) or (b) leaves the cache
untouched and no lease taken.  Each phase's timestamp is
recorded on the job.  Before (a) the worker waits until some device is free,
and if the lease is lost to another job after the probes, it waits and runs
(a) and (b) again, so the probes are always fresh when scoring starts.

Imports: standard library, ``kiln_registry.credentials``/``db``/``domain``/
``identity``/``probe``, ``teachers.probing`` and ``jobs``; never the API layer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from kiln_registry.auth.store import audit_bounds
from kiln_registry.credentials.resolve import ResolvedTeacher
from kiln_registry.db.models import TeacherRow, utc_timestamp
from kiln_registry.db.repository import TeacherRepository, unit_of_work
from kiln_registry.domain.errors import (
    IdentityMismatch,
    KilnError,
    ProbeBusy,
    ProbeFailed,
    TeacherNotFound,
)
from kiln_registry.domain.vocabulary import JobStatus
from kiln_registry.identity.document import same_identity
from kiln_registry.jobs.core.endpoints import EXHAUSTED_RULE, JobTeachers, verified_replicas
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.registry_repository import fence_replica
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.core.service import PinnedTeacher, pin_teacher
from kiln_registry.jobs.core.state import ClaimedJob, ClaimLost, JobCancelled, JobEnvironment
from kiln_registry.jobs.kinds import JobPipeline, job_kind
from kiln_registry.teachers.job_probes import PinnedRegistration, mark_failed_probe
from kiln_registry.teachers.probing import (
    ProbeOutcome,
    ProbeSetup,
    Receipt,
    failure_receipt,
    resolve_endpoint,
    run_probes,
)

log = logging.getLogger("kiln_registry.jobs")

DEVICE_POLL_S: Final = 0.25
PROBE_BUSY_WAIT_S: Final = 0.5
REPLACED: Final = "deleted or replaced after submission"


class JobRun:
    """Runs one claimed job to a terminal state (or back to ``queued`` on shutdown)."""

    def __init__(self, env: JobEnvironment, job: JobRow, cancel: asyncio.Event) -> None:
        self.claimed = ClaimedJob(env, job, cancel)
        self.job = job
        self.pipeline: JobPipeline | None = None

    async def run(self) -> None:
        claimed = self.claimed
        try:
            await self._phases()
        except JobCancelled:
            self._discard()
            await asyncio.to_thread(
                claimed.finish, JobStatus.cancelled.value, **claimed.progress.counters()
            )
            log.info("job %s cancelled", self.job.id)
        except ClaimLost:
            self._discard()
            log.warning("job %s: claim lost (lease expired and taken over); stopped at a fenced"
                        " write without changing the job or its result", self.job.id)  # fmt: skip
        except KilnError as exc:
            self._discard()
            log.info("job %s failed: %s", self.job.id, exc)
            await asyncio.to_thread(claimed.fail, exc.code, exc.rule, exc.message)
        except asyncio.CancelledError:
            if claimed.lost:  # the heartbeat found the lease taken over: write nothing more
                self._discard()
                raise
            self._discard()
            await asyncio.to_thread(claimed.requeue)
            raise
        except Exception:
            log.exception("job %s failed unexpectedly", self.job.id)
            self._discard()
            await asyncio.to_thread(claimed.fail, "internal_error", None, "internal error")

    def _discard(self) -> None:
        if self.pipeline is not None:
            self.pipeline.discard()

    async def _phases(self) -> None:
        spec = job_kind(self.job.kind)
        while True:
            await self._wait_for_device()
            replicas = await asyncio.to_thread(self._check_spec)
            if replicas:
                proved = await self._prove_replicas(replicas)
            else:
                proved = [(None, await self._probe())]
            if await asyncio.to_thread(self.claimed.lease, utc_timestamp()) is not None:
                break
        now = utc_timestamp()
        await asyncio.to_thread(
            self.claimed.update, status=JobStatus.running.value, scoring_started_at=now
        )
        async with self._teachers(proved) as teachers:
            self.pipeline = await spec.pipeline(self.claimed, teachers)
            await self.pipeline.run()

    async def _wait_for_device(self) -> None:
        while True:
            self.claimed.check_cancel()
            if await asyncio.to_thread(self.claimed.free_devices) > 0:
                return
            await asyncio.sleep(DEVICE_POLL_S)

    # -- phase (a) -------------------------------------------------------------

    def _check_spec(self) -> list[tuple[int, str]]:
        """Phase (a); the registry's verified replicas of a replica-set alias, else []."""
        job = self.job
        with unit_of_work(self.claimed.env.sessions) as session:
            row = TeacherRepository(session).get(job.teacher_alias)
            if row is None:
                raise TeacherNotFound.in_job(
                    f"teacher alias {job.teacher_alias!r} was {REPLACED}",
                    rule="job.teacher_deleted",
                )
            try:
                pin: PinnedTeacher | None = pin_teacher(row, job.teacher_alias)
            except KilnError:
                if self._same_registration(row):
                    raise  # the pinned alias itself is unusable now (e.g. its probe failed)
                pin = None
            if pin is None or not self._pinned_spec(pin):
                raise IdentityMismatch(
                    f"teacher alias {job.teacher_alias!r} was {REPLACED}: the registry entry no"
                    " longer equals the spec the job pinned",
                    rule="job.teacher_replaced",
                )
            if not JobRepository(session).update_claimed(
                job.id, self.claimed.token, spec_checked_at=utc_timestamp()
            ):
                raise ClaimLost(job.id)
            return verified_replicas(row)

    def _same_registration(self, row: TeacherRow) -> bool:
        job = self.job
        return row.created_at == job.teacher_created_at and row.identity_digest == (
            job.identity_digest
        )

    def _pinned_spec(self, pin: PinnedTeacher) -> bool:
        """Whether the registry's row still is the spec the job pinned (its identity too)."""
        job = self.job
        pinned = (
            job.teacher_kind, job.teacher_url, job.teacher_credential_id,
            job.teacher_model_id, job.teacher_created_at,
        )  # fmt: skip
        found = (pin.kind, pin.url, pin.credential_id, pin.model_id, pin.created_at)
        return found == pinned and same_identity(pin.identity, self.claimed.identity)

    # -- phase (b) -------------------------------------------------------------

    def _probe_setup(self) -> ProbeSetup:
        env = self.claimed.env
        return ProbeSetup(
            http=env.http,
            student=env.student,
            limiter=env.probe_limiter,
            timeout_s=env.probe_timeout_s,
            secret_names=env.config.secret_env_names(),
            count=env.count_probe,
            count_busy=False,  # a full limiter: the job waits and tries again
            mismatch_rule="job.identity_changed",
        )

    async def _probe(self) -> ResolvedTeacher:
        """Both probes against the pinned spec; the resolved endpoint and its secret."""
        job, env = self.job, self.claimed.env
        resolved = resolve_endpoint(
            env.config, job.teacher_url, job.teacher_credential_id, guard_hosts=False
        )
        try:
            await self._prove(resolved)
        except KilnError as exc:  # the teacher answered wrongly: as a failed re-probe
            await asyncio.to_thread(self._mark_unavailable, exc)
            raise
        await asyncio.to_thread(self.claimed.update, probed_at=utc_timestamp())
        return resolved

    async def _prove(self, resolved: ResolvedTeacher) -> None:
        """Both probes of one endpoint, pinned; waits while the job limiter is full."""
        setup = self._probe_setup()
        while True:
            self.claimed.check_cancel()
            try:
                outcome = await self._probe_once(setup, resolved)
            except ProbeBusy:
                await asyncio.sleep(PROBE_BUSY_WAIT_S)
                continue
            await asyncio.to_thread(self._receipt, outcome.receipt)
            return

    async def _prove_replicas(
        self, replicas: list[tuple[int, str]]
    ) -> list[tuple[int | None, ResolvedTeacher]]:
        """Phase (b) of a replica set: prove every replica at once; fence those that fail."""
        tasks = [asyncio.create_task(self._prove_replica(idx, url)) for idx, url in replicas]
        try:
            outcomes = await asyncio.gather(*tasks)
        except BaseException:  # cancelled, or the claim lost: stop every other proof
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        proved: list[tuple[int | None, ResolvedTeacher]] = []
        reasons: list[str] = []
        for (idx, _), outcome in zip(replicas, outcomes, strict=True):
            if isinstance(outcome, str):
                reasons.append(f"replica {idx}: {outcome}")
            else:
                proved.append((idx, outcome))
        if not proved:
            exhausted = ProbeFailed(
                f"no replica of alias {self.job.teacher_alias!r} proved the pinned identity:"
                f" {'; '.join(reasons)}",
                rule=EXHAUSTED_RULE,
            )
            await asyncio.to_thread(self._mark_unavailable, exhausted)
            raise exhausted
        await asyncio.to_thread(self.claimed.update, probed_at=utc_timestamp())
        return proved

    async def _prove_replica(self, idx: int, url: str) -> ResolvedTeacher | str:
        """One replica proved (its resolved endpoint), or fenced (the reason)."""
        env = self.claimed.env
        try:
            resolved = resolve_endpoint(
                env.config, url, self.job.teacher_credential_id, guard_hosts=False
            )
            await self._prove(resolved)
        except KilnError as exc:
            await asyncio.to_thread(self._fenced, idx, str(exc))
            return str(exc)
        return resolved

    def _teachers(self, proved: list[tuple[int | None, ResolvedTeacher]]) -> JobTeachers:
        env = self.claimed.env
        return JobTeachers(
            proved, alias=self.job.teacher_alias, tls=env.teacher_tls,
            max_idle=env.config.jobs.concurrency, on_fence=self._fenced,
        )  # fmt: skip

    def _fenced(self, idx: int, reason: str) -> None:
        """Record on the alias's replica that this job fenced it (a re-probe restores it)."""
        with unit_of_work(self.claimed.env.sessions) as session:
            fence_replica(session, self.job.teacher_alias, idx, self.job.id, reason)

    async def _probe_once(self, setup: ProbeSetup, resolved: ResolvedTeacher) -> ProbeOutcome:
        identity = self.claimed.identity
        try:
            return await run_probes(
                setup, resolved, self.job.teacher_model_id, identity, job_id=self.job.id
            )
        except ProbeBusy:
            raise
        except KilnError as exc:
            failed = failure_receipt(exc, setup.secret_names, job_id=self.job.id)
            if failed is not None:
                await asyncio.to_thread(self._receipt, failed)
            raise

    def _mark_unavailable(self, exc: KilnError) -> None:
        """The pinned alias becomes unavailable as after a failed re-probe (``job_probes``);
        fenced by the claim, and only while the alias is still the registration pinned."""
        job, env = self.job, self.claimed.env
        pinned = PinnedRegistration(
            alias=job.teacher_alias, created_at=job.teacher_created_at,
            identity_digest=job.identity_digest, owner=job.owner,
        )  # fmt: skip
        with unit_of_work(env.sessions) as session:
            if not JobRepository(session).update_claimed(job.id, self.claimed.token):
                raise ClaimLost(job.id)
            marked = mark_failed_probe(
                session, pinned, exc, secret_names=env.config.secret_env_names(),
                bounds=audit_bounds(env.config.server),
            )  # fmt: skip
        if marked:
            log.warning("job %s: teacher alias %r marked unavailable after its probe failed",
                        job.id, job.teacher_alias)  # fmt: skip

    def _receipt(self, receipt: Receipt) -> None:
        """Job probes leave receipts on the alias like re-probes do (scrubbed)."""
        with unit_of_work(self.claimed.env.sessions) as session:
            receipt.store(session, self.job.teacher_alias, self.claimed.identity.digest())
