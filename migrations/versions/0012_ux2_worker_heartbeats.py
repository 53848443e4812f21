"""Worker heartbeats: which job workers are alive, so a queued job is never silent.

Revision ID: 0012_ux2_worker_heartbeats
Revises: 0011_job_owner
Create Date: 2026-12-03

``job_workers`` has one row per running worker process (``kiln worker``, or
the workers embedded in ``kiln serve``): its lease-owner name (host name, pid
and a random part), host, pid, number of claim loops, start time and the time
of its last heartbeat (``seen_at``, UTC timestamp text like every other
timestamp).  A worker writes its row at start, renews ``seen_at`` every
``[jobs] lease_heartbeat_s`` and deletes it on a clean stop; a row not renewed
for ``[jobs] lease_timeout_s`` is a dead worker (``/ready`` and ``/metrics``
count live ones).  Nothing else refers to it, so the upgrade of a populated
database only adds the empty table.

Portable DDL only (SQLite and PostgreSQL).  Explicit, frozen: this file never
imports application code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_ux2_worker_heartbeats"
down_revision: str | None = "0011_job_owner"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None


def upgrade() -> None:
    op.create_table(
        "job_workers",
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Text(), nullable=False),
        sa.Column("seen_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name="pk_job_workers"),
    )
    op.create_index("ix_job_workers_seen_at", "job_workers", ["seen_at"])


def downgrade() -> None:
    op.drop_index("ix_job_workers_seen_at", table_name="job_workers")
    op.drop_table("job_workers")
