"""Legacy teachers.json imports: the aliases imported, and the last start-up outcome.

Revision ID: 0003_legacy_imports
Revises: 0002_jobs
Create Date: 2025-01-03

``legacy_imports`` records every alias a ``teachers.json`` import added, so
an alias deleted after its import is not imported again at the next start.
Existing rows that an import (or the SQLite conversion of 0001) created are
recorded here as imported: their status is ``legacy_unverified`` with the
legacy status message, frozen below.

``legacy_import_status`` holds at most one row (``id = 1``): the outcome of
the last start-up import of ``[server] legacy_registry`` (``imported`` or
``refused``, the path, and for a refusal its rule and message), which
``GET /ready`` reports.

Explicit DDL, frozen: this file never imports application code.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0003_legacy_imports"
down_revision: str | None = "0002_jobs"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_OUTCOMES = "outcome IN ('imported', 'refused')"
LEGACY_STATUS_MESSAGE = (
    "migrated from a legacy registry without a verified identity (its api_key_env, if any,"
    " was removed unread); delete this alias and register it again with a credential_id so"
    " both identity probes can run"
)
_BACKFILL = """
INSERT INTO legacy_imports (alias, source, imported_at)
SELECT alias, NULL, :now FROM teachers
WHERE status = 'legacy_unverified' AND status_message = :message
"""


def upgrade() -> None:
    op.create_table(
        "legacy_imports",
        sa.Column("alias", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("imported_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("alias", name="pk_legacy_imports"),
    )
    op.create_table(
        "legacy_import_status",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("rule", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("checked_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_legacy_import_status"),
        sa.CheckConstraint("id = 1", name="ck_legacy_import_status_single_row"),
        sa.CheckConstraint(_OUTCOMES, name="ck_legacy_import_status_outcome"),
    )
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    op.get_bind().execute(sa.text(_BACKFILL), {"now": now, "message": LEGACY_STATUS_MESSAGE})


def downgrade() -> None:
    op.drop_table("legacy_import_status")
    op.drop_table("legacy_imports")
