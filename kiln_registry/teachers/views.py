"""The teacher read side: a stored alias, its identity parsed once, and its live checks.

``read_teacher`` is what every read of an entry starts from (``GET
/v1/teachers``, one alias, the cached path, the write operations' answers):
the row's stored identity, read back strictly once (``rows.stored_identity``),
and what the alias's kind checks at read time (``TeacherKindStrategy.
live_checks``, applied only to a verified row with an identity): the problem
fixed while this process runs and the cheap per-read checks
(``teachers.live_status``).  ``published`` derives what an entry publishes,
as Kiln's ``teacher_entry`` (``crates/kiln-server/src/api/teachers.rs``)
does: the public status (an internal ``launching`` row is ``unavailable``; a
``verified`` row without an identity is ``legacy_unverified``; a verified row
with a live problem is ``unavailable`` with that problem as its
``status_message``) and ``usable`` (verified with an identity and no live
problem, or a ``configured`` fixture: Kiln lets a job name a fixture).  The
API renders both as Kiln's ``TeacherEntry`` (``teachers.entries``).

Pure apart from the environment and ``stat`` of the per-read checks; never
opens a session or a socket, never imports the API layer or FastAPI.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.errors import RELEASE_NOTE
from kiln_registry.domain.vocabulary import TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.verify import StudentView
from kiln_registry.teachers.kinds import kind_of
from kiln_registry.teachers.live_status import NO_CHECKS, ReadChecks
from kiln_registry.teachers.rows import stored_identity

LEGACY_MESSAGE = (
    "this alias was migrated from an older registry without a verified identity; delete it"
    " and register it again with a credential_id (or a loopback URL) so both probes can run"
    f" {RELEASE_NOTE}"
)


@dataclass(frozen=True, slots=True)
class Published:
    """What an entry publishes of a read: its public status, usability and message.

    ``verified``: verified with an identity and no live problem (the entry shows
    capabilities); ``usable`` adds a ``configured`` fixture.
    """

    status: TeacherStatus
    verified: bool
    usable: bool
    message: str | None


@dataclass(frozen=True, slots=True)
class TeacherRead:
    """One stored alias as a read sees it (see the module docstring)."""

    row: TeacherRow
    identity: TeacherIdentity | None
    fixed: str | None = None
    checks: ReadChecks = NO_CHECKS

    def problem(self, config: KilnConfig) -> str | None:
        """The live problem now: the fixed one, else the per-read checks' finding."""
        return self.fixed or self.checks.problem(config)


def read_teacher(config: KilnConfig, student: StudentView, row: TeacherRow) -> TeacherRead:
    """``row`` with its identity parsed once and its kind's live checks (nothing written)."""
    identity = stored_identity(row)
    if row.status != TeacherStatus.verified.value or identity is None:
        return TeacherRead(row=row, identity=identity)
    fixed, checks = kind_of(row.kind).live_checks(config, student, row, identity)
    return TeacherRead(row=row, identity=identity, fixed=fixed, checks=checks)


def public_status(
    row: TeacherRow, identity: TeacherIdentity | None, problem: str | None = None
) -> TeacherStatus:
    if row.status == TeacherStatus.launching:
        return TeacherStatus.unavailable
    status = TeacherStatus(row.status)
    if status is TeacherStatus.verified and identity is None:
        return TeacherStatus.legacy_unverified
    if status is TeacherStatus.verified and problem is not None:
        return TeacherStatus.unavailable
    return status


def _status_message(row: TeacherRow, status: TeacherStatus, problem: str | None) -> str | None:
    if row.status_message:
        # Messages stored before issue 15 (some frozen into migrations) say "register it
        # again" without the release step a deleted alias now needs.
        stored = row.status_message
        if "register it again" in stored and "kiln teachers release" not in stored:
            return f"{stored} {RELEASE_NOTE}"
        return stored
    if status is TeacherStatus.legacy_unverified:
        return LEGACY_MESSAGE
    if status is TeacherStatus.unavailable:
        return problem
    return None


def published(read: TeacherRead, problem: str | None) -> Published:
    """The public status, ``usable`` and ``status_message`` of ``read`` given its live problem."""
    status = public_status(read.row, read.identity, problem)
    verified = status is TeacherStatus.verified and read.identity is not None
    return Published(
        status=status,
        verified=verified,
        usable=verified or status is TeacherStatus.configured,
        message=_status_message(read.row, status, problem),
    )
