"""A scoring job's output: its signed corpus, or also Kiln's logit cache v3 (issue 26).

Revision ID: 0010_job_output
Revises: 0009_bigint_counters
Create Date: 2026-12-03

``jobs`` gains ``output`` (text, NULL): ``kiln-logit-cache-v3`` when a
teacher-scoring job also publishes its rows into ``[jobs] logit_cache_root``;
NULL for every other job, and for every job queued before this revision (they
write their corpus only, as before).  Added with ``ALTER TABLE ... ADD COLUMN``
(no table rebuild on SQLite, so nothing cascades into ``job_sequences``).

Portable DDL only (SQLite and PostgreSQL).  Explicit, frozen: this file never
imports application code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_job_output"
down_revision: str | None = "0009_bigint_counters"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("output", sa.Text(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch rebuild of ``jobs`` would
    # drop the table under enforced foreign keys and cascade into ``job_sequences``.
    op.execute("ALTER TABLE jobs DROP COLUMN output")
