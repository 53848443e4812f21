"""One claimed job, phase by phase: spec check, probes, device lease, then scoring.

The order is the rule this module exists for.  (a) the registry entry for
the alias must still equal the pinned spec (same row, same identity, URL,
credential id and model id), else the job fails "deleted or replaced after
submission"; (b) both probes run against the pinned spec (``probe_teacher``
with ``pinned``, the job probe timeout) and the discovered identity must
equal the pinned one byte for byte; (c) only then is a device leased and the
score cache opened; (d) ``jobs.pipeline`` scores.  A failure in (a) or (b)
leaves the cache untouched and no lease taken.  Each phase's timestamp is
recorded on the job.  Before (a) the worker waits until some device is free,
and if the lease is lost to another job after the probes, it waits and runs
(a) and (b) again, so the probes are always fresh when scoring starts.

Imports: standard library, ``kiln_registry.credentials``/``db``/``errors``/
``identity``/``probe`` and ``jobs``; never the API layer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from kiln_registry.credentials.resolve import resolve_teacher_endpoint
from kiln_registry.db.models import utc_timestamp
from kiln_registry.db.repository import TeacherRepository, unit_of_work
from kiln_registry.domain.errors import IdentityMismatch, KilnError, ProbeBusy, TeacherNotFound
from kiln_registry.identity.diff import mismatch_detail
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.jobs.generation import GenerationPipeline
from kiln_registry.jobs.models import JobRow
from kiln_registry.jobs.pipeline import ScoringPipeline
from kiln_registry.jobs.repository import JobRepository
from kiln_registry.jobs.scoring import ScoringTarget
from kiln_registry.jobs.service import pin_teacher
from kiln_registry.jobs.state import ClaimedJob, ClaimLost, JobCancelled, JobEnvironment
from kiln_registry.probe.client import SecretSource, probe_teacher
from kiln_registry.probe.report import ProbeReport, attached_report
from kiln_registry.probe.wire import TeacherWire

log = logging.getLogger("kiln_registry.jobs")

DEVICE_POLL_S: Final = 0.25
PROBE_BUSY_WAIT_S: Final = 0.5
REPLACED: Final = "deleted or replaced after submission"


class JobRun:
    """Runs one claimed job to a terminal state (or back to ``queued`` on shutdown)."""

    def __init__(self, env: JobEnvironment, job: JobRow, cancel: asyncio.Event) -> None:
        self.claimed = ClaimedJob(env, job, cancel)
        self.job = job
        self.pipeline: ScoringPipeline | GenerationPipeline | None = None

    async def run(self) -> None:
        claimed = self.claimed
        try:
            await self._phases()
        except JobCancelled:
            self._discard()
            await asyncio.to_thread(claimed.finish, "cancelled", **claimed.progress.counters())
            log.info("job %s cancelled", self.job.id)
        except ClaimLost:
            self._discard()
            log.warning("job %s: claim lost; stopped without changing it", self.job.id)
        except KilnError as exc:
            self._discard()
            log.info("job %s failed: %s", self.job.id, exc)
            await asyncio.to_thread(claimed.fail, exc.code, exc.rule, exc.message)
        except asyncio.CancelledError:
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
        while True:
            await self._wait_for_device()
            await asyncio.to_thread(self._check_spec)
            url, secret = await self._probe()
            if await asyncio.to_thread(self.claimed.lease, utc_timestamp()) is not None:
                break
        now = utc_timestamp()
        await asyncio.to_thread(self.claimed.update, status="running", scoring_started_at=now)
        env = self.claimed.env
        async with TeacherWire(
            url, tls=env.teacher_tls, max_idle=env.config.jobs.concurrency
        ) as wire:
            if self.job.kind == "off_policy_generation":
                from kiln_registry.jobs.generation_run import generation_pipeline

                self.pipeline = await generation_pipeline(self.claimed, wire, secret)
                await self.pipeline.run()
                return
            target = ScoringTarget(
                wire=wire,
                model_id=self.job.teacher_model_id,
                secret=secret,
                identity=self.claimed.identity,
                k=self.job.top_k,
            )
            self.pipeline = ScoringPipeline(self.claimed, target)
            await self.pipeline.run()

    async def _wait_for_device(self) -> None:
        while True:
            self.claimed.check_cancel()
            if await asyncio.to_thread(self.claimed.free_devices) > 0:
                return
            await asyncio.sleep(DEVICE_POLL_S)

    # -- phase (a) -------------------------------------------------------------

    def _check_spec(self) -> None:
        job = self.job
        with unit_of_work(self.claimed.env.sessions) as session:
            row = TeacherRepository(session).get(job.teacher_alias)
            if row is None:
                raise TeacherNotFound.in_job(
                    f"teacher alias {job.teacher_alias!r} was {REPLACED}",
                    rule="job.teacher_deleted",
                )
            try:
                pin = pin_teacher(row, job.teacher_alias)
            except KilnError:
                pin = None
            pinned = (
                job.teacher_kind, job.teacher_url, job.teacher_credential_id,
                job.teacher_model_id, job.teacher_created_at, job.identity_json,
            )  # fmt: skip
            if pin is None or (
                pin.kind, pin.url, pin.credential_id, pin.model_id, pin.created_at,
                pin.identity_json,
            ) != pinned:  # fmt: skip
                raise IdentityMismatch(
                    f"teacher alias {job.teacher_alias!r} was {REPLACED}: the registry entry no"
                    " longer equals the spec the job pinned",
                    rule="job.teacher_replaced",
                )
            if not JobRepository(session).update_claimed(
                job.id, self.claimed.token, spec_checked_at=utc_timestamp()
            ):
                raise ClaimLost(job.id)

    # -- phase (b) -------------------------------------------------------------

    async def _probe(self) -> tuple[str, SecretSource | None]:
        """Both probes against the pinned spec; the completions URL and its secret."""
        job, env, identity = self.job, self.claimed.env, self.claimed.identity
        resolved = resolve_teacher_endpoint(
            job.teacher_url,
            job.teacher_credential_id,
            credentials=env.config.teachers.credentials,
            server_host=env.config.server.host,
        )
        url = resolved.endpoint.completions_url
        report = await self._probe_once(url, resolved.secret)
        assert report.fingerprint is not None
        found = verify_fingerprint(report.fingerprint)
        if found.canonical_bytes() != identity.canonical_bytes():
            raise IdentityMismatch(
                f"the probed identity {found.revision()} is not the pinned {identity.revision()};"
                f" {mismatch_detail(identity, found)}",
                rule="job.identity_changed",
            )
        await asyncio.to_thread(self.claimed.update, probed_at=utc_timestamp())
        return url, resolved.secret

    async def _probe_once(self, url: str, secret: SecretSource | None) -> ProbeReport:
        env = self.claimed.env
        while True:
            self.claimed.check_cancel()
            started = time.monotonic()
            try:
                report = await probe_teacher(
                    env.http,
                    completions_url=url,
                    model_id=self.job.teacher_model_id,
                    student=env.student,
                    pinned=self.claimed.identity,
                    secret=secret,
                    timeout_s=env.probe_timeout_s,
                    limiter=env.probe_limiter,
                )
            except ProbeBusy:
                await asyncio.sleep(PROBE_BUSY_WAIT_S)
                continue
            except KilnError as exc:
                self._count_probe(exc.code, started, exc.rule)
                failed = attached_report(exc)
                if failed is not None:
                    await asyncio.to_thread(self._receipt, failed)
                raise
            self._count_probe("passed", started)
            await asyncio.to_thread(self._receipt, report)
            return report

    def _count_probe(self, outcome: str, started: float, rule: str | None = None) -> None:
        if self.claimed.env.count_probe is not None:
            self.claimed.env.count_probe(outcome, time.monotonic() - started, rule)

    def _receipt(self, report: ProbeReport) -> None:
        """Job probes leave receipts on the alias like re-probes do (no secrets in them)."""
        with unit_of_work(self.claimed.env.sessions) as session:
            TeacherRepository(session).add_receipt(
                self.job.teacher_alias,
                "passed" if report.passed else "failed",
                self.claimed.identity.digest(),
                {**report.to_dict(), "job_id": self.job.id},
            )
