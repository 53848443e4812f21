"""Initial schema: teachers and probe_receipts.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01

Explicit DDL, frozen: this file never imports application code, so it keeps
creating exactly this schema however ``kiln_registry.db.models`` evolves.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision: str | None = None
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_KINDS = "kind IN ('remote', 'local', 'fixture')"
_STATUSES = "status IN ('verified', 'configured', 'legacy_unverified', 'unavailable', 'launching')"
_OUTCOMES = "outcome IN ('passed', 'failed')"


def upgrade() -> None:
    op.create_table(
        "teachers",
        sa.Column("alias", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=True),
        sa.Column("model_id", sa.Text(), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("credential_id", sa.Text(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("adapter", sa.Text(), nullable=True),
        sa.Column("launch_profile", sa.Text(), nullable=True),
        sa.Column("identity_json", sa.Text(), nullable=True),
        sa.Column("identity_digest", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("alias", name="pk_teachers"),
        sa.CheckConstraint(_KINDS, name="ck_teachers_kind"),
        sa.CheckConstraint(_STATUSES, name="ck_teachers_status"),
    )
    op.create_table(
        "probe_receipts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("identity_digest", sa.Text(), nullable=True),
        sa.Column("report_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_probe_receipts"),
        sa.CheckConstraint(_OUTCOMES, name="ck_probe_receipts_outcome"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_probe_receipts_alias_created_at", "probe_receipts", ["alias", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_probe_receipts_alias_created_at", table_name="probe_receipts")
    op.drop_table("probe_receipts")
    op.drop_table("teachers")
