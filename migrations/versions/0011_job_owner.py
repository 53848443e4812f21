"""Job ownership: the token that submitted a job.

Revision ID: 0011_job_owner
Revises: 0010_job_output
Create Date: 2026-12-03

``jobs.owner`` holds the name of the token that submitted the job (NULL for
a job submitted with auth off, and for every job older than this revision).
A token without ``admin`` sees, cancels and deletes only its own jobs, and
the per-token queue quotas count active jobs by owner through
``ix_jobs_owner_status``.  Existing rows keep NULL: only an admin (or a
registry with auth off) sees them.

Portable DDL only (SQLite and PostgreSQL).  Explicit, frozen: this file never
imports application code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_job_owner"
down_revision: str | None = "0010_job_output"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner", sa.Text(), nullable=True))
    op.create_index("ix_jobs_owner_status", "jobs", ["owner", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_status", table_name="jobs")
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch rebuild of ``jobs`` would
    # drop the table under enforced foreign keys and cascade into ``job_sequences``.
    op.execute("ALTER TABLE jobs DROP COLUMN owner")
