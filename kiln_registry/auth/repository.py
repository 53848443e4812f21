"""SQL of access control: tokens, audit events and reserved aliases.

``TokenRepository``, ``AuditRepository`` and ``ReservedAliases`` work inside
the caller's session (one transaction each call site).  ``TOKENS_SNAPSHOT`` is
the one read the middleware's in-memory token table runs on its own
read-only connection (``auth.cache``).  Nothing here stores or returns a raw
token: ``create`` returns it once, to be printed, and stores its digest.
Imports: SQLAlchemy, ``auth.models``, ``auth.tokens`` and ``db.models``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, cast

from sqlalchemy import CursorResult, delete, func, select, update
from sqlalchemy.orm import Session

from kiln_registry.auth.models import AuditEventRow, ReservedAliasRow, TokenRow
from kiln_registry.auth.tokens import (
    MAX_EXPIRES_DAYS,
    check_name,
    generate_token,
    token_digest,
)
from kiln_registry.db.models import TIMESTAMP_FORMAT, utc_timestamp
from kiln_registry.db.repository import add_unless_duplicate
from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.domain.text import quoted

MAX_TOKENS: Final = 1000
MAX_AUDIT_LIMIT: Final = 1000
MAX_TARGET_CHARS: Final = 512
DEFAULT_MAX_EVENTS: Final = 1_000_000
DEFAULT_KEEP_DAYS: Final = 30
DEFAULT_MAX_RESERVED: Final = 100_000
PRUNE_PEEK: Final = 256  # oldest events looked at per write for audit_retain_days
TOKENS_SNAPSHOT: Final = "SELECT name, digest, scopes, expires_at FROM api_tokens LIMIT 1001"


class TokenNameExists(KilnError):
    status = 409
    code = "token_exists"


class TokenNotFound(KilnError):
    status = 404
    code = "token_not_found"


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, TIMESTAMP_FORMAT).replace(tzinfo=UTC)


class TokenRepository:
    def __init__(self, session: Session) -> None:
        self._session = session

    def create(self, name: str, scopes: frozenset[str], expires_in_days: int | None) -> str:
        """Store a new token's digest; returns the token (the only time it exists)."""
        check_name(name)
        if expires_in_days is not None and not 1 <= expires_in_days <= MAX_EXPIRES_DAYS:
            raise InputError(
                f"--expires-in must be 1..{MAX_EXPIRES_DAYS} days", rule="tokens.expires"
            )
        count = len(list(self._session.scalars(select(TokenRow.name).limit(MAX_TOKENS))))
        if count >= MAX_TOKENS:
            raise InputError(f"at most {MAX_TOKENS} tokens; revoke one first", rule="tokens.max")
        token = generate_token()
        now = datetime.now(UTC)
        expires = None
        if expires_in_days is not None:
            expires = (now + timedelta(days=expires_in_days)).strftime(TIMESTAMP_FORMAT)
        row = TokenRow(
            name=name,
            digest=token_digest(token),
            scopes=" ".join(sorted(scopes)),
            created_at=now.strftime(TIMESTAMP_FORMAT),
            expires_at=expires,
        )
        if not add_unless_duplicate(self._session, row):
            raise TokenNameExists(
                f"a token named {name!r} exists", hint="revoke it first, or pick another name"
            )
        return token

    def list_all(self) -> list[TokenRow]:
        return list(
            self._session.scalars(select(TokenRow).order_by(TokenRow.name).limit(MAX_TOKENS))
        )

    def revoke(self, name: str) -> None:
        result = self._session.execute(delete(TokenRow).where(TokenRow.name == name))
        if cast("CursorResult[Any]", result).rowcount == 0:
            raise TokenNotFound(f"no token named {quoted(name, 64)}", hint="see `kiln tokens list`")

    def touch(self, used: dict[str, str]) -> None:
        """Record last-used times (a batch, at most one write per token a minute)."""
        for name, at in list(used.items())[:MAX_TOKENS]:
            self._session.execute(
                update(TokenRow).where(TokenRow.name == name).values(last_used_at=at)
            )


class ReservedAliasesFull(KilnError):
    status = 409
    code = "reserved_aliases_full"


@dataclass(frozen=True, slots=True)
class AuditBounds:
    """``[server] audit_max_events``, ``audit_keep_days`` and ``audit_retain_days``.

    At most ``max_events`` events are kept (counted by event id), but an event
    younger than ``keep_days`` is never dropped: when the log holds
    ``max_events`` and its oldest is that young, it is full (``room`` is False)
    and the registry refuses state changes instead of forgetting (issue 27).
    """

    max_events: int = DEFAULT_MAX_EVENTS
    retain_days: int | None = None
    keep_days: float = DEFAULT_KEEP_DAYS


@dataclass(frozen=True, slots=True)
class AuditRoom:
    """Whether one more event fits; if not, seconds until the oldest may be dropped."""

    free: bool
    retry_after_s: int = 0


class AuditRepository:
    """Audit events.  Every write also drops the events past ``bounds`` (bounded work)."""

    def __init__(self, session: Session, bounds: AuditBounds | None = None) -> None:
        self._session = session
        self._bounds = bounds or AuditBounds()

    def record(
        self,
        *,
        token_name: str | None,
        action: str,
        target: str | None,
        outcome: str,
        status: int | None = None,
    ) -> None:
        row = AuditEventRow(
            at=utc_timestamp(),
            token_name=token_name,
            action=action,
            target=None if target is None else target[:MAX_TARGET_CHARS],
            outcome=outcome,
            status=status,
        )
        self._session.add(row)
        self._session.flush()
        self._prune(row.id)

    def _keep_cutoff(self) -> str:
        """Events at or after this time are never dropped (``keep_days``)."""
        return (datetime.now(UTC) - timedelta(days=self._bounds.keep_days)).strftime(
            TIMESTAMP_FORMAT
        )

    def room(self) -> AuditRoom:
        """Whether a new event fits without dropping one younger than ``keep_days``.

        Two index lookups (the newest and oldest ids), so every state change can ask.
        """
        newest = self._session.scalar(select(func.max(AuditEventRow.id)))
        oldest = self._session.execute(
            select(AuditEventRow.id, AuditEventRow.at).order_by(AuditEventRow.id).limit(1)
        ).first()
        if newest is None or oldest is None or newest - oldest[0] + 1 < self._bounds.max_events:
            return AuditRoom(free=True)
        if oldest[1] < self._keep_cutoff():
            return AuditRoom(free=True)
        droppable = parse_time(oldest[1]) + timedelta(days=self._bounds.keep_days)
        wait = (droppable - datetime.now(UTC)).total_seconds()
        return AuditRoom(free=False, retry_after_s=max(1, min(int(wait) + 1, 86_400)))

    def _prune(self, newest: int) -> None:
        """Keep at most ``max_events`` (ids never repeat) and none past ``retain_days``.

        Never drops an event younger than ``keep_days`` (the documented retention).
        """
        self._session.execute(
            delete(AuditEventRow).where(
                AuditEventRow.id <= newest - self._bounds.max_events,
                AuditEventRow.at < self._keep_cutoff(),
            )
        )
        if self._bounds.retain_days is None:
            return
        cutoff = datetime.now(UTC) - timedelta(days=self._bounds.retain_days)
        oldest = self._session.execute(
            select(AuditEventRow.id, AuditEventRow.at).order_by(AuditEventRow.id).limit(PRUNE_PEEK)
        ).all()
        expired = [i for i, at in oldest if at < cutoff.strftime(TIMESTAMP_FORMAT) and i != newest]
        if expired:
            self._session.execute(delete(AuditEventRow).where(AuditEventRow.id.in_(expired)))

    def list_events(self, *, limit: int, before: int | None = None) -> list[AuditEventRow]:
        """Newest first; ``before`` (an event id) pages back."""
        if not 1 <= limit <= MAX_AUDIT_LIMIT + 1:
            raise InputError(f"limit must be 1..{MAX_AUDIT_LIMIT}", rule="audit.limit")
        query = select(AuditEventRow).order_by(AuditEventRow.id.desc()).limit(limit)
        if before is not None:
            query = query.where(AuditEventRow.id < before)
        return list(self._session.scalars(query))


class ReservedAliases:
    def __init__(self, session: Session) -> None:
        self._session = session

    def reserve(self, alias: str, *, limit: int = DEFAULT_MAX_RESERVED) -> None:
        """Reserve a deleted alias; ``ReservedAliasesFull`` when ``limit`` are reserved."""
        if self._session.get(ReservedAliasRow, alias) is not None:
            return
        self.require_room(limit)
        self._session.add(ReservedAliasRow(alias=alias, reserved_at=utc_timestamp()))
        self._session.flush()

    def require_room(self, limit: int) -> None:
        """``ReservedAliasesFull`` unless fewer than ``limit`` aliases are reserved."""
        held = self._session.scalar(
            select(func.count()).select_from(select(ReservedAliasRow.alias).limit(limit).subquery())
        )
        if (held or 0) >= limit:
            raise ReservedAliasesFull(
                f"{limit} deleted aliases are reserved already ([server] max_reserved_aliases);"
                " the alias was not deleted",
                rule="alias.reserved_full",
                hint="an admin can free deleted aliases with `kiln teachers release ALIAS`,"
                " or raise [server] max_reserved_aliases",
            )

    def is_reserved(self, alias: str) -> bool:
        return self._session.get(ReservedAliasRow, alias) is not None

    def release(self, alias: str) -> bool:
        result = self._session.execute(
            delete(ReservedAliasRow).where(ReservedAliasRow.alias == alias)
        )
        return cast("CursorResult[Any]", result).rowcount > 0
