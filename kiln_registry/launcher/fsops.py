"""Descriptor-anchored file operations for snapshot staging and removal.

Owns the low-level steps the staging code composes: ``try_reflink`` (FICLONE,
``False`` where the file system pair cannot), ``copy_and_hash`` (one read
through the shared ``ReadRateLimiter`` that is hashed and written, with
write-back started as it goes), ``drop_cached`` (advise the kernel to drop
a file's cached pages), ``hash_fd`` (SHA-256 of exactly the first N
bytes of an open file, proving nothing follows them), ``run_parallel``
(largest job first on a thread pool, completion callbacks on the caller's
thread, first failure cancels the rest) and ``remove_tree_at`` (delete a
child through its parent's open descriptor, never following links nor
crossing into another filesystem, with bounded depth and entry count).

Imports: standard library, ``kiln_registry.identity.hashing`` and
``kiln_registry.domain.errors`` only; no subprocess, sockets or database.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

from kiln_registry.domain.errors import IdentityError, KilnError, LauncherError
from kiln_registry.identity import hashing
from kiln_registry.identity.hashing import ReadRateLimiter, digest_exactly

FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h
# errno values meaning "this file system (pair) cannot reflink": fall back to a copy.
_NO_REFLINK = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS}
)
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
# How every launcher module opens a directory: never through a symlink, never inherited.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

J = TypeVar("J")
R = TypeVar("R")
Progress = Callable[[str, int, int], None]


def reporter(progress: Progress | None, phase: str, total: int) -> Callable[[int], None]:
    """A per-phase byte counter that calls ``progress(phase, done, total)``; reports 0 now.

    Safe to call from several threads (a limiter's observer runs on the hashing pool).
    """
    done = 0
    lock = threading.Lock()

    def report(nbytes: int) -> None:
        nonlocal done
        with lock:
            done += nbytes
            now = done
        if progress is not None:
            progress(phase, now, total)

    report(0)
    return report


def io_error(exc: OSError, action: str) -> LauncherError:
    """Translate an ``OSError`` of the launcher's own writes into the error tree."""
    if exc.errno in _NO_SPACE:
        return LauncherError(
            f"no space left while trying to {action}: {exc.strerror}",
            rule="staging.no_space",
            hint="free space (bytes and inodes) on the snapshot root's file system",
        )
    return LauncherError(f"cannot {action}: {exc.strerror}", rule="staging.io")


def _read_into(fd: int, view: memoryview, offset: int) -> int:
    return os.preadv(fd, [view], offset)


def _sequential(fd: int) -> None:
    """Ask for a larger read-ahead window; purely advisory (a cold reflinked copy gains)."""
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)


def drop_cached(fd: int) -> None:
    """Advise the kernel to drop ``fd``'s clean cached pages (``POSIX_FADV_DONTNEED``).

    Advisory: pages another process maps, dirty pages and file systems that
    ignore the advice keep what they have.
    """
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def hash_fd(
    fd: int,
    length: int,
    limiter: ReadRateLimiter,
    *,
    shown: str,
    rule_prefix: str,
    error: type[KilnError] = IdentityError,
) -> bytes:
    """SHA-256 of bytes ``[0, length)`` of ``fd``; refuse a shorter or longer file.

    The rules raised are ``<rule_prefix>_shrunk`` and ``<rule_prefix>_grew``.
    """
    _sequential(fd)
    rules = (f"{rule_prefix}_shrunk", f"{rule_prefix}_grew")
    reader = functools.partial(_read_into, fd)
    return digest_exactly(reader, length, limiter, shown=shown, rules=rules, error=error)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


# Write-back of the staged copy starts every 16 MiB (Linux ``sync_file_range``
# with SYNC_FILE_RANGE_WRITE, which queues the I/O and returns), so the disk
# writes while the next chunks are hashed instead of all at the final fsync.
# Advisory only: the fsync that makes the file durable is unchanged.
_WRITEBACK_STEP = 16 * 1024 * 1024
_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), looked up on first use; None elsewhere."""
    function = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        function.restype = ctypes.c_int
    return function


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    function = _sync_file_range()
    if function is not None:
        function(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def copy_and_hash(
    src_fd: int, dst_fd: int, length: int, limiter: ReadRateLimiter, *, shown: str
) -> bytes:
    """Copy exactly ``length`` bytes, hashing what was read; refuse growth or shrinkage."""
    _sequential(src_fd)
    written = 0
    flushed = 0

    def write(chunk: memoryview) -> None:
        nonlocal written, flushed
        try:
            _write_all(dst_fd, chunk)
        except OSError as exc:
            raise io_error(exc, f"write the staged copy of {shown}") from None
        written += len(chunk)
        if written - flushed >= _WRITEBACK_STEP:
            _start_writeback(dst_fd, flushed, written - flushed)
            flushed = written

    return digest_exactly(
        functools.partial(_read_into, src_fd),
        length,
        limiter,
        shown=shown,
        rules=("staging.source_shrunk", "staging.source_grew"),
        verb="copied",
        sink=write,
    )


def try_reflink(src_fd: int, dst_fd: int, *, shown: str) -> bool:
    """Clone the whole source into the empty destination; ``False`` where unsupported."""
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
    except OSError as exc:
        if exc.errno in _NO_REFLINK:
            return False
        raise io_error(exc, f"reflink {shown}") from None
    return True


def worker_count(workers: int | None, jobs: int) -> int:
    """``hashing.worker_count`` with the launcher's error and rule."""
    return hashing.worker_count(workers, jobs, error=LauncherError, rule="staging.workers")


def run_parallel(
    jobs: Sequence[J],
    work: Callable[[J], R],
    *,
    size: Callable[[J], int],
    workers: int | None,
    on_done: Callable[[J, R], None],
) -> list[R]:
    """``work`` over ``jobs`` (largest first); results in input order.

    ``on_done`` runs on the calling thread as each job finishes.  The first
    failure cancels jobs not yet started, waits for the running ones and is
    raised.
    """
    if not jobs:
        return []
    order = sorted(range(len(jobs)), key=lambda i: -size(jobs[i]))
    results: dict[int, R] = {}
    with ThreadPoolExecutor(worker_count(workers, len(jobs)), "kiln-stage") as executor:
        pending: dict[Future[R], int] = {executor.submit(work, jobs[i]): i for i in order}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    index = pending.pop(future)
                    results[index] = future.result()
                    on_done(jobs[index], results[index])
        finally:
            for future in pending:
                future.cancel()
    return [results[i] for i in range(len(jobs))]


@dataclass
class RemovalBudget:
    """Bounds on one removal: entries visited and directory depth."""

    max_entries: int = 10_000_000
    max_depth: int = 512
    entries: int = 0


def _entry_names(fd: int, budget: RemovalBudget, shown: str) -> list[str]:
    names: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if budget.entries + 1 > budget.max_entries:
                raise LauncherError(
                    f"{shown} holds more than {budget.max_entries} entries; not removed",
                    rule="remove.too_many_entries",
                )
            budget.entries += 1
            names.append(entry.name)
    return names


def _clear_directory(fd: int, dev: int, depth: int, budget: RemovalBudget, shown: str) -> None:
    info = os.fstat(fd)
    if info.st_dev != dev:
        raise LauncherError(
            f"{shown} is on another file system; removal does not cross it",
            rule="remove.cross_device",
            hint="unmount what is mounted there, then run `kiln-teacher cleanup` again",
        )
    if depth > budget.max_depth:
        raise LauncherError(f"{shown} is nested too deeply to remove", rule="remove.too_deep")
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
        os.fchmod(fd, 0o700)  # sealed snapshot directories are 0500
    for name in _entry_names(fd, budget, shown):
        entry = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(entry.st_mode):
            os.unlink(name, dir_fd=fd)  # a link is removed, never followed
            continue
        child = os.open(name, DIR_FLAGS, dir_fd=fd)
        try:
            _clear_directory(child, dev, depth + 1, budget, f"{shown}/{name}")
        finally:
            os.close(child)
        os.rmdir(name, dir_fd=fd)


def remove_tree_at(parent_fd: int, name: str, *, dev: int, shown: str) -> bool:
    """Remove directory ``name`` under ``parent_fd`` and everything in it.

    Never follows a link and never enters a directory whose device differs
    from ``dev``.  Returns ``False`` when ``name`` does not exist (idempotent).
    """
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise LauncherError(
            f"cannot open {shown} for removal: {exc.strerror}", rule="remove.io"
        ) from None
    try:
        _clear_directory(fd, dev, 0, RemovalBudget(), shown)
    except OSError as exc:
        raise LauncherError(f"cannot remove {shown}: {exc.strerror}", rule="remove.io") from None
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
        os.fsync(parent_fd)
    except OSError as exc:
        raise LauncherError(f"cannot remove {shown}: {exc.strerror}", rule="remove.io") from None
    return True
