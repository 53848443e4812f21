"""Legacy base: the pre-Alembic registry's single ``teachers`` table.

Revision ID: 0000_legacy_base
Revises:
Create Date: 2025-01-01

Older registries created this table without Alembic.
``kiln_registry.db.engine.upgrade_to_head`` recognises such a file by its
exact column set, stamps it with this revision (its upgrade does not run
there) and upgrades it to head in the same transaction; ``0001_initial``
converts the table.  On an empty database this revision creates the legacy
table (empty) so that every database walks the same history.

Explicit DDL, frozen: this file never imports application code.
"""

from __future__ import annotations

from alembic import op

revision = "0000_legacy_base"
down_revision: str | None = None
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

LEGACY_TEACHERS_DDL = (
    "CREATE TABLE teachers (alias TEXT PRIMARY KEY, kind TEXT NOT NULL, provider TEXT, "
    "model_id TEXT, url TEXT, api_key_env TEXT, notes TEXT, spec_json TEXT NOT NULL, "
    "created_at TEXT NOT NULL)"
)


def upgrade() -> None:
    op.execute(LEGACY_TEACHERS_DDL)


def downgrade() -> None:
    op.drop_table("teachers")
