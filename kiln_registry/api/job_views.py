"""``job_public``: a stored job row rendered as its wire shape (``wire.jobs.JobPublic``).

Field by field, so the claim token and the pinned credential id never reach a
response.  Imports ``wire.jobs``, ``domain.vocabulary`` and ``jobs.models``.
"""

from __future__ import annotations

import json

from kiln_registry.domain.vocabulary import JobKind
from kiln_registry.jobs.core.liveness import waiting_note
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.wire.jobs import (
    GenerationInfo,
    JobError,
    JobProgress,
    JobPublic,
    JobResultInfo,
    JobSource,
    JobSourceKind,
    JobStatus,
    JobTimestamps,
    kiln_note,
)


def job_public(row: JobRow, live_workers: int | None = None) -> JobPublic:
    """The wire view; ``live_workers`` (when known) sets ``waiting`` on a stalled queued job."""
    error = None
    if row.error_code is not None:
        error = JobError(code=row.error_code, rule=row.error_rule, message=row.error_message or "")
    result = None
    if row.status == JobStatus.succeeded and row.result_sha256 is not None:
        result = JobResultInfo(bytes=row.result_bytes or 0, sha256=row.result_sha256)
    generation = None
    if row.generation_json is not None:
        settings = json.loads(row.generation_json)
        generation = GenerationInfo(
            max_tokens=settings["max_tokens"], temperature=settings["temperature"],
            top_p=settings["top_p"], seed=settings["seed"], kiln_note=kiln_note(row.top_k),
        )  # fmt: skip
    return JobPublic(
        id=row.id,
        kind="off_policy_generation"
        if row.kind == JobKind.off_policy_generation
        else "teacher_scoring",
        generation=generation,
        status=JobStatus(row.status),
        teacher=row.teacher_alias,
        identity_revision="sha256:" + row.identity_digest,
        top_k=row.top_k,
        source=JobSource(
            kind=JobSourceKind(row.source), path=row.corpus_path, sha256=row.corpus_sha256
        ),
        device=row.device,
        attempts=row.attempts,
        cancel_requested=bool(row.cancel_requested),
        progress=JobProgress(
            total=row.sequence_count,
            done=row.scored_count + row.cache_hits,
            scored=row.scored_count,
            cache_hits=row.cache_hits,
            requests=row.requests_sent,
            retries=row.retries,
        ),
        timestamps=JobTimestamps(
            created_at=row.created_at,
            claimed_at=row.claimed_at,
            spec_checked_at=row.spec_checked_at,
            probed_at=row.probed_at,
            leased_at=row.leased_at,
            scoring_started_at=row.scoring_started_at,
            finished_at=row.finished_at,
            updated_at=row.updated_at,
        ),
        error=error,
        result=result,
        output="kiln-logit-cache-v3" if row.output == "kiln-logit-cache-v3" else None,
        waiting=waiting_note(row.status, live_workers),
    )
