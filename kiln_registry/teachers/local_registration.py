"""The registry side of local teachers: register, relaunch, delete and reconcile.

Owns the row life cycle of ``kind: local`` aliases:

* Registration (``POST /v1/teachers``, ``kind: local``): Kiln's shape (no
  ``launch_profile``) serves the loaded student, plus ``adapter`` from its
  adapter directory, through a generated profile (``local.student``);
  ``launch_profile`` names a ``[teachers.local.<profile>]`` instead.  A
  placeholder row (internal status ``launching``, published ``unavailable``)
  claims the alias and shows progress; the manager launches; the probes run
  against ``http://127.0.0.1:<port>/v1``; the probed identity must be the
  launcher's; only then is the verified row (identity, receipt) written in
  one transaction.  Any failure stops the teacher and deletes the
  placeholder: no trace is left.
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

``LocalRegistryContext`` carries the manager; ``close()`` drains it.  Imports
the API context, schemas, the teacher service, the database repository and
``kiln_registry.local``; never FastAPI.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from kiln_registry.api import teachers_service as teachers
from kiln_registry.api.context import RegistryContext
from kiln_registry.api.schemas import RegisterTeacherRequest, TeacherEntry, TeacherKind
from kiln_registry.config.settings import KilnConfig, LocalTeacherConfig
from kiln_registry.credentials.origin import parse_teacher_url
from kiln_registry.credentials.resolve import ResolvedTeacher
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import (
    IdentityMismatch,
    KilnError,
    RegistrationInvalid,
    TeacherNotFound,
)
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.local import student
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


def local_manager(ctx: RegistryContext, *, profiles: bool = True) -> LocalTeachers:
    """The manager; with ``profiles``, one that has a ``[teachers.local.<profile>]``."""
    manager = ctx.local_teachers if isinstance(ctx, LocalRegistryContext) else None
    if manager is None:
        raise RegistrationInvalid(
            "kind 'local' needs a registry that launches teachers (kiln serve)",
            rule="teacher.kind_local",
        )
    if profiles and not manager.profiles:
        raise RegistrationInvalid(
            "launch_profile names a [teachers.local.<profile>] entry in kiln.toml, and this"
            " registry has none",
            rule="teacher.kind_local",
            hint="add a launch profile and restart the registry, or omit launch_profile to"
            " serve the loaded student (optionally with its adapter)",
        )
    return manager


def teacher_url(profile: LocalTeacherConfig) -> str:
    return f"http://{LOOPBACK_HOST}:{profile.port}/v1"


# -- rows ---------------------------------------------------------------------------


def _placeholder(
    req: RegisterTeacherRequest, profile_name: str | None, served: str, url: str
) -> TeacherRow:
    return TeacherRow(
        alias=req.alias,
        kind=TeacherKind.local.value,
        provider=None if profile_name is None else "vllm",
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
        TeacherRepository(session).insert(row, max_teachers=ctx.config.server.max_teachers)


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
        return teachers.entry_of(ctx, row)


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


def _student_profile(ctx: RegistryContext, req: RegisterTeacherRequest) -> LocalTeacherConfig:
    """The generated profile of the student (plus adapter); refusals are 400s."""
    teachers._alias_free(ctx, req.alias)
    port = student.free_loopback_port(ctx.config)
    width = ctx.student.model_width
    return student.student_profile(ctx.config, req.adapter, port=port, width=width)


def _named_profile(
    manager: LocalTeachers, req: RegisterTeacherRequest
) -> tuple[str, LocalTeacherConfig]:
    name = req.launch_profile or ""
    profile = manager.profile(name)
    _check_adapter(req, name, profile)
    return name, profile


def _refuse_profile_in_model_id(manager: LocalTeachers, req: RegisterTeacherRequest) -> None:
    if req.model_id is not None and req.model_id in manager.profiles:
        raise RegistrationInvalid(
            f"model_id {req.model_id[:64]!r} names a launch profile, but kind 'local' ignores"
            " model_id (as Kiln does) and would serve the loaded student instead",
            rule="teacher.local_profile_field",
            hint="pass the profile as launch_profile, or drop model_id to serve the student",
        )


async def _claim(
    ctx: RegistryContext, manager: LocalTeachers, req: RegisterTeacherRequest
) -> tuple[str, LocalTeacherConfig, TeacherRow]:
    """Reserve the launch slot and insert the ``launching`` placeholder (both or neither)."""
    if req.launch_profile is None:
        _refuse_profile_in_model_id(manager, req)
        manager.check_runtime()
        profile = await run_in_threadpool(_student_profile, ctx, req)
        name = student.profile_name(req.alias)
        manager.reserve_generated(req.alias, name, profile)
        placeholder = _placeholder(req, None, served_model_id(name, profile), teacher_url(profile))
        try:
            await run_in_threadpool(_insert, ctx, placeholder)
        except BaseException:
            manager.release(req.alias)
            raise
        return name, profile, placeholder
    name, profile = _named_profile(manager, req)
    manager.check_runtime()
    placeholder = _placeholder(req, name, served_model_id(name, profile), teacher_url(profile))
    await run_in_threadpool(_insert, ctx, placeholder)
    try:
        manager.reserve(req.alias, name)
    except KilnError:
        await run_in_threadpool(_delete_quietly, ctx, req.alias)
        raise
    return name, profile, placeholder


async def register_local(ctx: RegistryContext, req: RegisterTeacherRequest) -> TeacherEntry:
    """Claim the alias, launch, probe, then publish; on failure leave no trace.

    Without ``launch_profile`` (Kiln's shape) the teacher is the loaded student,
    wearing ``adapter`` from the student's adapter directory when one is named.
    """
    manager = local_manager(ctx, profiles=req.launch_profile is not None)
    _, profile, placeholder = await _claim(ctx, manager, req)
    served = placeholder.model_id or ""
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


def _relaunch_target(
    ctx: RegistryContext, alias: str
) -> tuple[TeacherRow, TeacherIdentity, str, LocalTeacherConfig | None]:
    row = teachers._load_row(ctx, alias)
    if row.kind != TeacherKind.local.value:
        raise RegistrationInvalid(
            f"teacher alias {alias!r} is kind {row.kind!r}; only local teachers are launched",
            rule="teacher.launch_not_local",
        )
    identity = teachers.require_identity(row)
    if row.launch_profile is not None:
        return row, identity, row.launch_profile, None
    # Kiln's shape: the student again (plus its adapter), on the port it was registered on.
    port = parse_teacher_url(row.url or "").port or 0
    profile = student.student_profile(
        ctx.config, row.adapter, port=port, width=ctx.student.model_width
    )
    return row, identity, student.profile_name(alias), profile


def _failure_message(exc: KilnError) -> str:
    return f"relaunch failed ({exc.code}): {exc.message}"


def _mark_verified(ctx: RegistryContext, alias: str, report: ProbeReport, digest: str) -> None:
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        repo.update_status(alias, VERIFIED, None)
        repo.add_receipt(alias, "passed", digest, teachers.public_report(ctx, report))


async def relaunch_local(ctx: RegistryContext, alias: str) -> TeacherEntry:
    """Launch an unavailable local alias again; it must reproduce its stored identity."""
    manager = local_manager(ctx, profiles=False)
    row, identity, name, generated = await run_in_threadpool(_relaunch_target, ctx, alias)
    if manager.is_running(alias):
        return teachers.entry_of(ctx, row)
    manager.check_runtime()
    if generated is None:
        local_manager(ctx).reserve(alias, name)
    else:
        manager.reserve_generated(alias, name, generated)
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
