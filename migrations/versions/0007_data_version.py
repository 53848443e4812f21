"""PostgreSQL: a data version that every registry replica reads to keep its caches coherent.

Revision ID: 0007_data_version
Revises: 0006_worker_leases
Create Date: 2026-12-01

On SQLite the caches of rendered entries and tokens read ``PRAGMA
data_version``, which moves on every commit by any connection; PostgreSQL has
no such counter.  This revision gives it one: ``kiln_data_version`` holds a
single row whose ``version`` a statement-level trigger increments on every
INSERT, UPDATE or DELETE of the tables those caches render from (teachers,
probe_receipts, reserved_aliases, legacy_imports, legacy_import_status,
api_tokens), inside the writing transaction.  A replica reads the row before
serving from its cache, so a change committed on another replica is seen by
the next read.  The job tables are left out: their progress writes would
only empty the caches for nothing.

Nothing happens on SQLite.  Explicit, frozen: this file never imports
application code.
"""

from __future__ import annotations

from alembic import op

revision = "0007_data_version"
down_revision: str | None = "0006_worker_leases"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_TABLES = (
    "teachers",
    "probe_receipts",
    "reserved_aliases",
    "legacy_imports",
    "legacy_import_status",
    "api_tokens",
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "CREATE TABLE kiln_data_version (id INTEGER PRIMARY KEY CHECK (id = 1), "
        "version BIGINT NOT NULL)"
    )
    op.execute("INSERT INTO kiln_data_version (id, version) VALUES (1, 1)")
    op.execute(
        "CREATE FUNCTION kiln_bump_data_version() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN UPDATE kiln_data_version SET version = version + 1 WHERE id = 1; "
        "RETURN NULL; END $$"
    )
    for table in _TABLES:
        op.execute(
            f"CREATE TRIGGER kiln_data_version_{table} AFTER INSERT OR UPDATE OR DELETE "
            f"OR TRUNCATE ON {table} FOR EACH STATEMENT EXECUTE FUNCTION kiln_bump_data_version()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in _TABLES:
        op.execute(f"DROP TRIGGER kiln_data_version_{table} ON {table}")
    op.execute("DROP FUNCTION kiln_bump_data_version()")
    op.execute("DROP TABLE kiln_data_version")
