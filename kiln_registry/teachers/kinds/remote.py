"""Kind ``remote``: a vLLM endpoint elsewhere, or a replica set of them (``urls``).

Registration resolves every URL by the rules of ``url`` (``[server]
teacher_hosts``, the credential's exact origin), probes it through the one
probing seam and persists the alias only after every endpoint proved one
identity (``teachers.replicas.prove_endpoints``; several URLs make a replica
set, stored as ``teacher_replicas`` rows).  Nothing is written before that.
Its entry re-checks the credential and the loaded student at read time; a job
pins it once verified.  It is never launched or stopped here.

Imports the teachers layer (probing, replicas, re-probe, rows, live status)
and the database row type; never the API layer or FastAPI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.models import TeacherRow
from kiln_registry.domain.errors import RegistrationInvalid
from kiln_registry.domain.vocabulary import KILN_REMOTE_PROVIDERS, TeacherKind, TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.verify import StudentView
from kiln_registry.teachers import replicas
from kiln_registry.teachers.context import TeacherServices
from kiln_registry.teachers.kinds.base import (
    LegacyRules,
    check_endpoint_pinnable,
    launch_profile_refused,
    refuse_relaunch,
)
from kiln_registry.teachers.live_status import ReadChecks, credential_problem, student_problem
from kiln_registry.teachers.probing import ProbeOutcome, registry_setup
from kiln_registry.teachers.reprobe import reprobe_endpoints
from kiln_registry.teachers.rows import TeacherRequest, alias_free, persist_new, verified_fields


def _provider_problems(provider: object) -> list[str]:
    if provider is None:
        return ["provider is required for kind 'remote' (use 'vllm')"]
    if isinstance(provider, str) and provider in KILN_REMOTE_PROVIDERS and provider != "vllm":
        return [
            f"provider {provider!r} is not supported for registration:"
            " only 'vllm' teachers can prove a Kiln identity"
        ]
    return []


class RemoteKind:
    """A teacher endpoint the registry probes but does not run."""

    name: Final = TeacherKind.remote.value
    legacy: Final = LegacyRules(zero_top_k_allowed=True, takes_identity=True, takes_endpoint=True)

    def request_problems(self, data: Mapping[str, Any], given: set[str]) -> list[str]:
        problems = _provider_problems(data.get("provider"))
        if "model_id" not in given:
            problems.append("model_id is required for kind 'remote'")
        if "url" not in given and "urls" not in given:
            problems.append("url (or urls, for a replica set) is required for kind 'remote'")
        if "adapter" in given:
            problems.append("adapter must be null for kind 'remote' (the identity binds it)")
        return problems + launch_profile_refused(given)

    async def register(self, ctx: TeacherServices, req: TeacherRequest) -> TeacherRow:
        """Probe every endpoint, require one identity, persist alias, replicas and receipts."""
        urls = replicas.replica_urls(req.url, req.urls)
        if urls is None and req.url is not None:
            urls = (req.url,)
        if urls is None or req.model_id is None:  # the schema enforces both
            raise RegistrationInvalid("url and model_id are required for kind 'remote'")
        resolved = replicas.resolve_all(ctx, urls, req.credential_id)
        await asyncio.to_thread(alias_free, ctx, req.alias)
        setup = registry_setup(ctx)
        identity, receipts = await replicas.prove_endpoints(setup, resolved, req.model_id, None)
        row = TeacherRow(
            alias=req.alias,
            kind=self.name,
            provider=req.provider,
            url=urls[0],
            credential_id=req.credential_id,
            notes=req.notes,
            adapter=req.adapter,
            status=TeacherStatus.verified.value,
            **verified_fields(identity),
        )
        row.replicas = replicas.replica_rows(req.alias, urls, identity.digest())
        return await asyncio.to_thread(persist_new, ctx, row, receipts)

    async def reprobe(
        self, ctx: TeacherServices, row: TeacherRow, identity: TeacherIdentity
    ) -> ProbeOutcome:
        return await reprobe_endpoints(ctx, row, identity)

    async def relaunch(self, ctx: TeacherServices, row: TeacherRow) -> TeacherRow:
        refuse_relaunch(row)

    def stop(self, ctx: TeacherServices, alias: str) -> None:
        return None  # nothing runs here

    def live_checks(
        self, config: KilnConfig, student: StudentView, row: TeacherRow, identity: TeacherIdentity
    ) -> tuple[str | None, ReadChecks]:
        problem, checks = credential_problem(config, row)
        return problem or student_problem(identity, student), checks

    def check_pinnable(self, row: TeacherRow, alias: str) -> None:
        check_endpoint_pinnable(row, alias)


KIND: Final = RemoteKind()
