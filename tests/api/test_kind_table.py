"""Teacher kinds are a table (issue 29 item 1): a throw-away kind plugged in from this module.

``PinnedLoopbackKind`` is a kind defined here, not in ``teachers/kinds/``: it
takes a loopback ``url`` and a ``model_id``, proves the endpoint through the
shared probing code (``teachers.replicas``: resolve, both probes, one
identity), stores a verified row, makes its entry depend on an environment
variable (a per-read check) and lets a job pin it.  ``plugged_kind`` puts it
in ``teachers.kinds.KINDS`` for one test; it is then driven through the
service layer (the body rules, ``registration.register_teacher``, the read
side, ``jobs.service.pin_teacher``) against a real reference teacher and a
real registry database.

The database CHECK constraint aside: a new kind needs an Alembic revision
widening ``teachers.kind``, which a test module cannot add, so the plugged
kind takes the ``fixture`` slot of the table (the name its rows are stored
under).  Every answer below differs from the real fixture kind's (which
refuses ``url``, never probes, is ``configured`` and cannot be pinned), so
each step shows the table, not a kind's name, deciding.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
import pytest
from pydantic import ValidationError

from kiln_registry.api import teacher_views
from kiln_registry.api.context import RegistryContext
from kiln_registry.api.schemas import RegisterTeacherRequest
from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.errors import IdentityRequired
from kiln_registry.domain.vocabulary import TeacherKind, TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.core.service import pin_teacher
from kiln_registry.probe.verify import StudentView
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.teachers import registration, replicas
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.kinds import LegacyRules, plugged_kind
from kiln_registry.teachers.kinds.base import check_endpoint_pinnable, refuse_relaunch
from kiln_registry.teachers.live_status import ReadChecks, student_problem
from kiln_registry.teachers.probing import ProbeOutcome, registry_setup
from kiln_registry.teachers.reprobe import reprobe_endpoints
from kiln_registry.teachers.rows import alias_free, load_row, persist_new, verified_fields
from tests.api.support import RegistryServer

GATE_ENV: Final = "KILN_TEST_PLUGGED_KIND_GATE"
SLOT: Final = TeacherKind.fixture.value  # the CHECK constraint allows it (module docstring)


class PinnedLoopbackKind:
    """A throw-away kind: one probed loopback endpoint, usable while ``GATE_ENV`` is set."""

    name: Final = SLOT
    legacy: Final = LegacyRules(takes_identity=True, takes_endpoint=True)

    def request_problems(self, data: Mapping[str, Any], given: set[str]) -> list[str]:
        return [f"{name} is required for the plugged kind" for name in ("url", "model_id")
                if name not in given]  # fmt: skip

    async def register(self, ctx: TeacherServices, req: Any) -> TeacherRow:
        resolved = replicas.resolve_all(ctx, [req.url], None)
        await asyncio.to_thread(alias_free, ctx, req.alias)
        setup = registry_setup(ctx)
        identity, receipts = await replicas.prove_endpoints(setup, resolved, req.model_id, None)
        verified = TeacherStatus.verified.value
        row = TeacherRow(alias=req.alias, kind=self.name, url=req.url, notes=req.notes,
                         status=verified, **verified_fields(identity))  # fmt: skip
        return await asyncio.to_thread(persist_new, ctx, row, receipts)

    async def reprobe(
        self, ctx: TeacherServices, row: TeacherRow, identity: TeacherIdentity
    ) -> ProbeOutcome:
        return await reprobe_endpoints(ctx, row, identity)

    async def relaunch(self, ctx: TeacherServices, row: TeacherRow) -> TeacherRow:
        refuse_relaunch(row)

    def stop(self, ctx: TeacherServices, alias: str) -> None:
        return None

    def live_checks(
        self, config: KilnConfig, student: StudentView, row: TeacherRow, identity: TeacherIdentity
    ) -> tuple[str | None, ReadChecks]:
        return student_problem(identity, student), ReadChecks(
            credential_id="gate", env_name=GATE_ENV
        )

    def check_pinnable(self, row: TeacherRow, alias: str) -> None:
        check_endpoint_pinnable(row, alias)


@dataclass(frozen=True)
class Request:
    """The registration fields (``teachers.rows.TeacherRequest``) the service layer takes."""

    alias: str
    kind: str
    url: str | None = None
    model_id: str | None = None
    provider: str | None = None
    urls: tuple[str, ...] | None = None
    credential_id: str | None = None
    notes: str | None = None
    adapter: str | None = None
    launch_profile: str | None = None


@dataclass
class OwnLoopServices:
    """The registry's services with an HTTP client of the test's own event loop.

    The registry's client belongs to its server thread's loop; the test drives the
    service layer from ``asyncio.run``, so its probes use a client of that loop.
    """

    base: RegistryContext
    http: httpx.AsyncClient

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def client(self) -> httpx.AsyncClient:
        return self.http


def _register(server: RegistryServer, req: Request) -> TeacherRow:
    async def run() -> TeacherRow:
        async with httpx.AsyncClient(trust_env=False) as http:
            services = OwnLoopServices(server.ctx, http)
            return await registration.register_teacher(services, req)  # type: ignore[arg-type]

    return asyncio.run(run())


def test_a_plugged_kind_is_registered_read_and_pinned(
    registry: RegistryServer,
    teacher_url: str,
    reference: tuple[ReferenceTeacher, TeacherIdentity],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = {"alias": "plugged@vllm", "kind": SLOT, "url": teacher_url, "model_id": "teacher-tiny"}
    with plugged_kind(PinnedLoopbackKind()):
        RegisterTeacherRequest.model_validate(body)  # the plugged kind's rules: url taken
        with pytest.raises(ValidationError, match="url is required for the plugged kind"):
            RegisterTeacherRequest.model_validate({**body, "url": None})
        row = _register(registry, Request(**body, notes="plugged"))
        assert row.status == TeacherStatus.verified and row.kind == SLOT
        monkeypatch.setenv(GATE_ENV, "open")
        entry = teacher_views.get_teacher(registry.ctx, "plugged@vllm")
        assert entry.status.value == "verified" and entry.usable
        assert entry.identity_revision == reference[1].revision()
        monkeypatch.delenv(GATE_ENV)  # the kind's per-read check now fails
        closed = teacher_views.get_teacher(registry.ctx, "plugged@vllm")
        assert closed.status.value == "unavailable" and not closed.usable
        assert GATE_ENV in (closed.status_message or "")
        pinned = pin_teacher(load_row(registry.ctx, "plugged@vllm"), "plugged@vllm")
        assert pinned.identity_digest == reference[1].digest()
        assert pinned.url == teacher_url
    # The table is restored: the real fixture kind refuses a job's pin of the same row.
    with pytest.raises(IdentityRequired, match="is a fixture"):
        pin_teacher(load_row(registry.ctx, "plugged@vllm"), "plugged@vllm")
    with pytest.raises(ValidationError, match="only valid on kind=remote"):
        RegisterTeacherRequest.model_validate(body)
