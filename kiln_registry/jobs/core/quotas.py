"""The queue's quotas (issue 27 item 8): how much active work one token, and everyone, may hold.

``check_quotas`` runs inside the submission's write transaction (writers are
serialised on both engines), before the job row is added: the active jobs
(queued, probing, running) of the submitting token, and of the whole
registry, plus the new job must stay within ``[jobs]
max_queued_jobs_per_token`` / ``max_queued_tokens_per_token`` and
``max_queued_jobs`` / ``max_queued_tokens``.  Past any of them the
submission is ``429 job_queue_full`` (``Retry-After: 60``) naming the limit;
nothing is queued.  With auth off every caller is one owner (``None``).
Imports ``config.settings``, ``domain.errors`` and ``jobs.core.repository``.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from kiln_registry.config.settings import JobsConfig
from kiln_registry.domain.errors import JobQueueFull
from kiln_registry.jobs.core.repository import JobRepository


def _refuse(what: str, held: int, adding: int, limit: int, key: str) -> JobQueueFull:
    return JobQueueFull(
        f"{what} holds {held} and this job adds {adding}: past [jobs] {key} ({limit})",
        rule=f"job.{key}",
    )


def check_quotas(session: Session, jobs: JobsConfig, owner: str | None, tokens: int) -> None:
    """``JobQueueFull`` unless one more job of ``tokens`` input tokens fits every quota."""
    repo = JobRepository(session)
    whose = "your token's active work" if owner is not None else "the active work"
    held_jobs, held_tokens = repo.active_totals(owner=owner, per_owner=True)
    if held_jobs + 1 > jobs.max_queued_jobs_per_token:
        raise _refuse(whose, held_jobs, 1, jobs.max_queued_jobs_per_token,
                      "max_queued_jobs_per_token")  # fmt: skip
    if held_tokens + tokens > jobs.max_queued_tokens_per_token:
        raise _refuse(f"{whose} (in tokens)", held_tokens, tokens,
                      jobs.max_queued_tokens_per_token, "max_queued_tokens_per_token")  # fmt: skip
    all_jobs, all_tokens = repo.active_totals(owner=None, per_owner=False)
    if all_jobs + 1 > jobs.max_queued_jobs:
        raise _refuse("the registry's queue", all_jobs, 1, jobs.max_queued_jobs, "max_queued_jobs")
    if all_tokens + tokens > jobs.max_queued_tokens:
        raise _refuse("the registry's queue (in tokens)", all_tokens, tokens,
                      jobs.max_queued_tokens, "max_queued_tokens")  # fmt: skip
