"""Reserved aliases: a deleted alias cannot be registered again until an admin frees it.

``refuse_reserved`` raises ``AliasReserved`` (409 ``teacher_alias_reserved``)
inside the caller's transaction, so a registration racing a delete sees the
reservation the delete committed.  A look-alike of a reserved alias (the same
``domain.alias_skeleton``) is refused the same way (rule
``alias.reserved_lookalike``), so nobody can hold ``VICTIM-X`` while
``victim-x`` waits for its owner.  Imports SQLAlchemy, ``auth.models``,
``auth.repository`` and ``domain``.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln_registry.auth.models import ReservedAliasRow
from kiln_registry.auth.repository import ReservedAliases
from kiln_registry.domain.alias_skeleton import alias_skeleton
from kiln_registry.domain.errors import KilnError

SCAN_BATCH: Final = 1_000

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
    lookalike = reserved_lookalike(session, alias)
    if lookalike is not None:
        raise AliasReserved(
            f"teacher alias {alias!r} differs from the reserved (deleted) alias {lookalike!r}"
            " only by case, Unicode compatibility form or look-alike characters",
            rule="alias.reserved_lookalike",
            hint="choose another alias; an admin can free the reserved one with"
            " `kiln teachers release ALIAS`",
        )


def reserved_lookalike(session: Session, alias: str) -> str | None:
    """A reserved alias other than ``alias`` with its skeleton, if any.

    Reads the reservations in batches of ``SCAN_BATCH``; the table itself is
    bounded by ``[server] max_reserved_aliases``.
    """
    skeleton = alias_skeleton(alias)
    rows = session.execute(
        select(ReservedAliasRow.alias).execution_options(yield_per=SCAN_BATCH)
    ).scalars()
    for other in rows:
        if other != alias and alias_skeleton(other) == skeleton:
            return other
    return None
