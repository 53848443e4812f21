"""What a snapshot will hold, and whether its file system can hold it.

Owns ``StagingLimits`` (the seed's aggregate bounds plus capacity headroom),
``plan_staging`` (inventory the model tree and optional adapter tree, then
check the combined entries, bytes, logical path lengths, total path bytes and
an upper bound of the manifest size; ``IdentityError``, like the per-tree
bounds of ``inventory_tree``) and ``check_capacity`` (``LauncherError`` (``statvfs`` of
the open snapshot root: free bytes and inodes for a full copy plus headroom,
before any byte is copied).  Logical paths are the staged ones
(``model/...``, ``adapter/...``), so the path limits apply to what is created.

Imports: standard library, ``kiln_registry.identity`` and
``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError, LauncherError
from kiln_registry.identity.snapshot_manifest import MAX_MANIFEST_BYTES
from kiln_registry.identity.tree import (
    MIB,
    TIB,
    TreeFile,
    TreeInventory,
    TreeLimits,
    inventory_tree,
)

# Bytes of the manifest row of a file beyond its path ({"path":"","bytes":N,"sha256":"<64>"},).
_MANIFEST_FILE_ROW = 112
_MANIFEST_SLACK = 256
_OWNER_RECORD_BYTES = 4096
# The .building directory, the manifest and the owner record.
_FIXED_INODES = 3


@dataclass(frozen=True)
class StagingLimits:
    """Aggregate bounds over the model and adapter trees, and capacity headroom."""

    max_entries: int = 100_000
    max_bytes: int = 16 * TIB
    max_depth: int = 128
    max_path_bytes: int = 4096
    max_total_path_bytes: int = 16 * MIB
    headroom_bytes: int = 64 * MIB
    headroom_inodes: int = 1024

    def tree_limits(self) -> TreeLimits:
        return TreeLimits(
            max_entries=self.max_entries,
            max_bytes=self.max_bytes,
            max_depth=self.max_depth,
            max_path_bytes=self.max_path_bytes,
            max_total_path_bytes=self.max_total_path_bytes,
        )


@dataclass(frozen=True)
class FileJob:
    """One regular file to stage: its staged logical path and its inventoried source."""

    logical: str
    source: str
    entry: TreeFile


@dataclass(frozen=True)
class StagingPlan:
    model: TreeInventory
    adapter: TreeInventory | None
    directories: tuple[str, ...]
    files: tuple[FileJob, ...]
    total_bytes: int
    manifest_bound: int

    @property
    def trees(self) -> tuple[tuple[str, TreeInventory], ...]:
        if self.adapter is None:
            return (("model", self.model),)
        return (("model", self.model), ("adapter", self.adapter))


def _too_many(message: str, rule: str) -> IdentityError:
    return IdentityError(message, rule=rule, hint="stage a smaller model or adapter tree")


def _logical_paths(
    trees: tuple[tuple[str, TreeInventory], ...], limits: StagingLimits
) -> tuple[list[str], list[FileJob], int]:
    directories: list[str] = []
    files: list[FileJob] = []
    path_bytes = 0
    for prefix, tree in trees:
        logical = [prefix, *(f"{prefix}/{d}" for d in tree.directories)]
        jobs = [FileJob(f"{prefix}/{f.relpath}", tree.path_of(f), f) for f in tree.files]
        for path in logical + [job.logical for job in jobs]:
            size = len(path.encode("utf-8"))
            if size > limits.max_path_bytes:
                raise _too_many(
                    f"staged path {path!r} would be {size} bytes, over {limits.max_path_bytes}",
                    "staging.path_too_long",
                )
            path_bytes += size
        directories += logical
        files += jobs
    return directories, files, path_bytes


def _check_aggregate(
    dirs: int, files: list[FileJob], path_bytes: int, limits: StagingLimits
) -> int:
    if dirs + len(files) > limits.max_entries:
        raise _too_many(
            f"model and adapter hold {dirs + len(files)} files and directories together,"
            f" over {limits.max_entries}",
            "staging.too_many_entries",
        )
    total = sum(job.entry.size for job in files)
    if total > limits.max_bytes:
        raise _too_many(
            f"model and adapter hold {total} bytes together, over {limits.max_bytes}",
            "staging.too_many_bytes",
        )
    if path_bytes > limits.max_total_path_bytes:
        raise _too_many(
            f"staged paths total {path_bytes} bytes, over {limits.max_total_path_bytes}",
            "staging.too_many_path_bytes",
        )
    return total


def plan_staging(
    model_dir: str | os.PathLike[str],
    adapter_dir: str | os.PathLike[str] | None,
    limits: StagingLimits,
) -> StagingPlan:
    """Inventory both trees (each bounded by ``limits``) and check the combined bounds."""
    model = inventory_tree(model_dir, limits=limits.tree_limits())
    adapter = (
        None if adapter_dir is None else inventory_tree(adapter_dir, limits=limits.tree_limits())
    )
    trees: tuple[tuple[str, TreeInventory], ...] = (("model", model),)
    if adapter is not None:
        trees += (("adapter", adapter),)
    directories, files, path_bytes = _logical_paths(trees, limits)
    total = _check_aggregate(len(directories), files, path_bytes, limits)
    # JSON escaping at most doubles a path's bytes (control characters are refused).
    bound = 2 * path_bytes + _MANIFEST_FILE_ROW * len(files) + 4 * len(directories)
    bound += _MANIFEST_SLACK
    if bound > MAX_MANIFEST_BYTES:
        raise _too_many(
            f"the snapshot manifest could reach {bound} bytes, over {MAX_MANIFEST_BYTES}",
            "staging.manifest_too_large",
        )
    return StagingPlan(
        model=model,
        adapter=adapter,
        directories=tuple(sorted(directories, key=lambda d: d.encode("utf-8"))),
        files=tuple(files),
        total_bytes=total,
        manifest_bound=bound,
    )


def _blocks(size: int, block: int) -> int:
    return -(-size // block) * block


def check_capacity(root_fd: int, shown: str, plan: StagingPlan, limits: StagingLimits) -> None:
    """Refuse unless the root's file system has room for a full copy plus headroom.

    Reflinks are not counted: the copy fallback must fit.  File systems that
    report no inode total (``f_files == 0``, e.g. btrfs) allocate inodes
    dynamically and skip the inode check.
    """
    vfs = os.statvfs(root_fd)
    block = vfs.f_frsize or vfs.f_bsize or 4096
    data = sum(_blocks(job.entry.size, block) for job in plan.files)
    metadata = (len(plan.directories) + 1) * block + _blocks(plan.manifest_bound, block)
    need = data + metadata + _OWNER_RECORD_BYTES + limits.headroom_bytes
    free = vfs.f_bavail * block
    if need > free:
        raise LauncherError(
            f"snapshot root {shown} has {free} bytes free; staging needs {need}"
            f" (a full copy of {plan.total_bytes} bytes, metadata, and"
            f" {limits.headroom_bytes} bytes of headroom; reflinks are not counted)",
            rule="staging.no_space",
            hint="free space on that file system or choose another --snapshot-root",
        )
    inodes = len(plan.directories) + len(plan.files) + _FIXED_INODES + limits.headroom_inodes
    if vfs.f_files and inodes > vfs.f_favail:
        raise LauncherError(
            f"snapshot root {shown} has {vfs.f_favail} inodes free; staging needs {inodes}"
            f" ({len(plan.files)} files, {len(plan.directories)} directories and"
            f" {limits.headroom_inodes} of headroom)",
            rule="staging.no_inodes",
            hint="free inodes on that file system or choose another --snapshot-root",
        )
