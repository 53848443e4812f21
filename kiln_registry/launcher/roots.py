"""Private launcher parents and the owned children the launcher creates in them.

Owns the rules for the snapshot and cache parents (``secure_private_root``:
owned by the effective UID, mode exactly 0700, ancestry owned by that UID or
root and not group/world-writable unless sticky, the kernel overflow UID
accepted in ancestry only under a validated single-entry rootless user
namespace mapping; ``check_distinct_roots``: model, adapter, snapshot and
cache roots distinct and not nested), the child names
(``.building-<pid>-<hex>``, ``ready-<pid>-<hex>``, ``cache-<pid>-<hex>``) and
the owner record (``.kiln-owner``) written inside each child at creation.

Owner record: compact JSON ``{"schema","pid","start_ticks","boot_id"}`` where
``start_ticks`` is field 22 of ``/proc/<pid>/stat`` (start time in clock
ticks since boot) and ``boot_id`` is ``/proc/sys/kernel/random/boot_id``.  A
child's owner is alive only if the same boot is running and the PID still
exists with the same start time, so PID reuse and host resets are detected.

Imports: standard library, ``kiln_registry.domain.errors`` and
``launcher.fsops`` (``DIR_FLAGS``) only; no subprocess, sockets, database or web
framework.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from kiln_registry.domain.errors import LauncherError
from kiln_registry.launcher.fsops import DIR_FLAGS

PathArg = str | os.PathLike[str]

OWNER_NAME = ".kiln-owner"
OWNER_SCHEMA = "kiln.launcher-owner.v1"
MAX_OWNER_BYTES = 4096
CHILD_NAME = re.compile(r"(\.building|ready|cache)-([1-9][0-9]{0,9})-([0-9a-f]{32})")
_FILE_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_DEFAULT_OVERFLOW_UID = 65534


# --- private parents -------------------------------------------------------------------


def parse_uid_map(text: str) -> tuple[int, int, int] | None:
    """The one ``inside outside count`` line of a single-entry uid_map, else ``None``."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or len(lines[0]) != 3 or not all(p.isdigit() for p in lines[0]):
        return None
    inside, outside, count = (int(p) for p in lines[0])
    return inside, outside, count


def rootless_overflow_uid(uid_map: str, euid: int, overflow_uid: int) -> int | None:
    """The overflow UID to accept in ancestry, or ``None`` outside a rootless mapping.

    Accepted only when the mapping is exactly one entry of count 1 that maps
    our own UID: then every other host owner (root included) shows as the
    overflow UID and cannot be told apart from it.
    """
    entry = parse_uid_map(uid_map)
    if entry is None or entry[2] != 1 or entry[0] != euid or overflow_uid == euid:
        return None
    return overflow_uid


def _read_small(path: str) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read(MAX_OWNER_BYTES)
    except (OSError, UnicodeDecodeError):
        return ""


def _ancestry_owners() -> frozenset[int]:
    euid = os.geteuid()
    overflow_text = _read_small("/proc/sys/kernel/overflowuid").strip()
    overflow = int(overflow_text) if overflow_text.isdigit() else _DEFAULT_OVERFLOW_UID
    extra = rootless_overflow_uid(_read_small("/proc/self/uid_map"), euid, overflow)
    return frozenset(uid for uid in (euid, 0, extra) if uid is not None)


def _check_ancestor(info: os.stat_result, shown: str, what: str, owners: frozenset[int]) -> None:
    if info.st_uid not in owners:
        raise LauncherError(
            f"{what}: ancestor {shown} is owned by UID {info.st_uid}, not by UID"
            f" {os.geteuid()} or root",
            rule="roots.ancestry_owner",
            hint="put the private parent under a directory that only you or root control",
        )
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not info.st_mode & stat.S_ISVTX:
        raise LauncherError(
            f"{what}: ancestor {shown} is group- or world-writable without the sticky bit"
            f" (mode {stat.S_IMODE(info.st_mode):04o}), so others could rename it",
            rule="roots.ancestry_writable",
            hint="remove group/world write permission, or use a sticky directory such as /tmp",
        )


def _open_component(part: str, dir_fd: int, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o700, dir_fd=dir_fd)
    return os.open(part, DIR_FLAGS, dir_fd=dir_fd)


def _open_ancestry(parent: str, what: str, create: bool) -> int:
    """Open ``parent`` component by component without following links, checking each.

    With ``create``, missing components are made with mode 0700 (``mkdir -p``).
    """
    owners = _ancestry_owners()
    fd = os.open("/", DIR_FLAGS)
    try:
        _check_ancestor(os.fstat(fd), "/", what, owners)
        shown = ""
        for part in (p for p in parent.split("/") if p):
            shown += "/" + part
            child = _open_component(part, fd, create)
            os.close(fd)
            fd = child
            _check_ancestor(os.fstat(fd), shown, what, owners)
    except OSError as exc:
        os.close(fd)
        raise LauncherError(
            f"{what}: cannot open ancestor directory {parent}: {exc.strerror}",
            rule="roots.ancestry_unreadable",
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_final(parent_fd: int, name: str, shown: str, what: str, create: bool) -> int:
    created = False
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            created = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise LauncherError(
                f"{what} {shown} cannot be created: {exc.strerror}", rule="roots.create"
            ) from None
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LauncherError(
                f"{what} {shown} is a symbolic link or not a directory",
                rule="roots.not_directory",
                hint="pass the real path of a private directory",
            ) from None
        rule = "roots.missing" if exc.errno == errno.ENOENT else "roots.unreadable"
        raise LauncherError(f"{what} {shown} cannot be opened: {exc.strerror}", rule=rule) from None
    if created:
        os.fchmod(fd, 0o700)
        os.fsync(parent_fd)
    return fd


def _check_final(fd: int, shown: str, what: str) -> None:
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise LauncherError(
            f"{what} {shown} is owned by UID {info.st_uid}, not by the launcher's UID"
            f" {os.geteuid()}",
            rule="roots.owner",
            hint="use a directory you own, or let the launcher create it",
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o700:
        raise LauncherError(
            f"{what} {shown} has mode {mode:04o}; it must be exactly 0700",
            rule="roots.mode",
            hint=f"chmod 0700 {shown}",
        )


def resolved_root_path(path: PathArg) -> Path:
    """The parent's path with links above it resolved (what ``secure_private_root`` opens)."""
    absolute = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(absolute)
    return Path(os.path.realpath(parent)) / name


def secure_private_root(path: PathArg, *, what: str, create: bool = True) -> int:
    """Open (creating if missing and ``create``) a private parent and check its rules.

    Returns an ``O_DIRECTORY|O_NOFOLLOW`` descriptor the caller keeps open and
    closes: every child is then created, renamed and removed relative to it.
    Symbolic links above the parent are resolved first and each real
    component is then checked; the parent itself must not be a link.
    """
    absolute = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(absolute)
    if not name or name in (".", ".."):
        raise LauncherError(f"{what} {absolute!r} is not a usable directory", rule="roots.path")
    real_parent = os.path.realpath(parent)
    parent_fd = _open_ancestry(real_parent, what, create)
    try:
        fd = _open_final(parent_fd, name, absolute, what, create)
    finally:
        os.close(parent_fd)
    try:
        _check_final(fd, absolute, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_distinct_roots(
    model: PathArg, adapter: PathArg | None, snapshot_root: PathArg, cache_root: PathArg | None
) -> None:
    """Refuse roots that are equal or nested (compared after resolving links)."""
    named = [("model path", model), ("snapshot root", snapshot_root)]
    if adapter is not None:
        named.insert(1, ("adapter path", adapter))
    if cache_root is not None:
        named.append(("cache root", cache_root))
    real = [(label, Path(os.path.realpath(os.fspath(p)))) for label, p in named]
    for index, (label, path) in enumerate(real):
        for other_label, other in real[index + 1 :]:
            if path == other:
                raise LauncherError(
                    f"{label} and {other_label} are the same directory ({path})",
                    rule="roots.equal",
                    hint="model, adapter, snapshot and cache roots must be four distinct paths",
                )
            if path.is_relative_to(other) or other.is_relative_to(path):
                raise LauncherError(
                    f"{label} ({path}) and {other_label} ({other}) are nested: one is"
                    " inside the other",
                    rule="roots.nested",
                    hint="model, adapter, snapshot and cache roots must not contain one another",
                )


# --- owned children --------------------------------------------------------------------


def new_child_suffix() -> str:
    """``<pid>-<32 hex>``: the part shared by a child's .building and ready names."""
    return f"{os.getpid()}-{secrets.token_hex(16)}"


@dataclass(frozen=True)
class OwnerRecord:
    pid: int
    start_ticks: int
    boot_id: str

    def to_bytes(self) -> bytes:
        document = {
            "schema": OWNER_SCHEMA,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "boot_id": self.boot_id,
        }
        return json.dumps(document, separators=(",", ":")).encode("ascii")


def boot_id() -> str:
    return _read_small("/proc/sys/kernel/random/boot_id").strip()


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``, or ``None`` when no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read(MAX_OWNER_BYTES)
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 1 :].split()
    if len(fields) < 20 or not fields[19].isdigit():
        raise LauncherError(f"/proc/{pid}/stat is not in the expected format", rule="owner.proc")
    return int(fields[19])


def current_owner() -> OwnerRecord:
    pid = os.getpid()
    ticks = process_start_ticks(pid)
    if ticks is None:
        raise LauncherError("/proc/self/stat is unavailable (is /proc mounted?)", rule="owner.proc")
    return OwnerRecord(pid=pid, start_ticks=ticks, boot_id=boot_id())


def write_owner_record(dir_fd: int, owner: OwnerRecord) -> None:
    """Create ``.kiln-owner`` (mode 0400) in the open directory, durably."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(OWNER_NAME, flags, 0o400, dir_fd=dir_fd)
    try:
        data = owner.to_bytes()
        if os.write(fd, data) != len(data):
            raise LauncherError("short write of the owner record", rule="owner.write")
        os.fchmod(fd, 0o400)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_owner_record(dir_fd: int) -> OwnerRecord | None:
    """The child's owner record, or ``None`` when it is missing or malformed."""
    try:
        fd = os.open(OWNER_NAME, _FILE_READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MAX_OWNER_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw) if len(raw) <= MAX_OWNER_BYTES else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or set(doc) != {"schema", "pid", "start_ticks", "boot_id"}:
        return None
    pid, ticks, boot = doc["pid"], doc["start_ticks"], doc["boot_id"]
    if doc["schema"] != OWNER_SCHEMA or not isinstance(boot, str):
        return None
    if not all(type(v) is int and v >= 0 for v in (pid, ticks)):
        return None
    return OwnerRecord(pid=pid, start_ticks=ticks, boot_id=boot)


def owner_alive(record: OwnerRecord) -> bool:
    """True when the recorded process is still the one running under that PID."""
    if record.boot_id != boot_id():
        return False
    return process_start_ticks(record.pid) == record.start_ticks


def pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")
