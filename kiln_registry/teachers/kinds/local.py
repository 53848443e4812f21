"""Kind ``local``: a teacher this registry launches (the loaded student, or a launch profile).

The behaviour lives in the local modules of the teachers layer, which call into
``kiln_registry.local`` (the launcher's process groups): registration
(``teachers.local_registration``), relaunch, stop and start-up
(``teachers.local_relaunch``), replicas of a profile (``teachers.local_replicas``).
A re-probe proves the stored loopback endpoint(s) like a remote alias's.  Its
entry re-checks the loaded student and, in Kiln's shape, the adapter directory.

Imports the teachers layer only; never the API layer or FastAPI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.vocabulary import TeacherKind
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.verify import StudentView
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.kinds.base import (
    LegacyRules,
    check_endpoint_pinnable,
    endpoint_fields_refused,
)
from kiln_registry.teachers.live_status import ReadChecks, adapter_checks, student_problem
from kiln_registry.teachers.local_registration import register_local
from kiln_registry.teachers.local_relaunch import relaunch_local, stop_local
from kiln_registry.teachers.probing import ProbeOutcome
from kiln_registry.teachers.reprobe import reprobe_endpoints
from kiln_registry.teachers.rows import TeacherRequest


class LocalKind:
    """A teacher launched and supervised by this registry (``kiln serve``)."""

    name: Final = TeacherKind.local.value
    legacy: Final = LegacyRules(
        model_id_optional=True, takes_adapter=True, takes_identity=True,
        adapter_binds_identity=True,
    )  # fmt: skip

    def request_problems(self, data: Mapping[str, Any], given: set[str]) -> list[str]:
        # Kiln (api/teachers.rs): a local teacher's model_id is ignored (the loaded
        # student is the model); the endpoint fields are remote-only.
        return endpoint_fields_refused(self.name, given)

    async def register(self, ctx: TeacherServices, req: TeacherRequest) -> TeacherRow:
        return await register_local(ctx, req)

    async def reprobe(
        self, ctx: TeacherServices, row: TeacherRow, identity: TeacherIdentity
    ) -> ProbeOutcome:
        return await reprobe_endpoints(ctx, row, identity)

    async def relaunch(self, ctx: TeacherServices, row: TeacherRow) -> TeacherRow:
        return await relaunch_local(ctx, row)

    def stop(self, ctx: TeacherServices, alias: str) -> None:
        stop_local(ctx, alias)

    def live_checks(
        self, config: KilnConfig, student: StudentView, row: TeacherRow, identity: TeacherIdentity
    ) -> tuple[str | None, ReadChecks]:
        return student_problem(identity, student), adapter_checks(row)

    def check_pinnable(self, row: TeacherRow, alias: str) -> None:
        check_endpoint_pinnable(row, alias)


KIND: Final = LocalKind()
