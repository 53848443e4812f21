"""Reading untrusted bytes strictly: one bounded regular-file reader, one strict JSON loader.

Owns ``read_regular_file`` (open without following a symlink and without
blocking on a FIFO, refuse anything but a regular file, refuse a file over the
limit before reading and one that grew past it while read) and ``loads_strict``
(UTF-8 JSON refusing duplicate keys at every level and NaN/Infinity literals).

The reader never words a refusal itself: the caller passes ``refuse``, which
turns a ``FileProblem`` into that caller's ``KilnError`` (its own message, rule
and hint), so every caller keeps its wording.  ``check`` runs on the open file's
stat before any byte is read (ownership, mode, a read-rate budget).

Imports only the standard library and ``kiln_registry.domain`` (errors, text); no sockets,
subprocesses or database (the identity layer's rule).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn

from kiln_registry.domain.errors import KilnError
from kiln_registry.domain.text import quoted

_CHUNK = 1024 * 1024


class Problem(Enum):
    """Why ``read_regular_file`` refused a file."""

    MISSING = "missing"  # nothing at the path
    SYMLINK = "symlink"  # the path is a symbolic link (not followed)
    OPEN = "open"  # any other failure to open; ``detail`` is the OS's wording
    NOT_REGULAR = "not_regular"  # a directory, FIFO, socket or device
    TOO_LARGE = "too_large"  # the size before reading is over the limit; ``size`` set
    GREW = "grew"  # more than ``limit`` bytes came while reading
    READ = "read"  # a read failed; ``detail`` is the OS's wording


@dataclass(frozen=True)
class FileProblem:
    """One refusal: its kind, the OS's wording where one applies, the size seen."""

    kind: Problem
    detail: str = ""
    size: int = 0


Refuse = Callable[[FileProblem], KilnError]


def read_regular_file(
    path: str | os.PathLike[str],
    *,
    limit: int,
    refuse: Refuse,
    check: Callable[[os.stat_result], None] | None = None,
    follow_symlinks: bool = False,
) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` (at most ``limit``) and its stat.

    Every refusal is ``raise refuse(FileProblem(...))``.  ``follow_symlinks``
    is for files a person names on purpose (a config file may be a symlink).
    """
    fd = _open(path, refuse, follow_symlinks)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse(FileProblem(Problem.NOT_REGULAR))
        if check is not None:
            check(info)
        if info.st_size > limit:
            raise refuse(FileProblem(Problem.TOO_LARGE, size=info.st_size))
        data = _read_at_most(fd, limit, refuse)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise refuse(FileProblem(Problem.GREW, size=len(data)))
    return data, info


def _open(path: str | os.PathLike[str], refuse: Refuse, follow_symlinks: bool) -> int:
    # O_NONBLOCK: opening a FIFO must not hang; it is refused as not regular.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        return os.open(path, flags)
    except FileNotFoundError as exc:
        raise refuse(FileProblem(Problem.MISSING, exc.strerror or "")) from None
    except OSError as exc:
        if not follow_symlinks and (exc.errno == errno.ELOOP or Path(path).is_symlink()):
            raise refuse(FileProblem(Problem.SYMLINK, exc.strerror or "")) from None
        raise refuse(FileProblem(Problem.OPEN, exc.strerror or "")) from None


def _read_at_most(fd: int, limit: int, refuse: Refuse) -> bytes:
    """Up to ``limit + 1`` bytes (one more than allowed shows the file grew)."""
    chunks: list[bytes] = []
    left = limit + 1
    try:
        while left > 0:
            chunk = os.read(fd, min(left, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise refuse(FileProblem(Problem.READ, exc.strerror or "")) from None
    return b"".join(chunks)


class DuplicateKeyError(ValueError):
    """A JSON object repeats ``key``."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {quoted(key, 40)}")
        self.key = key


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing a repeated key (``DuplicateKeyError``)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return obj


def refuse_constant(name: str) -> NoReturn:
    """``parse_constant`` refusing ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON)."""
    raise ValueError(f"{name} is not JSON")


def loads_strict(data: bytes | str) -> Any:
    """UTF-8 JSON without duplicate keys or NaN/Infinity.

    Raises ``UnicodeDecodeError``, ``DuplicateKeyError``, ``RecursionError`` or
    another ``ValueError`` (``json.JSONDecodeError`` among them); callers word them.
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return json.loads(text, object_pairs_hook=unique_object, parse_constant=refuse_constant)
