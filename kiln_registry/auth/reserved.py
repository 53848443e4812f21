"""Reserved aliases: a deleted alias cannot be registered again until an admin frees it.

``refuse_reserved`` raises ``AliasReserved`` (409 ``teacher_alias_reserved``)
inside the caller's transaction, so a registration racing a delete sees the
reservation the delete committed.  Imports SQLAlchemy and ``auth.repository``.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from kiln_registry.auth.repository import ReservedAliases
from kiln_registry.domain.errors import KilnError

__all__ = ["AliasReserved", "ReservedAliases", "refuse_reserved"]


class AliasReserved(KilnError):
    status = 409
    code = "teacher_alias_reserved"


def refuse_reserved(session: Session, alias: str) -> None:
    if ReservedAliases(session).is_reserved(alias):
        raise AliasReserved(
            f"teacher alias {alias!r} was deleted and stays reserved",
            rule="alias.reserved",
            hint="an admin can free it with `kiln teachers release ALIAS`",
        )
