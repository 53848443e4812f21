"""Immutable snapshot staging and the private runtime cache.

Owns ``stage_snapshot`` (the seed's "How snapshot isolation works" steps 2-5),
``verify_snapshot`` (step 6), ``remove_snapshot`` (step 7) and the private
runtime cache (``create_private_cache`` / ``remove_private_cache``).  Order in
``stage_snapshot``: roots distinct and not nested (checked on paths before
anything is created, so a snapshot root inside a model is never made); the
snapshot root secured and opened; both trees inventoried with aggregate
bounds; free bytes and inodes for a full copy plus headroom checked (even
where reflinks would need less); ``.building-<pid>-<hex>`` made under the open
root descriptor with an owner record; each file copied (reflink or copy),
source and destination hashed for the initially observed length, fsynced
(after the destination hash, which then overlaps write-back), the source's
identity rechecked; the sources re-inventoried; the section 5
manifest written ``O_EXCL``; directories sealed 0500 bottom up (files are
0400 as soon as they are verified); the tree re-enumerated and re-hashed;
renamed to ``ready-<pid>-<hex>``; the root fsynced; verified again.  Any
failure removes the partial child.

Source-tree problems (links, special files, mutation) raise ``IdentityError``;
everything the launcher owns (roots, capacity, I/O, a staged tree that no
longer verifies) raises ``LauncherError``.  The steps live in siblings:
``roots`` (parents, names, owner records), ``staging_plan`` (bounds,
capacity), ``staging_copy`` (filling ``.building-*``), ``staging_verify``
(re-enumeration and re-hash) and ``fsops`` (descriptor-anchored I/O).

Imports: standard library, ``kiln_registry.identity``, ``kiln_registry.domain.errors``
and those sibling modules; never vLLM, torch or Transformers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from kiln_registry.domain.errors import KilnError, LauncherError
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.snapshot_manifest import ManifestFile, snapshot_content_sha256
from kiln_registry.launcher import fsops
from kiln_registry.launcher.fsops import DIR_FLAGS, Progress
from kiln_registry.launcher.roots import (
    PathArg,
    check_distinct_roots,
    current_owner,
    new_child_suffix,
    resolved_root_path,
    secure_private_root,
    write_owner_record,
)
from kiln_registry.launcher.staging_copy import FileResult, populate
from kiln_registry.launcher.staging_plan import (
    StagingLimits,
    StagingPlan,
    check_capacity,
    plan_staging,
)
from kiln_registry.launcher.staging_verify import verify_tree

__all__ = [
    "PrivateCache",
    "Progress",
    "StagedSnapshot",
    "StagingLimits",
    "create_private_cache",
    "remove_private_cache",
    "remove_snapshot",
    "stage_snapshot",
    "verify_snapshot",
]

DEFAULT_LIMITS = StagingLimits()


@dataclass
class StagedSnapshot:
    """A sealed ``ready-*`` snapshot, anchored by the open snapshot-root descriptor."""

    root_fd: int
    name: str
    path: Path
    model_path: Path
    adapter_path: Path | None
    manifest: bytes = field(repr=False)
    snapshot_content_sha256: str
    files: tuple[ManifestFile, ...] = field(repr=False)
    dev: int
    reflinked_files: int
    copied_files: int
    bytes_staged: int


@dataclass
class PrivateCache:
    """A fresh mode-0700 ``cache-<pid>-<hex>`` child, anchored by its parent's descriptor."""

    root_fd: int
    name: str
    path: Path
    dev: int


# --- the public steps ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    root_fd: int
    root: Path
    dev: int
    suffix: str


def _snapshot(target: _Target, manifest: bytes, results: list[FileResult]) -> StagedSnapshot:
    name = f"ready-{target.suffix}"
    document = json.loads(manifest)
    path = target.root / name
    return StagedSnapshot(
        root_fd=target.root_fd,
        name=name,
        path=path,
        model_path=path / "model",
        adapter_path=path / "adapter" if document["has_adapter"] else None,
        manifest=manifest,
        snapshot_content_sha256=snapshot_content_sha256(manifest),
        files=tuple(ManifestFile(f["path"], f["bytes"], f["sha256"]) for f in document["files"]),
        dev=target.dev,
        reflinked_files=sum(1 for r in results if r.reflinked),
        copied_files=sum(1 for r in results if not r.reflinked),
        bytes_staged=sum(r.record.length for r in results),
    )


def _discard(target: _Target, exc: BaseException) -> None:
    for name in (f".building-{target.suffix}", f"ready-{target.suffix}"):
        try:
            fsops.remove_tree_at(
                target.root_fd, name, dev=target.dev, shown=str(target.root / name)
            )
        except KilnError as failed:
            exc.add_note(f"removing the partial snapshot also failed: {failed}")


def _build(
    target: _Target,
    plan: StagingPlan,
    limiter: ReadRateLimiter,
    workers: int | None,
    progress: Progress | None,
    limits: StagingLimits,
) -> StagedSnapshot:
    building = f".building-{target.suffix}"
    has_adapter = plan.adapter is not None
    try:
        os.mkdir(building, 0o700, dir_fd=target.root_fd)
        fd = os.open(building, DIR_FLAGS, dir_fd=target.root_fd)
        try:
            manifest, results = populate(fd, plan, limiter, workers, progress, limits)
        finally:
            os.close(fd)
        verify_tree(
            target.root / building, manifest, has_adapter, limiter, workers, progress, "seal-verify"
        )
        os.rename(
            building, f"ready-{target.suffix}", src_dir_fd=target.root_fd, dst_dir_fd=target.root_fd
        )
        os.fsync(target.root_fd)
        staged = _snapshot(target, manifest, results)
        verify_tree(staged.path, manifest, has_adapter, limiter, workers, progress, "verify")
        return staged
    except OSError as exc:
        error = fsops.io_error(exc, f"stage the snapshot in {target.root}")
        _discard(target, error)
        raise error from None
    except BaseException as exc:
        _discard(target, exc)
        raise


def stage_snapshot(
    model_dir: PathArg,
    adapter_dir: PathArg | None,
    snapshot_root: PathArg,
    *,
    limiter: ReadRateLimiter,
    workers: int | None = None,
    limits: StagingLimits = DEFAULT_LIMITS,
    progress: Progress | None = None,
    cache_root: PathArg | None = None,
) -> StagedSnapshot:
    """Stage the model (and optional adapter) as a sealed, verified ``ready-*`` snapshot.

    ``progress(phase, done_bytes, total_bytes)`` is called on this thread at
    the start of each phase (``copy``, ``seal-verify``, ``verify``) and after
    each file.  ``cache_root``, when given, joins the distinct-roots check.
    The caller owns the result and must call ``remove_snapshot``.
    """
    check_distinct_roots(model_dir, adapter_dir, snapshot_root, cache_root)
    fsops.worker_count(workers, 1)
    root_fd = secure_private_root(snapshot_root, what="snapshot root")
    try:
        root = resolved_root_path(snapshot_root)
        plan = plan_staging(model_dir, adapter_dir, limits)
        check_capacity(root_fd, str(root), plan, limits)
        target = _Target(root_fd, root, os.fstat(root_fd).st_dev, new_child_suffix())
        return _build(target, plan, limiter, workers, progress, limits)
    except BaseException:
        os.close(root_fd)
        raise


def verify_snapshot(
    staged: StagedSnapshot,
    *,
    limiter: ReadRateLimiter,
    workers: int | None = None,
    progress: Progress | None = None,
) -> None:
    """Re-enumerate and re-hash the staged tree against its manifest (before spawn)."""
    if staged.root_fd < 0:
        raise LauncherError(f"snapshot {staged.path} was already removed", rule="staging.removed")
    try:
        anchored = os.stat(staged.name, dir_fd=staged.root_fd, follow_symlinks=False)
        by_path = os.lstat(staged.path)
    except OSError as exc:
        raise LauncherError(
            f"staged snapshot {staged.path} cannot be found: {exc.strerror}",
            rule="staging.verify_failed",
        ) from None
    if (anchored.st_dev, anchored.st_ino) != (by_path.st_dev, by_path.st_ino):
        raise LauncherError(
            f"{staged.path} no longer names the staged snapshot", rule="staging.verify_failed"
        )
    has_adapter = staged.adapter_path is not None
    verify_tree(staged.path, staged.manifest, has_adapter, limiter, workers, progress, "verify")


def remove_snapshot(staged: StagedSnapshot) -> None:
    """Remove the snapshot through the anchored root descriptor, then close it (idempotent)."""
    _remove_anchored(staged)


def create_private_cache(cache_root: PathArg) -> PrivateCache:
    """A fresh, empty-but-for-its-owner-record mode-0700 ``cache-<pid>-<hex>`` child."""
    root_fd = secure_private_root(cache_root, what="cache root")
    name = f"cache-{new_child_suffix()}"
    path = resolved_root_path(cache_root) / name
    try:
        dev = os.fstat(root_fd).st_dev
        os.mkdir(name, 0o700, dir_fd=root_fd)
        fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
        try:
            os.fchmod(fd, 0o700)
            write_owner_record(fd, current_owner())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.fsync(root_fd)
    except BaseException as exc:
        error = fsops.io_error(exc, f"create {path}") if isinstance(exc, OSError) else exc
        try:
            fsops.remove_tree_at(root_fd, name, dev=os.fstat(root_fd).st_dev, shown=str(path))
        finally:
            os.close(root_fd)
        raise error from None
    return PrivateCache(root_fd=root_fd, name=name, path=path, dev=dev)


def remove_private_cache(cache: PrivateCache) -> None:
    """Remove the cache child through its anchored parent, then close it (idempotent)."""
    _remove_anchored(cache)


def _remove_anchored(child: StagedSnapshot | PrivateCache) -> None:
    """Remove ``child.name`` under ``child.root_fd``, then close and forget that descriptor."""
    if child.root_fd < 0:
        return
    try:
        fsops.remove_tree_at(child.root_fd, child.name, dev=child.dev, shown=str(child.path))
    finally:
        os.close(child.root_fd)
        child.root_fd = -1
