"""Finding and removing stale launcher children (``kiln-teacher cleanup``).

Owns ``find_stale_children`` / ``scan_children``, ``remove_stale`` and
``cleanup_main`` (the subcommand's own flags and output).  Only direct
children of the two private parents are ever considered, and only names that
match the launcher's patterns (``.building-<pid>-<hex>`` and ``ready-<pid>-<hex>``
under the snapshot root, ``cache-<pid>-<hex>`` under the cache root).  Both
parents must pass the same checks as at launch (owned by this UID, mode 0700,
safe ancestry) and are never created here.

A child is stale when its owner is gone, decided by the owner record written
inside it at creation (``roots.OwnerRecord``): another boot, no process with
that PID, or a process with that PID that started at a different time (PID
reuse).  A child without a readable record is stale only if no process has
the PID in its name (it may be a launch between ``mkdir`` and the record
write).  A child that is not a directory, is owned by another UID, is a
mount point, or whose record names another PID is reported and left alone.
Removal goes through the parent's open descriptor, rechecks staleness first,
never follows links and never crosses into another file system.

Imports: standard library, ``kiln_registry.domain.errors`` and the sibling
``roots``/``fsops``/``policy`` modules.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kiln_registry.domain.errors import InputError, KilnError, LauncherError
from kiln_registry.launcher import fsops
from kiln_registry.launcher.fsops import DIR_FLAGS
from kiln_registry.launcher.policy import (
    DEFAULT_CACHE_SUBDIR,
    DEFAULT_SNAPSHOT_SUBDIR,
    SNAPSHOT_ROOT_ENV,
)
from kiln_registry.launcher.roots import (
    CHILD_NAME,
    PathArg,
    owner_alive,
    pid_alive,
    process_start_ticks,
    read_owner_record,
    resolved_root_path,
    secure_private_root,
)

MAX_SCANNED_ENTRIES = 100_000
_SNAPSHOT_KINDS = frozenset({".building", "ready"})
_CACHE_KINDS = frozenset({"cache"})
USAGE = """\
usage: kiln-teacher cleanup [--snapshot-root=DIR] [--cache-root=DIR] [--dry-run] [--json]

Removes .building-*, ready-* and cache-* children whose launcher is gone.
Only the parents given are cleaned; with neither flag, both defaults:
$KILN_VLLM_SNAPSHOT_ROOT or ~/.cache/kiln/teacher-snapshots, and
~/.cache/kiln/vllm-runtime-caches.  Nothing else is ever touched.
"""


@dataclass(frozen=True)
class StaleChild:
    parent: Path
    name: str
    kind: str
    pid: int
    reason: str

    @property
    def path(self) -> Path:
        return self.parent / self.name


@dataclass(frozen=True)
class SkippedChild:
    path: Path
    reason: str


@dataclass
class ChildScan:
    stale: list[StaleChild] = field(default_factory=list)
    live: list[Path] = field(default_factory=list)
    skipped: list[SkippedChild] = field(default_factory=list)


@dataclass(frozen=True)
class RemovalResult:
    removed: tuple[Path, ...]
    failed: tuple[SkippedChild, ...]


def _owner_verdict(child_fd: int, pid: int) -> tuple[str, str]:
    """("stale" | "live" | "skip", reason) for one child directory."""
    record = read_owner_record(child_fd)
    if record is None:
        if pid_alive(pid):
            return "live", f"no owner record, and PID {pid} is running"
        return "stale", f"no owner record, and PID {pid} is gone"
    if record.pid != pid:
        return "skip", f"its owner record names PID {record.pid}, not {pid}; left alone"
    if owner_alive(record):
        return "live", f"owner PID {pid} is running"
    if process_start_ticks(pid) is None:
        return "stale", f"owner PID {pid} is gone"
    return "stale", f"PID {pid} now belongs to another process (or an earlier boot)"


def _classify(root_fd: int, dev: int, name: str, pid: int) -> tuple[str, str]:
    try:
        info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            return "skip", "not a directory; left alone"
        if info.st_dev != dev:
            return "skip", "a mount point; left alone"
        if info.st_uid != os.geteuid():
            return "skip", f"owned by UID {info.st_uid}; left alone"
        child_fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
    except FileNotFoundError:
        return "gone", "already removed"
    except OSError as exc:
        return "skip", f"cannot be inspected ({exc.strerror}); left alone"
    try:
        return _owner_verdict(child_fd, pid)
    finally:
        os.close(child_fd)


def _scan_root(root: PathArg, kinds: frozenset[str], what: str, scan: ChildScan) -> None:
    if not os.path.lexists(root):
        return
    parent = resolved_root_path(root)
    root_fd = secure_private_root(root, what=what, create=False)
    try:
        dev = os.fstat(root_fd).st_dev
        with os.scandir(root_fd) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_SCANNED_ENTRIES:
                    raise LauncherError(
                        f"{what} {parent} holds more than {MAX_SCANNED_ENTRIES} entries",
                        rule="cleanup.too_many_entries",
                    )
                match = CHILD_NAME.fullmatch(entry.name)
                if match is None or match[1] not in kinds:
                    continue
                verdict, reason = _classify(root_fd, dev, entry.name, int(match[2]))
                if verdict == "stale":
                    kind = match[1].lstrip(".")
                    scan.stale.append(StaleChild(parent, entry.name, kind, int(match[2]), reason))
                elif verdict == "live":
                    scan.live.append(parent / entry.name)
                elif verdict == "skip":
                    scan.skipped.append(SkippedChild(parent / entry.name, reason))
    finally:
        os.close(root_fd)


def scan_children(snapshot_root: PathArg | None, cache_root: PathArg | None) -> ChildScan:
    """Classify every launcher-named child of the two parents (missing parents are empty)."""
    scan = ChildScan()
    if snapshot_root is not None:
        _scan_root(snapshot_root, _SNAPSHOT_KINDS, "snapshot root", scan)
    if cache_root is not None:
        _scan_root(cache_root, _CACHE_KINDS, "cache root", scan)
    for items in (scan.stale, scan.skipped):
        items.sort(key=lambda item: str(item.path))
    scan.live.sort()
    return scan


def find_stale_children(
    snapshot_root: PathArg | None, cache_root: PathArg | None
) -> list[StaleChild]:
    """The stale ``.building-*``/``ready-*``/``cache-*`` children of the two parents."""
    return scan_children(snapshot_root, cache_root).stale


def _remove_one(root_fd: int, dev: int, child: StaleChild) -> bool:
    verdict, reason = _classify(root_fd, dev, child.name, child.pid)
    if verdict == "gone":
        return False
    if verdict != "stale":
        raise LauncherError(f"{child.path} is no longer stale: {reason}", rule="cleanup.not_stale")
    return fsops.remove_tree_at(root_fd, child.name, dev=dev, shown=str(child.path))


def remove_stale(children: Iterable[StaleChild]) -> RemovalResult:
    """Remove each child after rechecking that it is still stale; report every failure."""
    removed: list[Path] = []
    failed: list[SkippedChild] = []
    by_parent: dict[Path, list[StaleChild]] = {}
    for child in children:
        match = CHILD_NAME.fullmatch(child.name)
        if match is None or int(match[2]) != child.pid:
            raise LauncherError(f"{child.name!r} is not a launcher child name", rule="cleanup.name")
        by_parent.setdefault(child.parent, []).append(child)
    for parent, group in by_parent.items():
        root_fd = secure_private_root(parent, what="private parent", create=False)
        try:
            dev = os.fstat(root_fd).st_dev
            for child in group:
                try:
                    if _remove_one(root_fd, dev, child):
                        removed.append(child.path)
                except KilnError as exc:
                    failed.append(SkippedChild(child.path, str(exc)))
        finally:
            os.close(root_fd)
    return RemovalResult(tuple(removed), tuple(failed))


# --- the subcommand -------------------------------------------------------------------------


def _parse(argv: Sequence[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    items = list(argv)
    while items:
        token = items.pop(0)
        name, eq, value = token.partition("=")
        if name in ("--dry-run", "--json", "--help", "-h") and not eq:
            key, value = name.lstrip("-"), ""
        elif name in ("--snapshot-root", "--cache-root"):
            if not eq:
                if not items:
                    raise InputError(f"{name} needs a directory", rule="cleanup.flag")
                value = items.pop(0)
            if not value or "\x00" in value:
                raise InputError(f"{name} must be a non-empty path", rule="cleanup.flag")
            key = name.lstrip("-")
        else:
            raise InputError(f"unknown cleanup flag {name!r}", rule="cleanup.flag", hint=USAGE)
        if key in flags:
            raise InputError(f"{name} is given twice", rule="cleanup.flag")
        flags[key] = value
    return flags


def _roots(flags: Mapping[str, str], env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The flagged parents; with neither flag, the launcher's defaults for both."""
    if "snapshot-root" in flags or "cache-root" in flags:
        return flags.get("snapshot-root"), flags.get("cache-root")
    from_env = env.get(SNAPSHOT_ROOT_ENV)
    if from_env is not None and (not from_env or "\x00" in from_env):
        raise InputError(f"{SNAPSHOT_ROOT_ENV} must be a non-empty path", rule="cleanup.flag")
    home = env.get("HOME", "")
    if not home.startswith("/") or "\x00" in home:
        raise InputError(
            "no --snapshot-root or --cache-root given and HOME is not an absolute path",
            rule="cleanup.flag",
        )
    base = home.rstrip("/")
    return from_env or f"{base}/{DEFAULT_SNAPSHOT_SUBDIR}", f"{base}/{DEFAULT_CACHE_SUBDIR}"


def _report(
    scan: ChildScan, result: RemovalResult | None, roots: tuple[str | None, str | None]
) -> dict[str, object]:
    failed = () if result is None else result.failed
    return {
        "snapshot_root": roots[0],
        "cache_root": roots[1],
        "dry_run": result is None,
        "stale": [
            {"path": str(c.path), "kind": c.kind, "pid": c.pid, "reason": c.reason}
            for c in scan.stale
        ],
        "removed": [] if result is None else [str(p) for p in result.removed],
        "failed": [{"path": str(f.path), "reason": f.reason} for f in failed],
        "live": [str(p) for p in scan.live],
        "skipped": [{"path": str(s.path), "reason": s.reason} for s in scan.skipped],
    }


def _print_text(scan: ChildScan, result: RemovalResult | None) -> None:
    verb = "would remove" if result is None else "stale"
    lines = [f"{verb} {c.path} ({c.reason})" for c in scan.stale]
    if result is not None:
        lines += [f"removed {p}" for p in result.removed]
        lines += [f"FAILED {f.path}: {f.reason}" for f in result.failed]
    lines += [f"in use {p}" for p in scan.live]
    lines += [f"left alone {s.path} ({s.reason})" for s in scan.skipped]
    sys.stdout.write("".join(f"{line}\n" for line in lines) or "nothing to clean up\n")


def cleanup_main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """``kiln-teacher cleanup``: 0 when every stale child was removed (or listed), else 2."""
    flags = _parse(argv)
    if "help" in flags or "h" in flags:
        sys.stdout.write(USAGE)
        return 0
    roots = _roots(flags, os.environ if env is None else env)
    scan = scan_children(*roots)
    result = None if "dry-run" in flags else remove_stale(scan.stale)
    report = _report(scan, result, roots)
    if "json" in flags:
        sys.stdout.write(json.dumps(report, ensure_ascii=False, separators=(",", ":")) + "\n")
    else:
        _print_text(scan, result)
    return 2 if result is not None and result.failed else 0
