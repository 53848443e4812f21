"""Writing Kiln's ``kiln.logit-cache.v3`` on disk: merged atomic entries and the archive.

``put_entry(root, entry)`` publishes one entry under ``root`` the way Kiln's
``LogitCache::put`` does: under an exclusive lock on the entry's directory, an
existing file there is read (a regular file of at most ``MAX_ENTRY_BYTES``,
never through a symlink) and must be a valid canonical entry for the same
identity, prefix and position, then merged (``logit_cache.merge``: a conflict
fails closed and leaves the file as it was); a new or wider entry is written to
a hidden temporary file (its name does not end in ``.json``, so Kiln's scans
ignore it), fsynced, renamed over the entry and the directory fsynced.  So an
interrupted export leaves complete entries only, never a torn one.

``write_archive(root, output)`` is Kiln's ``export_to_tar``: every regular
``v3-*/<prefix>/<name>.json`` file under ``root`` (bounded walk), sorted by path
components, read and validated again and checked to sit where its contents
say, written as ``logit-cache/<relative path>`` members (GNU headers, mode
0644, uid and gid 0, mtime 0, no directory members) into a gzip stream with
mtime 0; the output must lie outside the root and is published atomically.

Imports: standard library, ``kiln_registry.domain.errors`` and
``jobs.scoring.logit_cache``.
"""

from __future__ import annotations

import fcntl
import gzip
import io
import os
import secrets
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from kiln_registry.domain.errors import InputError
from kiln_registry.jobs.core.signing import fsync_dir
from kiln_registry.jobs.scoring.logit_cache import (
    MAX_ENTRY_BYTES,
    PATH_PREFIX,
    StoredEntry,
    merge,
    parse_entry,
)

MAX_SCAN_FILES: Final = 1_000_000
MAX_SCAN_DIRECTORIES: Final = 1_000_000
MAX_ARCHIVE_SOURCE_BYTES: Final = 16 * 1024**3
ARCHIVE_ROOT: Final = "logit-cache"
Outcome = Literal["written", "kept", "upgraded"]


def _error(message: str, rule: str) -> InputError:
    return InputError(message, rule=f"logit_cache.{rule}")


def _make_dirs(root: Path, relative: list[str]) -> Path:
    """``root/relative...`` as real directories (created ones fsynced into their parent)."""
    current = root
    for part in relative:
        child = current / part
        try:
            child.mkdir(mode=0o755)
            fsync_dir(current)
        except FileExistsError:
            pass
        if not stat.S_ISDIR(os.lstat(child).st_mode):
            raise _error(f"{child} is not a directory", "layout")
        current = child
    return current


def read_bounded(path: Path) -> bytes | None:
    """An entry file's bytes; ``None`` when absent; refused if not a small regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        message = f"cache entry {path} cannot be opened ({exc.strerror})"
        raise _error(message, "entry_file") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _error(f"cache entry {path} is not a regular file", "entry_file")
        if info.st_size > MAX_ENTRY_BYTES:
            raise _error(f"cache entry {path} is over {MAX_ENTRY_BYTES} bytes", "size")
        data = handle.read(MAX_ENTRY_BYTES + 1)
    if len(data) != info.st_size:
        raise _error(f"cache entry {path} changed size while it was read", "entry_file")
    return data


def _write_atomic(directory: Path, name: str, data: bytes) -> None:
    temp = directory / f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, directory / name)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)


def _existing(path: Path, candidate: StoredEntry) -> StoredEntry | None:
    data = read_bounded(path)
    if data is None:
        return None
    try:
        existing = parse_entry(data)
    except InputError as exc:
        raise _error(f"existing cache entry {path} is invalid: {exc}", "existing") from None
    if existing.path != candidate.path:
        raise _error(f"existing cache entry {path} derives to a different path", "misplaced")
    return existing


def put_entry(root: Path, entry: StoredEntry) -> Outcome:
    """Publish ``entry`` under the cache ``root`` by Kiln's merge rules (module docstring)."""
    if not root.is_dir():
        raise _error(f"cache root {root} is not a directory", "root")
    revision_dir, prefix_dir, name = entry.path.split("/")
    directory = _make_dirs(root, [revision_dir, prefix_dir])
    lock = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        existing = _existing(directory / name, entry)
        winner = entry if existing is None else merge(existing, entry)
        if winner is existing:
            return "kept"
        _write_atomic(directory, name, winner.encode())
        return "written" if existing is None else "upgraded"
    finally:
        os.close(lock)


# -- the archive -------------------------------------------------------------------


def _looks_like_entry(parts: tuple[str, ...]) -> bool:
    return len(parts) == 3 and parts[0].startswith(PATH_PREFIX) and parts[2].endswith(".json")


def entry_files(root: Path) -> list[tuple[str, ...]]:
    """Relative paths (as components) of the v3-looking regular files, Kiln's order."""
    found: list[tuple[str, ...]] = []
    stack: list[tuple[str, ...]] = [()]
    directories = 0
    while stack:
        parts = stack.pop()
        directories += 1
        if directories > MAX_SCAN_DIRECTORIES:
            raise _error(f"the cache scan exceeds {MAX_SCAN_DIRECTORIES} directories", "scan")
        with os.scandir(root.joinpath(*parts)) as listing:
            for item in listing:
                child = (*parts, item.name)
                if item.is_dir(follow_symlinks=False):
                    stack.append(child)
                elif item.is_file(follow_symlinks=False):
                    found.append(child)
                    if len(found) > MAX_SCAN_FILES:
                        raise _error(f"the cache scan exceeds {MAX_SCAN_FILES} files", "scan")
    return sorted(p for p in found if _looks_like_entry(p))


def read_entry(root: Path, parts: tuple[str, ...]) -> tuple[StoredEntry, bytes]:
    """One file under ``root``, validated, and where its contents say it belongs."""
    path = root.joinpath(*parts)
    data = read_bounded(path)
    if data is None:
        raise _error(f"cache entry {path} disappeared during the scan", "entry_file")
    try:
        entry = parse_entry(data)
    except InputError as exc:
        raise _error(f"cache entry {path} is invalid: {exc}", "entry") from None
    if entry.path != "/".join(parts):
        raise _error(f"cache entry {path} is misplaced (it belongs at {entry.path})", "misplaced")
    return entry, data


@dataclass(frozen=True, slots=True)
class ArchiveSummary:
    entries: int
    bytes: int


def _tar_member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.uid, info.gid, info.mtime = size, 0o644, 0, 0, 0
    info.type, info.uname, info.gname = tarfile.REGTYPE, "", ""
    return info


def _archive_bytes(root: Path, files: list[tuple[str, ...]]) -> Iterator[tuple[str, bytes]]:
    total = 0
    for parts in files:
        _entry, data = read_entry(root, parts)
        total += len(data)
        if total > MAX_ARCHIVE_SOURCE_BYTES:
            raise _error(f"the cache is over the {MAX_ARCHIVE_SOURCE_BYTES} byte limit", "size")
        yield "/".join((ARCHIVE_ROOT, *parts)), data


def write_archive(root: Path, output: Path) -> ArchiveSummary:
    """Kiln's deterministic ``.tar.gz`` of the validated entries under ``root``."""
    if not root.is_dir():
        raise _error(f"cache root {root} does not exist", "root")
    real_root, real_out = root.resolve(), output.parent.resolve() / output.name
    if real_out.is_relative_to(real_root):
        raise _error(f"the archive {output} must be outside the cache root {root}", "output")
    files = entry_files(root)
    temp = output.with_name(f".{output.name}.{secrets.token_hex(8)}.partial")
    count = 0
    try:
        with temp.open("xb") as raw:
            gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
            with gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
                for name, data in _archive_bytes(root, files):
                    tar.addfile(_tar_member(name, len(data)), io.BytesIO(data))
                    count += 1
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temp, output)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(output.parent.resolve())
    return ArchiveSummary(entries=count, bytes=output.stat().st_size)
