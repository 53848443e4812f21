"""SQLAlchemy rows of access control, on the registry's declarative ``Base``.

Owns the Python view of ``api_tokens``, ``audit_events`` and
``reserved_aliases`` (created by ``migrations/versions/0004_access_control.py``,
the schema's owner).  ``api_tokens`` holds a SHA-256 digest per token, never a
token; ``audit_events`` holds token names, actions and targets, never a secret.
Imports: SQLAlchemy and ``kiln_registry.db.models``.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import CheckConstraint, Index, Integer, Text
from sqlalchemy.orm import Mapped, mapped_column

from kiln_registry.db.models import COUNTER64, Base, utc_timestamp

AUDIT_OUTCOMES: Final = ("ok", "refused", "failed")


class TokenRow(Base):
    """One API token: its name, digest, scopes (space-separated) and times."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint("length(digest) = 64", name="digest_length"),
        Index("ix_api_tokens_digest", "digest", unique=True),
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    digest: Mapped[str] = mapped_column(Text)
    scopes: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(Text, default=utc_timestamp)
    expires_at: Mapped[str | None] = mapped_column(Text)
    last_used_at: Mapped[str | None] = mapped_column(Text)

    def __repr__(self) -> str:
        return f"TokenRow(name={self.name!r}, scopes={self.scopes!r})"


class AuditEventRow(Base):
    """One state change: when, by which token, what, on which alias or job, outcome."""

    __tablename__ = "audit_events"
    __table_args__ = (
        CheckConstraint(
            "outcome IN (" + ", ".join(f"'{o}'" for o in AUDIT_OUTCOMES) + ")", name="outcome"
        ),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(COUNTER64, primary_key=True, autoincrement=True)
    at: Mapped[str] = mapped_column(Text, default=utc_timestamp)
    token_name: Mapped[str | None] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)
    target: Mapped[str | None] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(Text)
    status: Mapped[int | None] = mapped_column(Integer)


class ReservedAliasRow(Base):
    """A deleted alias, reserved until an admin releases it."""

    __tablename__ = "reserved_aliases"

    alias: Mapped[str] = mapped_column(Text, primary_key=True)
    reserved_at: Mapped[str] = mapped_column(Text, default=utc_timestamp)
