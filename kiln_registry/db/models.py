"""SQLAlchemy 2 declarative rows for the registry database.

This module owns the Python view of the tables (``TeacherRow``,
``ProbeReceiptRow``, and for legacy ``teachers.json`` imports
``LegacyImportRow`` and ``LegacyImportStatusRow``), the allowed values of
their CHECK-constrained columns and the timestamp format. It does NOT own
the schema: Alembic revisions under ``migrations/versions`` create and
change tables with explicit ``op.*`` code, and ``metadata`` here is kept in
step with them for reference (a test compares the two). No row holds a
secret: teachers store a ``credential_id`` (a name), never a key.

Imports: the standard library, SQLAlchemy and ``kiln_registry.domain.vocabulary``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from kiln_registry.domain.vocabulary import TEACHER_KINDS_REMOTE_FIRST, TeacherStatus

# The CHECK lists, in the order the migrations wrote them (the SQL stays byte-identical);
# the values are ``domain.vocabulary``'s.
TEACHER_KINDS: Final[tuple[str, ...]] = TEACHER_KINDS_REMOTE_FIRST
TEACHER_STATUSES: Final[tuple[str, ...]] = tuple(status.value for status in TeacherStatus)
RECEIPT_OUTCOMES: Final = ("passed", "failed")
LEGACY_IMPORT_OUTCOMES: Final = ("imported", "refused")
REPLICA_STATUSES: Final = ("verified", "unavailable")

# Explicit constraint names keep Alembic batch operations on SQLite
# deterministic: a batch "move and copy" can only drop or alter a constraint
# it can name.
NAMING_CONVENTION: Final = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# Every stored timestamp: ISO-8601 UTC with microseconds (also parsed back by auth and jobs).
TIMESTAMP_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def utc_timestamp() -> str:
    """The current time as ISO-8601 UTC with microseconds, e.g. ``2025-01-02T03:04:05.000006Z``.

    Fixed width, so text order is time order.
    """
    return datetime.now(UTC).strftime(TIMESTAMP_FORMAT)


# A 64-bit counter (revision 0009): BIGINT on PostgreSQL; SQLite's INTEGER already holds 64
# bits, and an INTEGER PRIMARY KEY must keep that spelling to stay the rowid.
COUNTER64: Final = BigInteger().with_variant(Integer(), "sqlite")


def in_list(column: str, values: tuple[str, ...]) -> str:
    """The CHECK expression ``column IN ('a', 'b')`` (values are fixed identifiers)."""
    quoted = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({quoted})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class TeacherRow(Base):
    """One registered alias.  Immutable identity; only status fields change."""

    __tablename__ = "teachers"
    __table_args__ = (
        CheckConstraint(in_list("kind", TEACHER_KINDS), name="kind"),
        CheckConstraint(in_list("status", TEACHER_STATUSES), name="status"),
    )

    alias: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    provider: Mapped[str | None] = mapped_column(Text)
    model_id: Mapped[str | None] = mapped_column(Text)
    url: Mapped[str | None] = mapped_column(Text)
    credential_id: Mapped[str | None] = mapped_column(Text)
    notes: Mapped[str | None] = mapped_column(Text)
    adapter: Mapped[str | None] = mapped_column(Text)
    launch_profile: Mapped[str | None] = mapped_column(Text)
    identity_json: Mapped[str | None] = mapped_column(Text)
    identity_digest: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    status_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(Text, default=utc_timestamp)
    updated_at: Mapped[str] = mapped_column(Text, default=utc_timestamp)
    # A replica-set alias's endpoints (revision 0008), loaded with the row; empty otherwise.
    replicas: Mapped[list[TeacherReplicaRow]] = relationship(
        lazy="selectin",
        order_by="TeacherReplicaRow.idx",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )

    def __init__(self, **fields: Any) -> None:
        fields.setdefault("replicas", [])  # loaded, so readable after the session closes
        super().__init__(**fields)

    def __repr__(self) -> str:
        return f"TeacherRow(alias={self.alias!r}, kind={self.kind!r}, status={self.status!r})"


class ProbeReceiptRow(Base):
    """The outcome of one identity probe.  No foreign key: receipts outlive their alias."""

    __tablename__ = "probe_receipts"
    __table_args__ = (
        CheckConstraint(in_list("outcome", RECEIPT_OUTCOMES), name="outcome"),
        Index("ix_probe_receipts_alias_created_at", "alias", "created_at"),
        # AUTOINCREMENT: a deleted receipt's id is never handed out again.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(COUNTER64, primary_key=True, autoincrement=True)
    alias: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(Text, default=utc_timestamp)
    outcome: Mapped[str] = mapped_column(Text)
    identity_digest: Mapped[str | None] = mapped_column(Text)
    report_json: Mapped[str] = mapped_column(Text)

    def __repr__(self) -> str:
        return f"ProbeReceiptRow(id={self.id!r}, alias={self.alias!r}, outcome={self.outcome!r})"


class LegacyImportRow(Base):
    """An alias a ``teachers.json`` import added; kept after the alias is deleted."""

    __tablename__ = "legacy_imports"

    alias: Mapped[str] = mapped_column(Text, primary_key=True)
    source: Mapped[str | None] = mapped_column(Text)
    imported_at: Mapped[str] = mapped_column(Text, default=utc_timestamp)


class LegacyImportStatusRow(Base):
    """The last start-up import of ``[server] legacy_registry`` (one row, ``id = 1``)."""

    __tablename__ = "legacy_import_status"
    __table_args__ = (
        CheckConstraint("id = 1", name="single_row"),
        CheckConstraint(in_list("outcome", LEGACY_IMPORT_OUTCOMES), name="outcome"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    source: Mapped[str] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(Text)
    rule: Mapped[str | None] = mapped_column(Text)
    message: Mapped[str] = mapped_column(Text)
    checked_at: Mapped[str] = mapped_column(Text, default=utc_timestamp)


class TeacherReplicaRow(Base):
    """One endpoint of an alias registered with ``urls`` (revision 0008); gone with its alias."""

    __tablename__ = "teacher_replicas"
    __table_args__ = (
        PrimaryKeyConstraint("alias", "idx", name="pk_teacher_replicas"),
        UniqueConstraint("alias", "url", name="uq_teacher_replicas_alias_url"),
        CheckConstraint(in_list("status", REPLICA_STATUSES), name="status"),
        ForeignKeyConstraint(["alias"], ["teachers.alias"], ondelete="CASCADE"),
    )

    alias: Mapped[str] = mapped_column(Text)
    idx: Mapped[int] = mapped_column(Integer)
    url: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    status_message: Mapped[str | None] = mapped_column(Text)
    identity_digest: Mapped[str | None] = mapped_column(Text)
    checked_at: Mapped[str] = mapped_column(Text, default=utc_timestamp)


metadata: Final = Base.metadata
