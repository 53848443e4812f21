"""The registry side of ``kind: local`` after registration: relaunch, delete, start-up.

* Relaunch (``POST /v1/teachers/{alias}/launch``) pins the stored identity:
  the launcher's identity must be the same before vLLM is spawned, and the
  probes are pinned to it; a mismatch leaves the alias ``unavailable`` with
  the ``teacher_identity_mismatch`` code in its status message.
  A replica set (``replicas = N``) must find the ports it registered, and
  every replica is proved again (``teachers.local_replicas``).
* Delete stops the alias's process groups (snapshot and cache removed) before
  the row goes.
* Start-up: every local alias (and each of its replicas) is ``unavailable`` (the registry owns the
  process groups, so none survived its last exit); a placeholder of an
  interrupted registration is deleted; rows without an identity (legacy
  imports) are left alone.

Imports the teachers layer (context, probing, rows, local_registration), the
configuration, database, identity and ``kiln_registry.local``; never the API
layer or FastAPI.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kiln_registry.config.settings import LocalTeacherConfig
from kiln_registry.credentials.origin import parse_teacher_url
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.domain.errors import KilnError
from kiln_registry.domain.vocabulary import TeacherKind, TeacherStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.local import student
from kiln_registry.teachers.context import LocalTeacherManager, TeacherServices
from kiln_registry.teachers.local_registration import local_manager, status_sink
from kiln_registry.teachers.local_replicas import (
    check_relaunch_urls,
    mark_replicas,
    probe_launched,
    replica_urls,
)
from kiln_registry.teachers.probing import Receipt
from kiln_registry.teachers.rows import load_row, require_identity, set_status

log = logging.getLogger("kiln_registry.local")

GONE_MESSAGE = (
    "the local teacher is not running (the registry restarted); "
    "POST /v1/teachers/{alias}/launch relaunches it with the same identity"
)  # a template: format(alias=...)


def _relaunch_target(
    ctx: TeacherServices, row: TeacherRow
) -> tuple[TeacherIdentity, str, LocalTeacherConfig | None]:
    identity = require_identity(row)
    if row.launch_profile is not None:
        return identity, row.launch_profile, None
    # Kiln's shape: the student again (plus its adapter), on the port it was registered on.
    port = parse_teacher_url(row.url or "").port or 0
    profile = student.student_profile(
        ctx.config, row.adapter, port=port, width=ctx.student.model_width
    )
    return identity, student.profile_name(row.alias), profile


def _failure_message(exc: KilnError) -> str:
    return f"relaunch failed ({exc.code}): {exc.message}"


def _mark_verified(
    ctx: TeacherServices, alias: str, receipts: Sequence[Receipt], digest: str
) -> None:
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        repo.update_status(alias, TeacherStatus.verified, None)
        row = repo.get(alias)
        if row is not None:
            mark_replicas(row, digest, None)
        for receipt in receipts:
            receipt.store(session, alias, digest)


async def relaunch_local(ctx: TeacherServices, row: TeacherRow) -> TeacherRow:
    """Launch an unavailable local alias again; it must reproduce its stored identity."""
    manager = local_manager(ctx, profiles=False)
    alias = row.alias
    identity, name, generated = await asyncio.to_thread(_relaunch_target, ctx, row)
    if manager.is_running(alias):
        return row
    manager.check_runtime()
    if generated is None:
        local_manager(ctx).reserve(alias, name)
    else:
        manager.reserve_generated(alias, name, generated)
    sink = status_sink(ctx, alias)
    try:
        urls = replica_urls(manager.profile(name))
        check_relaunch_urls(row, urls)
        await asyncio.to_thread(sink, "launching: relaunch queued")
        handles = await asyncio.to_thread(manager.launch, alias, expected=identity, status=sink)
        served = identity.served_model_id
        _, receipts = await probe_launched(ctx, alias, handles, urls, served, identity)
        await asyncio.to_thread(_mark_verified, ctx, alias, receipts, identity.digest())
    except KilnError as exc:
        await asyncio.to_thread(_undo_relaunch, ctx, manager, alias, _failure_message(exc))
        raise
    except Exception:
        await asyncio.to_thread(_undo_relaunch, ctx, manager, alias, "relaunch failed")
        raise
    return await asyncio.to_thread(load_row, ctx, alias)


def _undo_relaunch(
    ctx: TeacherServices, manager: LocalTeacherManager, alias: str, why: str
) -> None:
    try:
        manager.release(alias)
    finally:
        set_status(ctx, alias, TeacherStatus.unavailable, why)


def stop_local(ctx: TeacherServices, alias: str) -> None:
    """Stop the alias's process group, if this registry runs one (blocking)."""
    if ctx.local_teachers is not None:
        ctx.local_teachers.stop(alias)


def reconcile_at_startup(ctx: TeacherServices) -> list[str]:
    """Mark every local alias unavailable; drop interrupted registrations.  Returns aliases."""
    changed: list[str] = []
    with ctx.writing() as session:
        repo = TeacherRepository(session)
        for row in repo.list_all():
            if row.kind != TeacherKind.local:
                continue
            if row.status == TeacherStatus.launching and row.identity_json is None:
                repo.delete(row.alias)
                log.warning("removed the interrupted registration of local alias %s", row.alias)
            elif row.identity_json is not None and row.status != TeacherStatus.unavailable:
                gone = GONE_MESSAGE.format(alias=row.alias)
                repo.update_status(row.alias, TeacherStatus.unavailable, gone)
                mark_replicas(row, None, gone)
            else:
                continue
            changed.append(row.alias)
    return changed
