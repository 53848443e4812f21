"""A job whose probe fails marks its teacher unavailable, exactly as a failed re-probe does.

A job re-probes its pinned teacher before scoring (``jobs.runner``, phase b).
When that probe reaches the teacher and fails, the alias becomes
``unavailable`` with the re-probe's own ``status_message``
(``reprobe.reprobe_failure_message``) and the audit log gets the
re-probe's event (``teacher.probe`` on the alias, outcome ``refused`` or
``failed`` by the error's HTTP status, under the name of the token that
submitted the job), so the next submission is refused up front instead of
failing later; a passing re-probe (``POST /v1/teachers/{alias}/probe``)
makes it ``verified`` again, as after any failed re-probe.

Concurrency: the job may have pinned a registration that is gone.  The mark
is written only when, inside the one write transaction, the alias's row is
still the registration the job pinned (same ``created_at`` and identity
digest) and is ``verified``; a newer registration under the same alias, or
an alias that is unavailable for another reason (a stopped local teacher, a
missing credential), is left as it is.  Imports the database, ``auth``'s
audit repository, the domain and ``teachers.registration``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from kiln_registry.auth.repository import AuditBounds, AuditRepository
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import KilnError
from kiln_registry.domain.vocabulary import TeacherStatus
from kiln_registry.teachers.reprobe import reprobe_failure_message

PROBE_ACTION = "teacher.probe"  # the audit action of POST /v1/teachers/{alias}/probe


@dataclass(frozen=True, slots=True)
class PinnedRegistration:
    """Which registration a job pinned, and whose job it is."""

    alias: str
    created_at: str
    identity_digest: str
    owner: str | None


def mark_failed_probe(
    session: Session,
    pinned: PinnedRegistration,
    exc: KilnError,
    *,
    secret_names: frozenset[str],
    bounds: AuditBounds | None = None,
) -> bool:
    """Within the caller's write transaction: mark the pinned alias unavailable and audit it.

    Returns whether the alias was marked (False: replaced, deleted or not ``verified``).
    """
    repo = TeacherRepository(session)
    row = repo.get(pinned.alias)
    if (
        row is None
        or row.created_at != pinned.created_at
        or row.identity_digest != pinned.identity_digest
        or row.status != TeacherStatus.verified
    ):
        return False
    message = reprobe_failure_message(secret_names, pinned.alias, exc)
    repo.update_status(pinned.alias, TeacherStatus.unavailable.value, message)
    outcome = "refused" if exc.status < 500 else "failed"  # the middleware's rule
    AuditRepository(session, bounds).record(
        token_name=pinned.owner,
        action=PROBE_ACTION,
        target=pinned.alias,
        outcome=outcome,
        status=exc.status,
    )
    return True
