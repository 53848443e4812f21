"""Access control: API token digests, the audit log and reserved (deleted) aliases.

Revision ID: 0004_access_control
Revises: 0003_legacy_imports
Create Date: 2026-12-01

``api_tokens`` stores one SHA-256 digest per token (never a token) with its
name, space-separated scopes and times.  ``audit_events`` records every state
change (time, token name, action, alias or job id, outcome, HTTP status).
``reserved_aliases`` keeps a deleted alias from being registered again until
an admin releases it.  Explicit DDL, frozen: this file never imports
application code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_access_control"
down_revision: str | None = "0003_legacy_imports"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("digest", sa.Text(), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.Text(), nullable=True),
        sa.Column("last_used_at", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_api_tokens"),
        sa.CheckConstraint("length(digest) = 64", name="ck_api_tokens_digest_length"),
    )
    op.create_index("ix_api_tokens_digest", "api_tokens", ["digest"], unique=True)
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Text(), nullable=False),
        sa.Column("token_name", sa.Text(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_audit_events"),
        sa.CheckConstraint(
            "outcome IN ('ok', 'refused', 'failed')", name="ck_audit_events_outcome"
        ),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "reserved_aliases",
        sa.Column("alias", sa.Text(), nullable=False),
        sa.Column("reserved_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("alias", name="pk_reserved_aliases"),
    )


def downgrade() -> None:
    op.drop_table("reserved_aliases")
    op.drop_table("audit_events")
    op.drop_index("ix_api_tokens_digest", table_name="api_tokens")
    op.drop_table("api_tokens")
