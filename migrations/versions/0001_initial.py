"""Initial schema: teachers and probe_receipts, converting the legacy teachers table.

Revision ID: 0001_initial
Revises: 0000_legacy_base
Create Date: 2025-01-01

Revises the legacy base: the legacy ``teachers`` table (empty on a new
database) is renamed aside, the new one created, every legacy row copied as
``legacy_unverified`` with no identity, and the old table dropped.  Only
alias, kind, provider, model_id, url, notes and created_at are copied, plus
``adapter`` when ``spec_json`` holds it as a string.  ``api_key_env`` and
the rest of ``spec_json`` (self-reported bounds that a fresh registration
re-derives by probing) are never read: the dropped table's pages are zeroed
because ``upgrade_to_head`` runs with ``PRAGMA secure_delete = ON``, and the
caller checks the legacy rows (aliases, kinds) before this runs.

Explicit DDL, frozen: this file never imports application code, so it keeps
creating exactly this schema however ``kiln_registry.db.models`` evolves.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision: str | None = "0000_legacy_base"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_KINDS = "kind IN ('remote', 'local', 'fixture')"
_STATUSES = "status IN ('verified', 'configured', 'legacy_unverified', 'unavailable', 'launching')"
_OUTCOMES = "outcome IN ('passed', 'failed')"
_ASIDE = "_kiln_legacy_teachers"
LEGACY_STATUS_MESSAGE = (
    "migrated from a legacy registry without a verified identity (its api_key_env, if any,"
    " was removed unread); delete this alias and register it again with a credential_id so"
    " both identity probes can run"
)
LEGACY_TEACHERS_DDL = (
    "CREATE TABLE teachers (alias TEXT PRIMARY KEY, kind TEXT NOT NULL, provider TEXT, "
    "model_id TEXT, url TEXT, api_key_env TEXT, notes TEXT, spec_json TEXT NOT NULL, "
    "created_at TEXT NOT NULL)"
)
# CASE evaluates lazily: json_type never sees text that is not valid JSON.
_ADAPTER = (
    "CASE WHEN json_valid(spec_json) THEN (CASE WHEN json_type(spec_json, '$.adapter') = 'text'"
    " THEN json_extract(spec_json, '$.adapter') END) END"
)
_COPY_LEGACY = f"""
INSERT INTO teachers (alias, kind, provider, model_id, url, credential_id, notes, adapter,
    launch_profile, identity_json, identity_digest, status, status_message, created_at,
    updated_at)
SELECT alias, kind, provider, model_id, url, NULL, notes, {_ADAPTER}, NULL, NULL, NULL,
    'legacy_unverified', :message, created_at, :now
FROM {_ASIDE}
"""
_COPY_BACK = f"""
INSERT INTO teachers (alias, kind, provider, model_id, url, api_key_env, notes, spec_json,
    created_at)
SELECT alias, kind, provider, model_id, url, NULL, notes,
    json_object('alias', alias, 'kind', kind, 'provider', provider, 'model_id', model_id,
        'url', url, 'notes', notes, 'adapter', adapter),
    created_at
FROM {_ASIDE}
"""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _create_teachers() -> None:
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


def _create_probe_receipts() -> None:
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


def upgrade() -> None:
    op.rename_table("teachers", _ASIDE)
    _create_teachers()
    if op.get_bind().dialect.name == "sqlite":
        # Only a SQLite file can hold legacy rows (and these JSON functions).
        op.execute(sa.text(_COPY_LEGACY).bindparams(message=LEGACY_STATUS_MESSAGE, now=_now()))
    op.drop_table(_ASIDE)
    _create_probe_receipts()


def downgrade() -> None:
    # Back to the legacy table: identities, credentials and statuses are lost,
    # receipts dropped; nothing secret is recreated (api_key_env stays NULL).
    op.drop_index("ix_probe_receipts_alias_created_at", table_name="probe_receipts")
    op.drop_table("probe_receipts")
    op.rename_table("teachers", _ASIDE)
    op.execute(LEGACY_TEACHERS_DDL)
    if op.get_bind().dialect.name == "sqlite":
        op.execute(_COPY_BACK)
    op.drop_table(_ASIDE)
