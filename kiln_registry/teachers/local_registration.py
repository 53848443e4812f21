"""The registry side of ``kind: local`` registration, and what relaunch shares with it.

Registration (``POST /v1/teachers``, ``kind: local``): Kiln's shape (no
``launch_profile``) serves the loaded student, plus ``adapter`` from its
adapter directory, through a generated profile (``local.student``);
``launch_profile`` names a ``[teachers.local.<profile>]`` instead.  A
placeholder row (internal status ``launching``, published ``unavailable``)
claims the alias and shows progress; the manager launches; the probes run
(``teachers.probing``) against ``http://127.0.0.1:<port>/v1`` of every replica
(``teachers.local_replicas``); the probed identity must be the launcher's
(``same_identity``); only then is the verified row (identity, replica rows,
receipts) written in one transaction.  Any failure
stops the teacher and deletes the placeholder: no trace is left.

The manager is the context's ``local_teachers`` slot (``teachers.context.
LocalTeacherManager``).  Relaunch, delete and start-up are
``teachers.local_relaunch``.  Imports the teachers layer (context, probing,
rows), the configuration, database, identity and ``kiln_registry.local``;
never the API layer or FastAPI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from kiln_registry.config.settings import LocalTeacherConfig
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import KilnError, RegistrationInvalid, TeacherNotFound
from kiln_registry.domain.text import quoted
from kiln_registry.domain.vocabulary import TeacherKind, TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.local import student
from kiln_registry.local.launch_spec import LOOPBACK_HOST, served_model_id
from kiln_registry.teachers.context import LocalTeacherManager, TeacherServices
from kiln_registry.teachers.local_replicas import probe_launched, replica_urls
from kiln_registry.teachers.probing import Receipt
from kiln_registry.teachers.replicas import replica_rows
from kiln_registry.teachers.rows import (
    TeacherRequest,
    alias_free,
    delete_quietly,
    insert_row,
    set_status,
    verified_fields,
)


def local_manager(ctx: TeacherServices, *, profiles: bool = True) -> LocalTeacherManager:
    """The manager; with ``profiles``, one that has a ``[teachers.local.<profile>]``."""
    manager = ctx.local_teachers
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
    """The alias's ``url``: its (first) replica's."""
    return f"http://{LOOPBACK_HOST}:{profile.first_port}/v1"


def status_sink(ctx: TeacherServices, alias: str) -> Callable[[str], None]:
    """Progress messages shown as the ``launching`` row's status message."""

    def sink(message: str) -> None:
        set_status(ctx, alias, TeacherStatus.launching, message)

    return sink


# -- rows ---------------------------------------------------------------------------


def _placeholder(
    req: TeacherRequest, profile_name: str | None, served: str, url: str
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
        status=TeacherStatus.launching.value,
        status_message="launching: queued",
    )


def _publish(
    ctx: TeacherServices,
    placeholder: TeacherRow,
    identity: TeacherIdentity,
    receipts: Sequence[Receipt],
    urls: Sequence[str],
) -> TeacherRow:
    """Replace the placeholder with the verified row, its replicas and receipts (one
    transaction)."""
    row = TeacherRow(
        alias=placeholder.alias,
        kind=placeholder.kind,
        provider=placeholder.provider,
        url=placeholder.url,
        notes=placeholder.notes,
        adapter=placeholder.adapter,
        launch_profile=placeholder.launch_profile,
        status=TeacherStatus.verified.value,
        **verified_fields(identity),
    )
    row.replicas = replica_rows(row.alias, urls, identity.digest())
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        if not repo.delete(row.alias):
            raise TeacherNotFound(f"teacher alias {row.alias!r} was deleted while launching")
        repo.insert(row)
        for receipt in receipts:
            receipt.store(session, row.alias, row.identity_digest)
        return row


# -- registration ---------------------------------------------------------------------


def _check_adapter(req: TeacherRequest, name: str, profile: LocalTeacherConfig) -> None:
    if req.adapter is None:
        return
    served = served_model_id(name, profile)
    if profile.adapter_path is None:
        raise RegistrationInvalid(
            f"adapter {quoted(req.adapter, 64)} was given but profile {name!r} has no adapter_path",
            rule="teacher.local_adapter",
        )
    if req.adapter != served:
        raise RegistrationInvalid(
            f"adapter must be the profile's served model id {served!r}: the launcher serves the"
            " static adapter under that name (the base model is never served by name)",
            rule="teacher.local_adapter",
        )


def _student_profile(ctx: TeacherServices, req: TeacherRequest) -> LocalTeacherConfig:
    """The generated profile of the student (plus adapter); refusals are 400s."""
    alias_free(ctx, req.alias)
    port = student.free_loopback_port(ctx.config)
    width = ctx.student.model_width
    return student.student_profile(ctx.config, req.adapter, port=port, width=width)


def _named_profile(
    manager: LocalTeacherManager, req: TeacherRequest
) -> tuple[str, LocalTeacherConfig]:
    name = req.launch_profile or ""
    profile = manager.profile(name)
    _check_adapter(req, name, profile)
    return name, profile


def _refuse_profile_in_model_id(manager: LocalTeacherManager, req: TeacherRequest) -> None:
    if req.model_id is not None and req.model_id in manager.profiles:
        raise RegistrationInvalid(
            f"model_id {quoted(req.model_id, 64)} names a launch profile, but kind 'local' ignores"
            " model_id (as Kiln does) and would serve the loaded student instead",
            rule="teacher.local_profile_field",
            hint="pass the profile as launch_profile, or drop model_id to serve the student",
        )


async def _claim_student(
    ctx: TeacherServices, manager: LocalTeacherManager, req: TeacherRequest
) -> tuple[LocalTeacherConfig, TeacherRow]:
    """Kiln's shape: a generated profile of the student, reserved with its placeholder."""
    _refuse_profile_in_model_id(manager, req)
    manager.check_runtime()
    profile = await asyncio.to_thread(_student_profile, ctx, req)
    name = student.profile_name(req.alias)
    manager.reserve_generated(req.alias, name, profile)
    placeholder = _placeholder(req, None, served_model_id(name, profile), teacher_url(profile))
    try:
        await asyncio.to_thread(insert_row, ctx, placeholder)
    except BaseException:
        manager.release(req.alias)
        raise
    return profile, placeholder


async def _claim(
    ctx: TeacherServices, manager: LocalTeacherManager, req: TeacherRequest
) -> tuple[LocalTeacherConfig, TeacherRow]:
    """Reserve the launch slot and insert the ``launching`` placeholder (both or neither)."""
    if req.launch_profile is None:
        return await _claim_student(ctx, manager, req)
    name, profile = _named_profile(manager, req)
    manager.check_runtime()
    placeholder = _placeholder(req, name, served_model_id(name, profile), teacher_url(profile))
    await asyncio.to_thread(insert_row, ctx, placeholder)
    try:
        manager.reserve(req.alias, name)
    except KilnError:
        await asyncio.to_thread(delete_quietly, ctx, req.alias)
        raise
    return profile, placeholder


async def register_local(ctx: TeacherServices, req: TeacherRequest) -> TeacherRow:
    """Claim the alias, launch, probe, then publish; on failure leave no trace.

    Without ``launch_profile`` (Kiln's shape) the teacher is the loaded student,
    wearing ``adapter`` from the student's adapter directory when one is named.
    """
    manager = local_manager(ctx, profiles=req.launch_profile is not None)
    profile, placeholder = await _claim(ctx, manager, req)
    served = placeholder.model_id or ""
    alias = req.alias
    try:
        handles = await asyncio.to_thread(
            manager.launch, alias, expected=None, status=status_sink(ctx, alias)
        )
        await asyncio.to_thread(
            set_status, ctx, alias, TeacherStatus.launching, "launching: probing"
        )
        urls = replica_urls(profile)
        identity, receipts = await probe_launched(ctx, alias, handles, urls, served, None)
        return await asyncio.to_thread(_publish, ctx, placeholder, identity, receipts, urls)
    except Exception:
        await asyncio.to_thread(_undo_registration, ctx, manager, alias)
        raise


def _undo_registration(ctx: TeacherServices, manager: LocalTeacherManager, alias: str) -> None:
    try:
        manager.release(alias)
    finally:
        delete_quietly(ctx, alias)
