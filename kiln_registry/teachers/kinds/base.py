"""What a teacher kind is: the ``TeacherKindStrategy`` protocol and the rules kinds share.

A kind answers every question the registry asks about how a teacher is
served: which registration fields it takes (``request_problems``, the body's
cross-field rules), how it is registered, re-probed, relaunched and stopped,
which live checks its entry gets at read time (``live_checks``), whether a
job may pin it (``check_pinnable``) and how Kiln's ``teachers.json`` treats
it (``legacy``, data for ``legacy.entries``).  ``teachers.kinds`` holds the
table; nothing else branches on a kind's name.

Replica sets are not a kind: a remote or local alias with several endpoints
has ``teacher_replicas`` rows, and the shared probing and re-probing code
(``teachers.replicas``, ``teachers.reprobe``) handles one endpoint or many.

Imports the teachers layer's protocols and rows, the database row type and
the domain; never the API layer or FastAPI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.errors import IdentityRequired, RegistrationInvalid
from kiln_registry.domain.vocabulary import TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.verify import StudentView
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.live_status import ReadChecks
from kiln_registry.teachers.probing import ProbeOutcome
from kiln_registry.teachers.rows import TeacherRequest

# The fields only a remote teacher takes (Kiln: api/teachers.rs).
ENDPOINT_FIELDS = ("provider", "url", "urls", "credential_id")


@dataclass(frozen=True, slots=True)
class LegacyRules:
    """How Kiln's ``validate_teacher_spec_static`` and ``teacher_entry`` treat the kind.

    ``model_id_optional``: an empty ``model_id`` is allowed (local: the student is the
    model).  ``zero_top_k_allowed``: ``max_top_k: 0`` is not refused (remote).
    ``takes_adapter`` / ``takes_identity`` / ``takes_endpoint``: the entry may carry
    ``adapter`` / ``identity`` / ``provider``, ``url`` and ``credential_id``; an entry of a
    kind that takes an identity but has none is ``legacy_unverified``.
    ``adapter_binds_identity``: the identity check compares the adapter (local) instead
    of the endpoint's bounds.  ``usable_status``: what a usable entry is stored as.
    """

    model_id_optional: bool = False
    zero_top_k_allowed: bool = False
    takes_adapter: bool = False
    takes_identity: bool = False
    takes_endpoint: bool = False
    adapter_binds_identity: bool = False
    usable_status: TeacherStatus = TeacherStatus.verified


class TeacherKindStrategy(Protocol):
    """One way of serving a teacher (``remote``, ``local``, ``fixture``)."""

    @property
    def name(self) -> str: ...

    @property
    def legacy(self) -> LegacyRules: ...

    def request_problems(self, data: Mapping[str, Any], given: set[str]) -> list[str]:
        """The registration body's cross-field problems for this kind (raw body)."""
        ...

    async def register(self, ctx: TeacherServices, req: TeacherRequest) -> TeacherRow:
        """Prove and persist a new alias (nothing is left behind on failure)."""
        ...

    async def reprobe(
        self, ctx: TeacherServices, row: TeacherRow, identity: TeacherIdentity
    ) -> ProbeOutcome:
        """Re-run the probes pinned to ``identity``; record the outcome on the alias."""
        ...

    async def relaunch(self, ctx: TeacherServices, row: TeacherRow) -> TeacherRow:
        """Start the alias's teacher again under its stored identity."""
        ...

    def stop(self, ctx: TeacherServices, alias: str) -> None:
        """Stop whatever this registry runs for the alias (before it is deleted; blocking)."""
        ...

    def live_checks(
        self, config: KilnConfig, student: StudentView, row: TeacherRow, identity: TeacherIdentity
    ) -> tuple[str | None, ReadChecks]:
        """``(fixed problem or None, per-read checks)`` of a verified row with an identity."""
        ...

    def check_pinnable(self, row: TeacherRow, alias: str) -> None:
        """Refuse a job's pin of ``row`` with the error Kiln clients expect, or return."""
        ...


# -- rules shared by kinds ------------------------------------------------------------


def endpoint_fields_refused(kind: str, given: set[str]) -> list[str]:
    """Kiln: provider, url and credential_id (and urls) are remote-only."""
    return [
        "`provider`, `url`, and `credential_id` are only valid on kind=remote"
        f" teachers ({name} was given for kind '{kind}')"
        for name in ENDPOINT_FIELDS
        if name in given
    ]


def launch_profile_refused(given: set[str]) -> list[str]:
    if "launch_profile" in given:
        return ["launch_profile is only valid on kind=local teachers"]
    return []


def refuse_relaunch(row: TeacherRow) -> NoReturn:
    """Only a kind that launches its teacher here can be relaunched."""
    raise RegistrationInvalid(
        f"teacher alias {row.alias!r} is kind {row.kind!r}; only local teachers are launched",
        rule="teacher.launch_not_local",
    )


def check_endpoint_pinnable(row: TeacherRow, alias: str) -> None:
    """A verified alias with an identity, a URL and a model id can be pinned by a job."""
    usable = (
        row.status == TeacherStatus.verified
        and row.identity_json is not None
        and row.identity_digest is not None
        and row.url is not None
        and row.model_id is not None
    )
    if not usable:
        # An unavailable alias says why (a failed re-probe or job probe names what to do).
        why = f"{row.status}: {row.status_message}" if row.status_message else row.status
        raise IdentityRequired(
            f"teacher alias {alias!r} has no verified, usable identity (status {why})",
            hint=IdentityRequired.default_hint,
        )
