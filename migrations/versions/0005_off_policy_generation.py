"""Off-policy generation jobs: a new job kind, its settings, prompts and generation cache.

Revision ID: 0005_off_policy_generation
Revises: 0004_access_control
Create Date: 2026-12-01

``jobs`` gains the kind ``off_policy_generation`` (a CHECK change, so the
table is rebuilt) and ``generation_json`` (the job's canonical sampling
settings, NULL for scoring jobs); ``job_sequences`` gains ``messages_json``
(the canonical chat messages of a generation prompt, NULL for scoring).
``generation_cache`` holds verified generations keyed by (identity digest,
settings SHA-256, prompt token-ids SHA-256).

SQLite cannot alter a CHECK, and the upgrade runs in one transaction with
foreign keys enforced, so dropping ``jobs`` would cascade into
``job_sequences``: the child rows are first copied aside, the child table
dropped, ``jobs`` rebuilt (data copied), and the child table recreated and
refilled.  Explicit DDL, frozen: this file never imports application code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_off_policy_generation"
down_revision: str | None = "0004_access_control"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_JOB_STATUSES = "status IN ('queued', 'probing', 'running', 'succeeded', 'failed', 'cancelled')"
_KINDS_OLD = "kind IN ('teacher_scoring')"
_KINDS_NEW = "kind IN ('teacher_scoring', 'off_policy_generation')"
_JOB_SOURCES = "source IN ('inline', 'corpus')"
_TEXT_NULL = ("teacher_credential_id", "corpus_path", "corpus_sha256", "device", "claim_token",
              "claimed_at", "spec_checked_at", "probed_at", "leased_at", "scoring_started_at",
              "finished_at", "error_code", "error_rule", "error_message", "result_path",
              "result_sha256")  # fmt: skip
_INTS = ("top_k", "sequence_count", "token_count", "cancel_requested", "attempts",
         "scored_count", "cache_hits", "requests_sent", "retries", "result_bytes")  # fmt: skip
_ORDER = ("id", "kind", "status", "teacher_alias", "teacher_kind", "teacher_url",
          "teacher_credential_id", "teacher_model_id", "teacher_created_at", "identity_json",
          "identity_digest", "top_k", "source", "corpus_path", "corpus_sha256", "sequence_count",
          "token_count", "device", "claim_token", "cancel_requested", "attempts", "scored_count",
          "cache_hits", "requests_sent", "retries", "created_at", "claimed_at",
          "spec_checked_at", "probed_at", "leased_at", "scoring_started_at", "finished_at",
          "updated_at", "error_code", "error_rule", "error_message", "result_path",
          "result_sha256", "result_bytes")  # fmt: skip


def _job_columns(generation: bool) -> list[sa.Column[object]]:
    columns: list[sa.Column[object]] = []
    for name in _ORDER:
        kind: sa.types.TypeEngine[object] = sa.Integer() if name in _INTS else sa.Text()
        nullable = name in _TEXT_NULL or name == "result_bytes"
        columns.append(sa.Column(name, kind, nullable=nullable))
    if generation:
        columns.append(sa.Column("generation_json", sa.Text(), nullable=True))
    return columns


def _sequence_columns(generation: bool) -> list[sa.Column[object]]:
    columns: list[sa.Column[object]] = [
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("seq_id", sa.Text(), nullable=False),
        sa.Column("token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("token_sha256", sa.Text(), nullable=False),
    ]
    if generation:
        columns.append(sa.Column("messages_json", sa.Text(), nullable=True))
    return columns


def _alter_in_place(generation: bool) -> None:
    """PostgreSQL: the same target shape by ALTER (it has real ALTER TABLE)."""
    op.drop_constraint("ck_jobs_kind", "jobs", type_="check")
    op.create_check_constraint("ck_jobs_kind", "jobs", _KINDS_NEW if generation else _KINDS_OLD)
    if generation:
        op.add_column("jobs", sa.Column("generation_json", sa.Text(), nullable=True))
        op.add_column("job_sequences", sa.Column("messages_json", sa.Text(), nullable=True))
    else:
        op.drop_column("jobs", "generation_json")
        op.drop_column("job_sequences", "messages_json")


def _rebuild(generation: bool) -> None:
    """Recreate ``jobs`` and ``job_sequences`` in the target shape, keeping every row."""
    if op.get_bind().dialect.name != "sqlite":
        _alter_in_place(generation)
        return
    seq_cols = "job_id, idx, seq_id, token_ids, token_sha256"
    op.execute(f"CREATE TABLE _kiln_seq_keep AS SELECT {seq_cols} FROM job_sequences")
    op.drop_table("job_sequences")
    op.create_table(
        "_kiln_jobs_new",
        *_job_columns(generation),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.CheckConstraint(_JOB_STATUSES, name="ck_jobs_status"),
        sa.CheckConstraint(_KINDS_NEW if generation else _KINDS_OLD, name="ck_jobs_kind"),
        sa.CheckConstraint(_JOB_SOURCES, name="ck_jobs_source"),
    )
    cols = ", ".join(_ORDER)
    op.execute(f"INSERT INTO _kiln_jobs_new ({cols}) SELECT {cols} FROM jobs")
    op.drop_index("ix_jobs_created_at", table_name="jobs")
    op.drop_index("ix_jobs_status_created_at", table_name="jobs")
    op.drop_table("jobs")
    op.rename_table("_kiln_jobs_new", "jobs")
    op.create_index("ix_jobs_status_created_at", "jobs", ["status", "created_at"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])
    op.create_table(
        "job_sequences",
        *_sequence_columns(generation),
        sa.PrimaryKeyConstraint("job_id", "idx", name="pk_job_sequences"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_sequences_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.execute(
        f"INSERT INTO job_sequences ({seq_cols}) SELECT {seq_cols} FROM _kiln_seq_keep"
        " WHERE job_id IN (SELECT id FROM jobs)"
    )
    op.drop_table("_kiln_seq_keep")


def upgrade() -> None:
    _rebuild(generation=True)
    op.create_table(
        "generation_cache",
        sa.Column("identity_digest", sa.Text(), nullable=False),
        sa.Column("settings_sha256", sa.Text(), nullable=False),
        sa.Column("prompt_sha256", sa.Text(), nullable=False),
        sa.Column("result_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(
            "identity_digest", "settings_sha256", "prompt_sha256", name="pk_generation_cache"
        ),
    )


def downgrade() -> None:
    op.drop_table("generation_cache")
    op.execute("DELETE FROM job_sequences WHERE job_id IN"
               " (SELECT id FROM jobs WHERE kind = 'off_policy_generation')")  # fmt: skip
    op.execute("DELETE FROM jobs WHERE kind = 'off_policy_generation'")
    _rebuild(generation=False)
