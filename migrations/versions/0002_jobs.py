"""Job queue: jobs, their pinned sequences, the score cache and device leases.

Revision ID: 0002_jobs
Revises: 0001_initial
Create Date: 2025-01-02

Explicit DDL, frozen: this file never imports application code.  No foreign
key points at ``teachers``: a job pins a copy of its teacher's spec, so the
alias may be deleted (and the job then fails its phase-(a) check).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_jobs"
down_revision: str | None = "0001_initial"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_JOB_STATUSES = "status IN ('queued', 'probing', 'running', 'succeeded', 'failed', 'cancelled')"
_JOB_KINDS = "kind IN ('teacher_scoring')"
_JOB_SOURCES = "source IN ('inline', 'corpus')"


def _job_columns() -> list[sa.Column[object]]:
    text, integer = sa.Text(), sa.Integer()
    return [
        sa.Column("id", text, nullable=False),
        sa.Column("kind", text, nullable=False),
        sa.Column("status", text, nullable=False),
        sa.Column("teacher_alias", text, nullable=False),
        sa.Column("teacher_kind", text, nullable=False),
        sa.Column("teacher_url", text, nullable=False),
        sa.Column("teacher_credential_id", text, nullable=True),
        sa.Column("teacher_model_id", text, nullable=False),
        sa.Column("teacher_created_at", text, nullable=False),
        sa.Column("identity_json", text, nullable=False),
        sa.Column("identity_digest", text, nullable=False),
        sa.Column("top_k", integer, nullable=False),
        sa.Column("source", text, nullable=False),
        sa.Column("corpus_path", text, nullable=True),
        sa.Column("corpus_sha256", text, nullable=True),
        sa.Column("sequence_count", integer, nullable=False),
        sa.Column("token_count", integer, nullable=False),
        sa.Column("device", text, nullable=True),
        sa.Column("claim_token", text, nullable=True),
        sa.Column("cancel_requested", integer, nullable=False),
        sa.Column("attempts", integer, nullable=False),
        sa.Column("scored_count", integer, nullable=False),
        sa.Column("cache_hits", integer, nullable=False),
        sa.Column("requests_sent", integer, nullable=False),
        sa.Column("retries", integer, nullable=False),
        sa.Column("created_at", text, nullable=False),
        sa.Column("claimed_at", text, nullable=True),
        sa.Column("spec_checked_at", text, nullable=True),
        sa.Column("probed_at", text, nullable=True),
        sa.Column("leased_at", text, nullable=True),
        sa.Column("scoring_started_at", text, nullable=True),
        sa.Column("finished_at", text, nullable=True),
        sa.Column("updated_at", text, nullable=False),
        sa.Column("error_code", text, nullable=True),
        sa.Column("error_rule", text, nullable=True),
        sa.Column("error_message", text, nullable=True),
        sa.Column("result_path", text, nullable=True),
        sa.Column("result_sha256", text, nullable=True),
        sa.Column("result_bytes", integer, nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        "jobs",
        *_job_columns(),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.CheckConstraint(_JOB_STATUSES, name="ck_jobs_status"),
        sa.CheckConstraint(_JOB_KINDS, name="ck_jobs_kind"),
        sa.CheckConstraint(_JOB_SOURCES, name="ck_jobs_source"),
    )
    op.create_index("ix_jobs_status_created_at", "jobs", ["status", "created_at"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])
    op.create_table(
        "job_sequences",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("seq_id", sa.Text(), nullable=False),
        sa.Column("token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("token_sha256", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "idx", name="pk_job_sequences"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_sequences_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_table(
        "score_cache",
        sa.Column("identity_digest", sa.Text(), nullable=False),
        sa.Column("top_k", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.Text(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("topk_ids", sa.LargeBinary(), nullable=False),
        sa.Column("topk_logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("token_logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("identity_digest", "top_k", "token_sha256", name="pk_score_cache"),
    )
    op.create_table(
        "device_leases",
        sa.Column("device", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("claim_token", sa.Text(), nullable=False),
        sa.Column("acquired_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("device", name="pk_device_leases"),
    )


def downgrade() -> None:
    op.drop_table("device_leases")
    op.drop_table("score_cache")
    op.drop_table("job_sequences")
    op.drop_index("ix_jobs_created_at", table_name="jobs")
    op.drop_index("ix_jobs_status_created_at", table_name="jobs")
    op.drop_table("jobs")
