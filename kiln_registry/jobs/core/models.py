"""SQLAlchemy rows of the job queue, on the registry's declarative ``Base``.

Owns the Python view of ``jobs``, ``job_sequences``, ``score_cache``,
``generation_cache`` and ``device_leases`` (created by ``migrations/versions/0002_jobs.py``,
``0005_off_policy_generation.py``, ``0006_worker_leases.py`` and ``0012_ux2_worker_heartbeats.py``
(``job_workers``), the schema's owners) and
the allowed values of their CHECK columns.  The rows share ``kiln_registry.db.models.Base`` so
``db.models.metadata`` describes the whole migrated schema once this module is
imported.

No row holds a secret: a job pins its teacher's ``credential_id`` (a name).
Imports: the standard library, SQLAlchemy, ``kiln_registry.db.models`` and
``kiln_registry.domain.vocabulary``.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    CheckConstraint,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from kiln_registry.db.models import COUNTER64, Base, in_list
from kiln_registry.domain.vocabulary import JobKind, JobStatus

# The CHECK lists (values and order from ``domain.vocabulary``, as the migrations wrote them).
JOB_KINDS: Final[tuple[str, ...]] = tuple(kind.value for kind in JobKind)
JOB_STATUSES: Final[tuple[str, ...]] = tuple(status.value for status in JobStatus)
JOB_SOURCES: Final = ("inline", "corpus")


class JobRow(Base):
    """One scoring job: its pinned teacher spec, phase timestamps, progress and outcome."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(in_list("status", JOB_STATUSES), name="status"),
        CheckConstraint(in_list("kind", JOB_KINDS), name="kind"),
        CheckConstraint(in_list("source", JOB_SOURCES), name="source"),
        Index("ix_jobs_status_created_at", "status", "created_at"),
        Index("ix_jobs_created_at", "created_at"),
        Index("ix_jobs_owner_status", "owner", "status"),
    )

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    teacher_alias: Mapped[str] = mapped_column(Text)
    teacher_kind: Mapped[str] = mapped_column(Text)
    teacher_url: Mapped[str] = mapped_column(Text)
    teacher_credential_id: Mapped[str | None] = mapped_column(Text)
    teacher_model_id: Mapped[str] = mapped_column(Text)
    teacher_created_at: Mapped[str] = mapped_column(Text)
    identity_json: Mapped[str] = mapped_column(Text)
    identity_digest: Mapped[str] = mapped_column(Text)
    top_k: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(Text)
    corpus_path: Mapped[str | None] = mapped_column(Text)
    corpus_sha256: Mapped[str | None] = mapped_column(Text)
    sequence_count: Mapped[int] = mapped_column(COUNTER64)
    token_count: Mapped[int] = mapped_column(COUNTER64)
    device: Mapped[str | None] = mapped_column(Text)
    claim_token: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[int] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer)
    scored_count: Mapped[int] = mapped_column(COUNTER64)
    cache_hits: Mapped[int] = mapped_column(COUNTER64)
    requests_sent: Mapped[int] = mapped_column(COUNTER64)
    retries: Mapped[int] = mapped_column(COUNTER64)
    created_at: Mapped[str] = mapped_column(Text)
    claimed_at: Mapped[str | None] = mapped_column(Text)
    spec_checked_at: Mapped[str | None] = mapped_column(Text)
    probed_at: Mapped[str | None] = mapped_column(Text)
    leased_at: Mapped[str | None] = mapped_column(Text)
    scoring_started_at: Mapped[str | None] = mapped_column(Text)
    finished_at: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[str] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(Text)
    error_rule: Mapped[str | None] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    result_path: Mapped[str | None] = mapped_column(Text)
    result_sha256: Mapped[str | None] = mapped_column(Text)
    result_bytes: Mapped[int | None] = mapped_column(COUNTER64)
    # Off-policy generation jobs (0005): canonical sampling settings; NULL for scoring.
    generation_json: Mapped[str | None] = mapped_column(Text)
    # Worker leases (0006): who holds the job, and until when without a renewal.
    lease_owner: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[str | None] = mapped_column(Text)
    # Issue 26 (0010): ``kiln-logit-cache-v3`` when a scoring job also publishes its rows
    # into ``[jobs] logit_cache_root``; NULL otherwise.
    output: Mapped[str | None] = mapped_column(Text)
    # Ownership (0011): the submitting token's name; NULL with auth off (admin sees all).
    owner: Mapped[str | None] = mapped_column(Text)

    def __repr__(self) -> str:
        return f"JobRow(id={self.id!r}, status={self.status!r}, teacher={self.teacher_alias!r})"


class JobSequenceRow(Base):
    """One input sequence of a job, copied at submission (int32 little-endian ids)."""

    __tablename__ = "job_sequences"
    __table_args__ = (
        PrimaryKeyConstraint("job_id", "idx", name="pk_job_sequences"),
        ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
    )

    job_id: Mapped[str] = mapped_column(Text)
    idx: Mapped[int] = mapped_column(Integer)
    seq_id: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    token_sha256: Mapped[str] = mapped_column(Text)
    # Off-policy generation jobs (0005): the prompt's canonical chat messages.
    messages_json: Mapped[str | None] = mapped_column(Text)


class GenerationCacheRow(Base):
    """One verified generation, keyed by identity, sampling settings and prompt ids (0005)."""

    __tablename__ = "generation_cache"
    __table_args__ = (
        PrimaryKeyConstraint(
            "identity_digest", "settings_sha256", "prompt_sha256", name="pk_generation_cache"
        ),
    )

    identity_digest: Mapped[str] = mapped_column(Text)
    settings_sha256: Mapped[str] = mapped_column(Text)
    prompt_sha256: Mapped[str] = mapped_column(Text)
    result_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(Text)


class ScoreCacheRow(Base):
    """Scores of one sequence by one identity at one K, as binary numpy columns."""

    __tablename__ = "score_cache"
    __table_args__ = (
        PrimaryKeyConstraint("identity_digest", "top_k", "token_sha256", name="pk_score_cache"),
    )

    identity_digest: Mapped[str] = mapped_column(Text)
    top_k: Mapped[int] = mapped_column(Integer)
    token_sha256: Mapped[str] = mapped_column(Text)
    row_count: Mapped[int] = mapped_column(COUNTER64)
    topk_ids: Mapped[bytes] = mapped_column(LargeBinary)
    topk_logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    token_logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[str] = mapped_column(Text)


class DeviceLeaseRow(Base):
    """An exclusive lease of one device on one worker host: the key makes two holders impossible."""

    __tablename__ = "device_leases"

    host: Mapped[str] = mapped_column(Text, primary_key=True)
    device: Mapped[str] = mapped_column(Text, primary_key=True)
    job_id: Mapped[str] = mapped_column(Text)
    claim_token: Mapped[str] = mapped_column(Text)
    acquired_at: Mapped[str] = mapped_column(Text)


class WorkerRow(Base):
    """One live (or dead, once ``seen_at`` is stale) job worker process (0012)."""

    __tablename__ = "job_workers"
    __table_args__ = (Index("ix_job_workers_seen_at", "seen_at"),)

    worker_id: Mapped[str] = mapped_column(Text, primary_key=True)
    host: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    slots: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[str] = mapped_column(Text)
    seen_at: Mapped[str] = mapped_column(Text)
