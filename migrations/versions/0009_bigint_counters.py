"""Counters past 2^31: every byte, token and row counter is a 64-bit integer.

Revision ID: 0009_bigint_counters
Revises: 0008_teacher_replicas
Create Date: 2026-12-03

PostgreSQL's ``INTEGER`` is 32 bits: a corpus over 2 GiB (``jobs.result_bytes``)
or a job of more than 2^31 tokens (``jobs.token_count``) failed at publication.
This revision widens, on PostgreSQL, the job counters (``sequence_count``,
``token_count``, ``scored_count``, ``cache_hits``, ``requests_sent``,
``retries``, ``result_bytes``), ``score_cache.row_count`` and the ids of the two
append-only logs (``probe_receipts.id``, ``audit_events.id``, with their
sequences) to ``BIGINT``.

SQLite has no 32-bit column: an ``INTEGER`` column already stores any 64-bit
signed value (and an ``INTEGER PRIMARY KEY`` must stay spelled ``INTEGER`` to
remain the rowid), so on SQLite this revision changes nothing.

Portable: each statement runs only on PostgreSQL.  Explicit, frozen: this file
never imports application code.
"""

from __future__ import annotations

from alembic import op

revision = "0009_bigint_counters"
down_revision: str | None = "0008_teacher_replicas"
branch_labels: tuple[str, ...] | None = None
depends_on: tuple[str, ...] | None = None

_COUNTERS: tuple[tuple[str, str], ...] = (
    ("jobs", "sequence_count"),
    ("jobs", "token_count"),
    ("jobs", "scored_count"),
    ("jobs", "cache_hits"),
    ("jobs", "requests_sent"),
    ("jobs", "retries"),
    ("jobs", "result_bytes"),
    ("score_cache", "row_count"),
    ("probe_receipts", "id"),
    ("audit_events", "id"),
)
_SEQUENCES = ("probe_receipts_id_seq", "audit_events_id_seq")


def _retype(kind: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in _COUNTERS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {kind}")
    for sequence in _SEQUENCES:
        op.execute(f"ALTER SEQUENCE {sequence} AS {kind}")


def upgrade() -> None:
    _retype("BIGINT")


def downgrade() -> None:
    # Narrowing fails (and rolls back) when a stored value no longer fits 32 bits.
    _retype("INTEGER")
