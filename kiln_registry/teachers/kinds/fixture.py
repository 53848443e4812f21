"""Kind ``fixture``: a named model without an endpoint (Kiln's synthetic teacher).

Registered as ``configured`` without a probe; it has no identity, so it is
never re-probed, launched or pinned by a job here (Kiln's OPD scores a fixture
with a synthetic uniform source; jobs here produce identity-bound corpora
from a teacher endpoint).  Its entry is usable, as in Kiln.

Imports the teachers layer only; never the API layer or FastAPI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.errors import IdentityRequired
from kiln_registry.domain.vocabulary import TeacherKind, TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.verify import StudentView
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.kinds.base import (
    LegacyRules,
    endpoint_fields_refused,
    launch_profile_refused,
    refuse_relaunch,
)
from kiln_registry.teachers.live_status import NO_CHECKS, ReadChecks, student_problem
from kiln_registry.teachers.probing import ProbeOutcome
from kiln_registry.teachers.rows import TeacherRequest, persist_new


class FixtureKind:
    """A teacher that is only a name and a model id."""

    name: Final = TeacherKind.fixture.value
    legacy: Final = LegacyRules(usable_status=TeacherStatus.configured)

    def request_problems(self, data: Mapping[str, Any], given: set[str]) -> list[str]:
        problems = endpoint_fields_refused(self.name, given)
        if "model_id" not in given:
            problems.append("model_id is required for kind 'fixture'")
        if "adapter" in given:
            problems.append("`adapter` is only valid on kind=local teachers")
        return problems + launch_profile_refused(given)

    async def register(self, ctx: TeacherServices, req: TeacherRequest) -> TeacherRow:
        row = TeacherRow(
            alias=req.alias,
            kind=self.name,
            provider=None,
            model_id=req.model_id,
            notes=req.notes,
            status=TeacherStatus.configured.value,
        )
        return await asyncio.to_thread(persist_new, ctx, row, ())

    async def reprobe(
        self, ctx: TeacherServices, row: TeacherRow, identity: TeacherIdentity
    ) -> ProbeOutcome:
        raise IdentityRequired(f"teacher alias {row.alias!r} has no endpoint to probe")

    async def relaunch(self, ctx: TeacherServices, row: TeacherRow) -> TeacherRow:
        refuse_relaunch(row)

    def stop(self, ctx: TeacherServices, alias: str) -> None:
        return None  # nothing runs here

    def live_checks(
        self, config: KilnConfig, student: StudentView, row: TeacherRow, identity: TeacherIdentity
    ) -> tuple[str | None, ReadChecks]:
        return student_problem(identity, student), NO_CHECKS

    def check_pinnable(self, row: TeacherRow, alias: str) -> None:
        # Kiln's OPD scores a fixture with a synthetic uniform source; jobs here produce
        # identity-bound corpora from a teacher endpoint, which a fixture does not have.
        raise IdentityRequired(
            f"teacher alias {alias!r} is a fixture: it has no endpoint and no identity to"
            " score a job with",
            hint="register a remote or local teacher for scoring jobs",
        )


KIND: Final = FixtureKind()
