"""The registry side of local teachers: register, relaunch, delete and reconcile.

Owns the row life cycle of ``kind: local`` aliases:

* Registration (``POST /v1/teachers`` with ``kind: local``; ``model_id``
  names the ``[teachers.local.<profile>]`` entry) inserts a placeholder row
  with the internal status ``launching`` (published as ``unavailable``, never
  usable, no identity) so the alias is claimed and ``status_message`` shows
  progress; the manager launches; the dual probes run against
  ``http://127.0.0.1:<port>/v1``; the probed identity must be the one the
  launcher computed; only then is the verified row (identity, receipt)
  written, replacing the placeholder in one transaction.  Any failure stops
  the teacher and deletes the placeholder: no trace is left.
* Relaunch (``POST /v1/teachers/{alias}/launch``) pins the stored identity:
  the launcher's identity must equal it before vLLM is spawned, and the
  probes are pinned to it; a mismatch leaves the alias ``unavailable`` with
  the ``teacher_identity_mismatch`` code in its status message.
* Delete stops the alias's process group (snapshot and cache removed) before
  the row goes.
* Start-up: every local alias is ``unavailable`` (the registry owns the
  process groups, so none survived its last exit); a placeholder of an
  interrupted registration is deleted; rows without an identity (legacy
  imports) are left alone.

``LocalRegistryContext`` carries the manager; ``close()`` drains it.
Imports the API context, entries, schemas and the teacher service, the
database repository and ``kiln_registry.local.manager``; never FastAPI.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from kiln_registry.api import teachers_service as teachers
from kiln_registry.api.context import RegistryContext
from kiln_registry.api.entries import entry_from_row
from kiln_registry.api.schemas import RegisterTeacherRequest, TeacherEntry, TeacherKind
from kiln_registry.config import KilnConfig, LocalTeacherConfig
from kiln_registry.credentials.origin import parse_teacher_url
from kiln_registry.credentials.resolve import ResolvedTeacher
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.errors import (
    IdentityMismatch,
    KilnError,
    RegistrationInvalid,
    TeacherNotFound,
)
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.local.manager import (
    LOOPBACK_HOST,
    LocalTeachers,
    Prepare,
    RunningTeacher,
    StatusSink,
    library_prepare,
    served_model_id,
)
from kiln_registry.probe.report import ProbeReport

log = logging.getLogger("kiln_registry.local")

LAUNCHING = "launching"
UNAVAILABLE = "unavailable"
VERIFIED = "verified"
GONE_MESSAGE = (
    "the local teacher is not running (the registry restarted); "
    "POST /v1/teachers/{alias}/launch relaunches it with the same identity"
)  # a template: format(alias=...)


@dataclass
class LocalRegistryContext(RegistryContext):
    """A ``RegistryContext`` that also owns the local-teacher manager."""

    local_teachers: LocalTeachers | None = None

    def close(self) -> None:
        """Drain every local teacher, then release the database handles."""
        try:
            if self.local_teachers is not None:
                self.local_teachers.shutdown()
        finally:
            super().close()


def new_manager(
    config: KilnConfig, environ: Mapping[str, str], prepare: Prepare | None = None
) -> LocalTeachers:
    return LocalTeachers(
        config.teachers.local,
        environ=environ,
        secret_names=config.secret_env_names(),
        launch_deadline_s=config.server.local_launch_deadline_s,
        prepare=prepare or library_prepare,
    )


def local_manager(ctx: RegistryContext) -> LocalTeachers:
    manager = ctx.local_teachers if isinstance(ctx, LocalRegistryContext) else None
    if manager is None or not manager.profiles:
        raise RegistrationInvalid(
            "kind 'local' needs a [teachers.local.<profile>] entry in kiln.toml, and this"
            " registry has none",
            rule="teacher.kind_local",
            hint="add a launch profile and restart the registry, or launch the teacher with"
            " kiln-teacher and register its loopback URL as kind 'remote'",
        )
    return manager


def teacher_url(profile: LocalTeacherConfig) -> str:
    return f"http://{LOOPBACK_HOST}:{profile.port}/v1"


# -- rows ---------------------------------------------------------------------------


def _placeholder(
    req: RegisterTeacherRequest, profile_name: str, served: str, url: str
) -> TeacherRow:
    return TeacherRow(
        alias=req.alias,
        kind=TeacherKind.local.value,
        provider="vllm",
        model_id=served,
        url=url,
        notes=req.notes,
        adapter=req.adapter,
        launch_profile=profile_name,
        status=LAUNCHING,
        status_message="launching: queued",
    )


def _insert(ctx: RegistryContext, row: TeacherRow) -> None:
    with ctx.writing() as session:
        TeacherRepository(session).insert(row)


def _delete_quietly(ctx: RegistryContext, alias: str) -> None:
    with ctx.writing() as session:
        TeacherRepository(session).delete(alias)


def _set_status(ctx: RegistryContext, alias: str, status: str, message: str | None) -> None:
    try:
        with ctx.writing() as session:
            TeacherRepository(session).update_status(alias, status, message)
    except TeacherNotFound:
        pass  # deleted meanwhile: nothing left to describe


def _status_sink(ctx: RegistryContext, alias: str) -> StatusSink:
    def sink(message: str) -> None:
        _set_status(ctx, alias, LAUNCHING, message)

    return sink


def _publish(
    ctx: RegistryContext,
    placeholder: TeacherRow,
    identity: TeacherIdentity,
    receipt: dict[str, Any],
) -> TeacherEntry:
    """Replace the placeholder with the verified row and its receipt (one transaction)."""
    row = TeacherRow(
        alias=placeholder.alias,
        kind=placeholder.kind,
        provider=placeholder.provider,
        model_id=identity.served_model_id,
        url=placeholder.url,
        notes=placeholder.notes,
        adapter=placeholder.adapter,
        launch_profile=placeholder.launch_profile,
        identity_json=identity.canonical_bytes().decode("utf-8"),
        identity_digest=identity.digest(),
        status=VERIFIED,
    )
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        if not repo.delete(row.alias):
            raise TeacherNotFound(f"teacher alias {row.alias!r} was deleted while launching")
        repo.insert(row)
        repo.add_receipt(row.alias, "passed", row.identity_digest, receipt)
        return entry_from_row(row)


# -- registration ---------------------------------------------------------------------


def _check_adapter(req: RegisterTeacherRequest, name: str, profile: LocalTeacherConfig) -> None:
    if req.adapter is None:
        return
    served = served_model_id(name, profile)
    if profile.adapter_path is None:
        raise RegistrationInvalid(
            f"adapter {req.adapter[:64]!r} was given but profile {name!r} has no adapter_path",
            rule="teacher.local_adapter",
        )
    if req.adapter != served:
        raise RegistrationInvalid(
            f"adapter must be the profile's served model id {served!r}: the launcher serves the"
            " static adapter under that name (the base model is never served by name)",
            rule="teacher.local_adapter",
        )


async def _probed_identity(
    ctx: RegistryContext, url: str, model_id: str, pinned: TeacherIdentity | None
) -> tuple[ProbeReport, TeacherIdentity]:
    resolved = ResolvedTeacher(endpoint=parse_teacher_url(url), secret=None)
    report = await teachers._probe(ctx, resolved, model_id, pinned)
    return report, teachers._passed_identity(report)


def _same_identity(alias: str, handle: RunningTeacher, identity: TeacherIdentity) -> None:
    if identity.fingerprint() != handle.fingerprint:
        raise IdentityMismatch(
            f"the teacher answering for {alias!r} is not the one the launcher started",
            rule="local.probe_identity",
            hint="another server may hold the profile's port",
        )


async def register_local(ctx: RegistryContext, req: RegisterTeacherRequest) -> TeacherEntry:
    """Claim the alias, launch, probe, then publish; on failure leave no trace."""
    manager = local_manager(ctx)
    name = req.model_id or ""
    profile = manager.profile(name)
    _check_adapter(req, name, profile)
    served = served_model_id(name, profile)
    placeholder = _placeholder(req, name, served, teacher_url(profile))
    await run_in_threadpool(_insert, ctx, placeholder)
    try:
        manager.reserve(req.alias, name)
    except KilnError:
        await run_in_threadpool(_delete_quietly, ctx, req.alias)
        raise
    try:
        handle = await run_in_threadpool(
            manager.launch,
            req.alias,
            expected_fingerprint=None,
            status=_status_sink(ctx, req.alias),
        )
        await run_in_threadpool(_set_status, ctx, req.alias, LAUNCHING, "launching: probing")
        report, identity = await _probed_identity(ctx, teacher_url(profile), served, None)
        _same_identity(req.alias, handle, identity)
        receipt = teachers.public_report(ctx, report)
        return await run_in_threadpool(_publish, ctx, placeholder, identity, receipt)
    except Exception:
        await run_in_threadpool(_undo_registration, ctx, manager, req.alias)
        raise


def _undo_registration(ctx: RegistryContext, manager: LocalTeachers, alias: str) -> None:
    try:
        manager.release(alias)
    finally:
        _delete_quietly(ctx, alias)


# -- relaunch -------------------------------------------------------------------------


def _relaunch_target(ctx: RegistryContext, alias: str) -> tuple[TeacherRow, TeacherIdentity, str]:
    row = teachers._load_row(ctx, alias)
    if row.kind != TeacherKind.local.value:
        raise RegistrationInvalid(
            f"teacher alias {alias!r} is kind {row.kind!r}; only local teachers are launched",
            rule="teacher.launch_not_local",
        )
    identity = teachers.require_identity(row)
    if row.launch_profile is None:
        raise RegistrationInvalid(
            f"teacher alias {alias!r} has no launch profile", rule="teacher.launch_profile"
        )
    return row, identity, row.launch_profile


def _failure_message(exc: KilnError) -> str:
    return f"relaunch failed ({exc.code}): {exc.message}"


def _mark_verified(ctx: RegistryContext, alias: str, report: ProbeReport, digest: str) -> None:
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        repo.update_status(alias, VERIFIED, None)
        repo.add_receipt(alias, "passed", digest, teachers.public_report(ctx, report))


async def relaunch_local(ctx: RegistryContext, alias: str) -> TeacherEntry:
    """Launch an unavailable local alias again; it must reproduce its stored identity."""
    manager = local_manager(ctx)
    row, identity, name = await run_in_threadpool(_relaunch_target, ctx, alias)
    if manager.is_running(alias):
        return entry_from_row(row)
    manager.reserve(alias, name)
    sink = _status_sink(ctx, alias)
    try:
        await run_in_threadpool(sink, "launching: relaunch queued")
        url = teacher_url(manager.profile(name))
        handle = await run_in_threadpool(
            manager.launch, alias, expected_fingerprint=identity.fingerprint(), status=sink
        )
        report, probed = await _probed_identity(ctx, url, identity.served_model_id, identity)
        _same_identity(alias, handle, probed)
        await run_in_threadpool(_mark_verified, ctx, alias, report, identity.digest())
    except KilnError as exc:
        await run_in_threadpool(_undo_relaunch, ctx, manager, alias, _failure_message(exc))
        raise
    except Exception:
        await run_in_threadpool(_undo_relaunch, ctx, manager, alias, "relaunch failed")
        raise
    return await run_in_threadpool(teachers.get_teacher, ctx, alias)


def _undo_relaunch(ctx: RegistryContext, manager: LocalTeachers, alias: str, why: str) -> None:
    try:
        manager.release(alias)
    finally:
        _set_status(ctx, alias, UNAVAILABLE, why)


# -- delete and start-up ------------------------------------------------------------------


def stop_before_delete(ctx: RegistryContext, alias: str) -> None:
    """Stop the alias's process group, if this registry runs one (blocking)."""
    manager = ctx.local_teachers if isinstance(ctx, LocalRegistryContext) else None
    if manager is not None:
        manager.stop(alias)


def reconcile_at_startup(ctx: RegistryContext) -> list[str]:
    """Mark every local alias unavailable; drop interrupted registrations.  Returns aliases."""
    changed: list[str] = []
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        for row in repo.list_all():
            if row.kind != TeacherKind.local.value:
                continue
            if row.status == LAUNCHING and row.identity_json is None:
                repo.delete(row.alias)
                log.warning("removed the interrupted registration of local alias %s", row.alias)
            elif row.identity_json is not None and row.status != UNAVAILABLE:
                repo.update_status(row.alias, UNAVAILABLE, GONE_MESSAGE.format(alias=row.alias))
            else:
                continue
            changed.append(row.alias)
    return changed
