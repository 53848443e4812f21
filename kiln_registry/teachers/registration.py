"""Teacher registration, deletion, re-probing and relaunch: the registry's write side.

The rule this module exists for: an alias is persisted and published only
after both live probes (and the cap probe) pass, in one transaction together
with its receipt.  Nothing is written before that, so a registration that
fails or whose server dies mid-probe leaves no trace.  Aliases are
immutable: the ``teachers`` primary key decides races (the early lookup only
spares a teacher a pointless probe); the loser gets ``AliasExists``.
Concurrent probes are capped by the context's ``ProbeLimiter``; a request
over the cap gets ``ProbeBusy`` (503, Retry-After) without touching the
teacher.  How each step is done is the alias's kind's (``teachers.kinds``):
this module looks the kind up and counts the outcome.

Operations return rows and ``ProbeOutcome``s; the API renders them.
Database work runs in worker threads (``asyncio.to_thread``; reads BEGIN
DEFERRED, writes BEGIN IMMEDIATE) so a busy SQLite file never blocks the
event loop; no session is held while a teacher is probed.  Imports the kind
table, rows, the database and ``auth.reserved``; never the API layer or
FastAPI.
"""

from __future__ import annotations

import asyncio

from kiln_registry.auth.reserved import ReservedAliases
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import KilnError, TeacherNotFound
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.kinds import kind_of
from kiln_registry.teachers.local_registration import local_manager
from kiln_registry.teachers.probing import ProbeOutcome
from kiln_registry.teachers.rows import TeacherRequest, load_row, require_identity


async def register_teacher(ctx: TeacherServices, req: TeacherRequest) -> TeacherRow:
    """Prove (as the kind does), then persist; count the outcome for ``/metrics``."""
    try:
        row = await kind_of(req.kind).register(ctx, req)
    except KilnError as exc:
        ctx.metrics.count_registration(exc.code, exc.rule)
        raise
    ctx.metrics.count_registration("registered")
    return row


def _stored_kind(ctx: TeacherServices, alias: str, cap: int) -> str | None:
    with ctx.reading() as session:  # a full reservation table refuses before anything stops
        ReservedAliases(session).require_room(cap)
        row = TeacherRepository(session).get(alias)
        return None if row is None else row.kind


def delete_teacher(ctx: TeacherServices, alias: str) -> None:
    """Stop what the alias's kind runs here, if anything, then remove and reserve the alias."""
    cap = ctx.config.server.max_reserved_aliases
    kind = _stored_kind(ctx, alias, cap)
    if kind is not None:
        kind_of(kind).stop(ctx, alias)
    with ctx.writing() as session:
        if not TeacherRepository(session).delete(alias):
            raise TeacherNotFound(f"teacher alias {alias!r} is not registered")
        ReservedAliases(session).reserve(alias, limit=cap)  # until an admin frees it (issue 15)


async def launch_teacher(ctx: TeacherServices, alias: str) -> TeacherRow:
    """Relaunch an alias whose kind launches here; it must reproduce its stored identity."""
    # Relaunch needs a registry that launches teachers (kiln serve), whatever the alias.
    local_manager(ctx, profiles=False)
    row = await asyncio.to_thread(load_row, ctx, alias)
    return await kind_of(row.kind).relaunch(ctx, row)


async def reprobe_teacher(ctx: TeacherServices, alias: str) -> ProbeOutcome:
    """Re-run the probes pinned to the stored identity; store the receipt either way.

    A failed probe is reflected in the entry (``unavailable`` with the failure in
    ``status_message``) until a later re-probe passes; a refusal before the teacher
    is contacted (busy, credential) changes nothing.
    """
    row = await asyncio.to_thread(load_row, ctx, alias)
    identity = require_identity(row)
    return await kind_of(row.kind).reprobe(ctx, row, identity)
