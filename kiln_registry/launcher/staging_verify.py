"""Verification of a staged snapshot against its manifest.

Owns ``verify_tree``: the top level holds exactly ``model``, the optional
``adapter``, ``snapshot-manifest.json`` and the owner record; the manifest
file holds exactly the staged manifest bytes; every directory is 0500 and
every file 0400 with one link, all owned by the launcher's UID; and a fresh
bounded inventory plus a parallel re-hash of every file (through the shared
``ReadRateLimiter``) rebuilds the same manifest bytes.

Imports: standard library, ``kiln_registry.identity``, ``kiln_registry.domain.errors``
and the sibling ``roots``/``fsops``/``staging_plan`` modules.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kiln_registry.domain.errors import IdentityError, LauncherError
from kiln_registry.identity.hashing import ReadRateLimiter, hash_file
from kiln_registry.identity.snapshot_manifest import SNAPSHOT_MANIFEST_NAME, build_snapshot_manifest
from kiln_registry.identity.tree import TreeInventory, inventory_tree
from kiln_registry.launcher import fsops
from kiln_registry.launcher.roots import OWNER_NAME
from kiln_registry.launcher.staging_plan import StagingLimits

_SOURCE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _check_mode(shown: str, info: os.stat_result, kind: int, mode: int) -> None:
    if stat.S_IFMT(info.st_mode) != kind or stat.S_IMODE(info.st_mode) != mode:
        raise LauncherError(
            f"staged {shown} is not a {'directory' if kind == stat.S_IFDIR else 'file'}"
            f" of mode {mode:04o} (found mode {info.st_mode:o})",
            rule="staging.verify_mode",
        )
    if info.st_uid != os.geteuid() or (kind == stat.S_IFREG and info.st_nlink != 1):
        raise LauncherError(
            f"staged {shown} has another owner or a second link", rule="staging.verify_mode"
        )


def _check_top_level(path: Path, manifest: bytes, has_adapter: bool) -> None:
    expected = {
        "model": stat.S_IFDIR,
        SNAPSHOT_MANIFEST_NAME: stat.S_IFREG,
        OWNER_NAME: stat.S_IFREG,
    }
    if has_adapter:
        expected["adapter"] = stat.S_IFDIR
    _check_mode(str(path), os.lstat(path), stat.S_IFDIR, 0o500)
    with os.scandir(path) as entries:
        for count, entry in enumerate(entries):
            if count >= len(expected) or entry.name not in expected:
                raise LauncherError(
                    f"staged snapshot {path} holds an unexpected entry {entry.name!r}",
                    rule="staging.verify_extra",
                )
    for name, kind in expected.items():
        _check_mode(
            f"{path}/{name}", os.lstat(path / name), kind, 0o500 if kind == stat.S_IFDIR else 0o400
        )
    fd = os.open(path / SNAPSHOT_MANIFEST_NAME, _SOURCE_FLAGS)
    try:
        found = os.read(fd, len(manifest) + 1)
    finally:
        os.close(fd)
    if found != manifest:
        raise LauncherError(
            f"{path}/{SNAPSHOT_MANIFEST_NAME} no longer holds the staged manifest",
            rule="staging.verify_manifest",
        )


def _check_tree_modes(tree: TreeInventory) -> None:
    for relpath in tree.directories:
        shown = os.path.join(tree.root, relpath)
        _check_mode(shown, os.lstat(shown), stat.S_IFDIR, 0o500)
    for entry in tree.files:
        shown = tree.path_of(entry)
        _check_mode(shown, os.lstat(shown), stat.S_IFREG, 0o400)


def verify_tree(
    path: Path,
    manifest: bytes,
    has_adapter: bool,
    limiter: ReadRateLimiter,
    workers: int | None,
    progress: fsops.Progress | None,
    phase: str,
) -> None:
    """Re-enumerate and re-hash a staged tree; it must reproduce ``manifest`` exactly."""
    limits = StagingLimits().tree_limits()
    try:
        _check_top_level(path, manifest, has_adapter)
        trees = [inventory_tree(path / "model", limits=limits)]
        if has_adapter:
            trees.append(inventory_tree(path / "adapter", limits=limits))
        for tree in trees:
            _check_tree_modes(tree)
        jobs = [(tree.path_of(f), f.size) for tree in trees for f in tree.files]
        report = fsops.reporter(progress, phase, sum(size for _, size in jobs))
        records = fsops.run_parallel(
            jobs,
            lambda job: hash_file(job[0], limiter=limiter, expected_length=job[1]),
            size=lambda job: job[1],
            workers=workers,
            on_done=lambda job, _: report(job[1]),
        )
    except (IdentityError, OSError) as exc:
        raise LauncherError(
            f"staged snapshot {path} failed verification: {exc}", rule="staging.verify_failed"
        ) from None
    split = len(trees[0].files)
    rebuilt = build_snapshot_manifest(
        trees[0], records[:split], trees[1] if has_adapter else None, records[split:]
    )
    if rebuilt != manifest:
        raise LauncherError(
            f"staged snapshot {path} no longer matches its manifest",
            rule="staging.verify_mismatch",
        )
