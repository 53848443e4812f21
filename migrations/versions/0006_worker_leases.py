"""Job leases for worker processes: a claim is a lease with an owner and an expiry.

Revision ID: 0006_worker_leases
Revises: 0005_off_policy_generation
Create Date: 2026-12-01

``jobs`` gains ``lease_owner`` (the worker holding the job: host name, pid
and a random part) and ``lease_expires_at`` (UTC timestamp text, the format
of every other timestamp); both NULL while no worker holds the job.  Added
with ``ALTER TABLE ... ADD COLUMN`` (batch mode does not rebuild the table for
that on SQLite, so nothing cascades into ``job_sequences``).

``device_leases`` becomes per worker host: its key is ``(host, device)``.
The table is recreated empty: a device lease lives only as long as the job
holding it, and every release before this one dropped all leases at start-up
(an active job found here has no ``lease_expires_at``, so recovery requeues it).

Portable DDL only (SQLite and PostgreSQL).  Explicit, frozen: this file never
imports application code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_worker_leases"
down_revision: str | None = "0005_off_policy_generation"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_LEASE_COLUMNS = ("lease_owner", "lease_expires_at")


def _device_leases(per_host: bool) -> None:
    columns = [sa.Column("host", sa.Text(), nullable=False)] if per_host else []
    key = ("host", "device") if per_host else ("device",)
    op.create_table(
        "device_leases",
        *columns,
        sa.Column("device", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("claim_token", sa.Text(), nullable=False),
        sa.Column("acquired_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(*key, name="pk_device_leases"),
    )


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for name in _LEASE_COLUMNS:
            batch.add_column(sa.Column(name, sa.Text(), nullable=True))
    op.drop_table("device_leases")
    _device_leases(per_host=True)


def downgrade() -> None:
    op.drop_table("device_leases")
    _device_leases(per_host=False)
    # Plain DROP COLUMN (SQLite >= 3.35 and PostgreSQL): a batch rebuild of ``jobs`` would
    # drop the table under enforced foreign keys and cascade into ``job_sequences``.
    for name in _LEASE_COLUMNS:
        op.execute(f"ALTER TABLE jobs DROP COLUMN {name}")
