"""Writes of the auth layer: audit rows and batched last-used times.

``AuthStore`` wraps the registry's writer sessions (a callable returning one
transaction) so the middleware can record an audit event or the last-used
times of tokens in one short transaction, from a worker thread, and ask
whether the log has room for one more event (``room``: the middleware
refuses a state change when it has none).  A failed
audit write is logged (never the request's body) and does not change the
response.  Imports the standard library, SQLAlchemy, ``auth.repository`` and
``config.settings`` (``audit_bounds``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from kiln_registry.auth.repository import AuditBounds, AuditRepository, AuditRoom, TokenRepository
from kiln_registry.config.settings import ServerConfig

log = logging.getLogger("kiln_registry.auth")

Writing = Callable[[], AbstractContextManager[Session]]


def audit_bounds(server: ServerConfig) -> AuditBounds:
    """``[server] audit_max_events`` / ``audit_keep_days`` / ``audit_retain_days`` as bounds."""
    return AuditBounds(
        max_events=server.audit_max_events,
        retain_days=server.audit_retain_days,
        keep_days=server.audit_keep_days,
    )


class AuthStore:
    def __init__(
        self, writing: Writing, bounds: AuditBounds | None = None, reading: Writing | None = None
    ) -> None:
        self._writing = writing
        self._reading = reading or writing  # ``room`` never needs the write lock
        self._bounds = bounds

    def audit(
        self,
        *,
        token_name: str | None,
        action: str,
        target: str | None,
        outcome: str,
        status: int | None,
    ) -> None:
        try:
            with self._writing() as session:
                AuditRepository(session, self._bounds).record(
                    token_name=token_name,
                    action=action,
                    target=target,
                    outcome=outcome,
                    status=status,
                )
        except SQLAlchemyError as exc:
            log.error("audit event %s could not be written (%s)", action, type(exc).__name__)

    def room(self) -> AuditRoom:
        """Whether the audit log can take one more event; a failed read says no (fail closed)."""
        try:
            with self._reading() as session:
                return AuditRepository(session, self._bounds).room()
        except SQLAlchemyError as exc:
            log.error("audit log room could not be read (%s)", type(exc).__name__)
            return AuditRoom(free=False, retry_after_s=5)

    def touch(self, used: dict[str, str]) -> None:
        try:
            with self._writing() as session:
                TokenRepository(session).touch(used)
        except SQLAlchemyError as exc:
            log.warning("token last-used times not written (%s)", type(exc).__name__)
