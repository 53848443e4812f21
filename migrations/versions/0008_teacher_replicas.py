"""Teacher replica sets: one alias, several endpoints presenting one identity.

Revision ID: 0008_teacher_replicas
Revises: 0007_data_version
Create Date: 2026-12-01

``teacher_replicas`` holds one row per endpoint of an alias registered with
``urls``: its position (``idx``, from 0), URL, status (``verified`` or
``unavailable``) and message, the identity digest its last probe proved and
when (``checked_at``).  Keyed by ``(alias, idx)``, each URL once per alias,
and deleted with its alias (``ON DELETE CASCADE``; SQLite enforces it because
every connection turns ``foreign_keys`` on).  A single-URL alias has no rows
here; ``teachers.url`` keeps the first replica's URL either way.

On PostgreSQL the table joins those whose writes bump ``kiln_data_version``
(revision 0007's trigger function), so every registry replica re-reads an
entry whose replica statuses changed.

Portable DDL only (SQLite and PostgreSQL).  Explicit, frozen: this file never
imports application code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_teacher_replicas"
down_revision: str | None = "0007_data_version"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_STATUSES = "status IN ('verified', 'unavailable')"
_TRIGGER = "kiln_data_version_teacher_replicas"


def upgrade() -> None:
    op.create_table(
        "teacher_replicas",
        sa.Column("alias", sa.Text(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("identity_digest", sa.Text(), nullable=True),
        sa.Column("checked_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("alias", "idx", name="pk_teacher_replicas"),
        sa.UniqueConstraint("alias", "url", name="uq_teacher_replicas_alias_url"),
        sa.CheckConstraint(_STATUSES, name="ck_teacher_replicas_status"),
        sa.ForeignKeyConstraint(
            ["alias"],
            ["teachers.alias"],
            name="fk_teacher_replicas_alias_teachers",
            ondelete="CASCADE",
        ),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"CREATE TRIGGER {_TRIGGER} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON "
            "teacher_replicas FOR EACH STATEMENT EXECUTE FUNCTION kiln_bump_data_version()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP TRIGGER {_TRIGGER} ON teacher_replicas")
    op.drop_table("teacher_replicas")
