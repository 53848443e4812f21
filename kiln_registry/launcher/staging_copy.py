"""Filling a ``.building-*`` snapshot directory: one file at a time, then the whole tree.

Owns ``populate``: the owner record, every directory (0700 while filling),
every file (``stage_file``: open the source ``O_NOFOLLOW`` and require the
inventoried (dev, ino, size, mtime_ns); create the destination ``O_EXCL``
relative to the building descriptor; reflink or copy; hash source and
destination for the initially observed length, dropping a reflinked source's
cached pages in between; 0400; fsync; recheck the source on its descriptor
and on its path), a re-inventory of the sources, the section 5 manifest written
``O_EXCL`` (0400), and the seal (directories 0500, fsynced, deepest first).

Imports: standard library, ``kiln_registry.identity``, ``kiln_registry.domain.errors``
and the sibling ``roots``/``fsops``/``staging_plan`` modules.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError, LauncherError
from kiln_registry.identity.digests import FileRecord
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.snapshot_manifest import SNAPSHOT_MANIFEST_NAME, build_snapshot_manifest
from kiln_registry.identity.tree import SYMLINK_HINT, TreeFile, inventory_tree
from kiln_registry.launcher import fsops
from kiln_registry.launcher.fsops import DIR_FLAGS
from kiln_registry.launcher.roots import current_owner, write_owner_record
from kiln_registry.launcher.staging_plan import FileJob, StagingLimits, StagingPlan

_SOURCE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FileResult:
    record: FileRecord
    reflinked: bool


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _entry_identity(entry: TreeFile) -> tuple[int, int, int, int]:
    return (entry.dev, entry.ino, entry.size, entry.mtime_ns)


def _open_source(source: str, entry: TreeFile) -> int:
    try:
        fd = os.open(source, _SOURCE_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise IdentityError(
                f"{source} became a symbolic link after the inventory",
                rule="staging.source_symlink",
                hint=SYMLINK_HINT,
            ) from None
        raise IdentityError(
            f"cannot open {source}: {exc.strerror}", rule="staging.source_unreadable"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise IdentityError(
            f"{source} is no longer a regular file (FIFO, socket, device or directory)",
            rule="staging.source_special",
        )
    if _identity(info) != _entry_identity(entry):
        os.close(fd)
        raise IdentityError(
            f"{source} changed between the inventory and the copy", rule="staging.source_changed"
        )
    return fd


def _check_source_after(src_fd: int, source: str, entry: TreeFile) -> None:
    if _identity(os.fstat(src_fd)) != _entry_identity(entry):
        raise IdentityError(
            f"{source} was modified while it was copied", rule="staging.source_changed"
        )
    try:
        on_path = os.stat(source, follow_symlinks=False)
    except OSError:
        on_path = None
    if on_path is None or _identity(on_path) != _entry_identity(entry):
        raise IdentityError(
            f"{source} was replaced while it was copied", rule="staging.source_replaced"
        )


def _fill(src_fd: int, dst_fd: int, job: FileJob, limiter: ReadRateLimiter) -> FileResult:
    size = job.entry.size
    reflinked = fsops.try_reflink(src_fd, dst_fd, shown=job.source)
    if reflinked:
        staged_size = os.fstat(dst_fd).st_size
        if staged_size != size:
            raise IdentityError(
                f"{job.source} is {staged_size} bytes at copy time but the inventory saw {size}",
                rule="staging.source_changed",
            )
        digest = fsops.hash_fd(
            src_fd, size, limiter, shown=job.source, rule_prefix="staging.source"
        )
        # A clone shares the source's blocks but not its cached pages.  The
        # source is not read again (the later passes read the clone), so its
        # pages are dropped before the clone's first read: the clone's pages
        # take their place instead of doubling the model in the page cache.
        fsops.drop_cached(src_fd)
    else:
        digest = fsops.copy_and_hash(src_fd, dst_fd, size, limiter, shown=job.source)
    return FileResult(FileRecord(digest=digest, length=size), reflinked)


def stage_file(job: FileJob, building_fd: int, limiter: ReadRateLimiter) -> FileResult:
    src_fd = _open_source(job.source, job.entry)
    try:
        try:
            dst_fd = os.open(job.logical, _CREATE_FLAGS, 0o600, dir_fd=building_fd)
        except OSError as exc:
            raise fsops.io_error(exc, f"create the staged file {job.logical}") from None
        try:
            result = _fill(src_fd, dst_fd, job, limiter)
            # Hash the destination before fsync: the bytes read are the same (page
            # cache either way) and hashing overlaps the kernel's write-back.
            staged = fsops.hash_fd(
                dst_fd,
                job.entry.size,
                limiter,
                shown=f"staged {job.logical}",
                rule_prefix="staging.staged",
                error=LauncherError,
            )
            os.fchmod(dst_fd, 0o400)
            os.fsync(dst_fd)
        finally:
            os.close(dst_fd)
        _check_source_after(src_fd, job.source, job.entry)
    except OSError as exc:
        raise fsops.io_error(exc, f"stage {job.source}") from None
    finally:
        os.close(src_fd)
    if staged != result.record.digest:
        raise IdentityError(
            f"{job.source} changed while it was copied (staged bytes differ)",
            rule="staging.source_changed",
        )
    return result


def _recheck_sources(plan: StagingPlan, limits: StagingLimits) -> None:
    for prefix, tree in plan.trees:
        if inventory_tree(tree.root, limits=limits.tree_limits()) != tree:
            raise IdentityError(
                f"the {prefix} tree {tree.root} changed while it was staged",
                rule="staging.source_changed",
            )


def _write_new_file(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, _CREATE_FLAGS, 0o400, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, 0o400)
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(building_fd: int, directories: tuple[str, ...]) -> None:
    """Directories 0500 and fsynced, deepest first; then the top directory."""
    for relpath in reversed(directories):
        fd = os.open(relpath, DIR_FLAGS, dir_fd=building_fd)
        try:
            os.fchmod(fd, 0o500)
            os.fsync(fd)
        finally:
            os.close(fd)
    os.fchmod(building_fd, 0o500)
    os.fsync(building_fd)


def _copy_files(
    building_fd: int,
    plan: StagingPlan,
    limiter: ReadRateLimiter,
    workers: int | None,
    progress: fsops.Progress | None,
) -> list[FileResult]:
    report = fsops.reporter(progress, "copy", plan.total_bytes)
    return fsops.run_parallel(
        plan.files,
        lambda job: stage_file(job, building_fd, limiter),
        size=lambda job: job.entry.size,
        workers=workers,
        on_done=lambda job, _: report(job.entry.size),
    )


def populate(
    building_fd: int,
    plan: StagingPlan,
    limiter: ReadRateLimiter,
    workers: int | None,
    progress: fsops.Progress | None,
    limits: StagingLimits,
) -> tuple[bytes, list[FileResult]]:
    """Owner record, directories, files, source recheck, manifest, seal; the manifest."""
    os.fchmod(building_fd, 0o700)
    write_owner_record(building_fd, current_owner())
    for relpath in plan.directories:
        os.mkdir(relpath, 0o700, dir_fd=building_fd)
    results = _copy_files(building_fd, plan, limiter, workers, progress)
    _recheck_sources(plan, limits)
    split = len(plan.model.files)
    manifest = build_snapshot_manifest(
        plan.model,
        [r.record for r in results[:split]],
        plan.adapter,
        [r.record for r in results[split:]],
    )
    _write_new_file(building_fd, SNAPSHOT_MANIFEST_NAME, manifest)
    _seal(building_fd, plan.directories)
    return manifest, results
