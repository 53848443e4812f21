"""Writes of the auth layer: audit rows and batched last-used times.

``AuthStore`` wraps the registry's writer sessions (a callable returning one
transaction) so the middleware can record an audit event or the last-used
times of tokens in one short transaction, from a worker thread.  A failed
audit write is logged (never the request's body) and does not change the
response.  Imports the standard library, SQLAlchemy and ``auth.repository``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from kiln_registry.auth.repository import AuditBounds, AuditRepository, TokenRepository

log = logging.getLogger("kiln_registry.auth")

Writing = Callable[[], AbstractContextManager[Session]]


class AuthStore:
    def __init__(self, writing: Writing, bounds: AuditBounds | None = None) -> None:
        self._writing = writing
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

    def touch(self, used: dict[str, str]) -> None:
        try:
            with self._writing() as session:
                TokenRepository(session).touch(used)
        except SQLAlchemyError as exc:
            log.warning("token last-used times not written (%s)", type(exc).__name__)
