"""The launcher's memo of earlier runtime-content digests, keyed by the files' metadata.

Hashing the installed runtime (vllm, torch, transformers, tokenizers: about 2.6 GiB and
26,000 files on the CPU build) is the longest measurement before vLLM is spawned
(issue 31), and it gives the same digest on every launch until a package changes.
So the launcher, before spawn, may reuse the digest an earlier launch computed when
nothing it covers changed.  "Nothing changed" is the ``signature``: a SHA-256 over the
inventory itself (every label and resolved path, in order) and each resolved file's
device, inode, mode, length, modification and status-change times.  Any write,
replacement, chmod or reinstall changes a status-change time the writer cannot set
back; a new or removed file changes the inventory.

**Not trusted on its own.**  The memo only shortens the measurement before spawn.  The
recheck child (``launcher.teacher_input``) never reads it: it hashes every file again
and the launch serves nothing until its document equals the launcher's byte for byte,
so a stale or forged memo entry fails the launch (``launcher.recheck_mismatch``) and
never names a teacher; the launcher then removes the memo (``forget``), so the next
launch hashes every file again.  ``kiln-teacher identity`` and ``manifest`` never use it.

**Storage.**  One file, ``runtime-content.v1.json``, in the private cache root (mode
0700, owned by the launcher UID, checked by ``roots.secure_private_root``; ``cleanup``
leaves it alone: it removes only ``cache-*`` directories).  It holds at most
``MAX_ENTRIES`` entries, newest first.  It is read with ``O_NOFOLLOW`` and must be a
regular file of this UID of at most ``MAX_MEMO_BYTES``; anything else, or a document of
another shape, is a miss (the digest is computed).  It is written as a temporary file
in the same directory, fsynced, renamed over the old one, and the directory fsynced;
a failure to write leaves the old memo and is not an error of the launch.

Imports: standard library and ``kiln_registry.identity.canonical``; pure but for the
memo file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from kiln_registry.identity.canonical import canonical_json

MEMO_NAME: Final = "runtime-content.v1.json"
MEMO_SCHEMA: Final = "kiln.runtime-content-memo.v1"
MAX_MEMO_BYTES: Final = 64 * 1024
MAX_ENTRIES: Final = 16
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_COUNTS: Final = ("files", "directories", "bytes")


@dataclass(frozen=True, slots=True)
class MemoEntry:
    """A runtime-content digest and its counts, valid for one ``signature``."""

    signature: str
    sha256: str
    files: int
    directories: int
    bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "signature": self.signature,
            "sha256": self.sha256,
            "files": self.files,
            "directories": self.directories,
            "bytes": self.bytes,
        }


def signature(
    files: Iterable[tuple[str, str]],
    directories: Iterable[tuple[str, str]],
    stats: dict[str, os.stat_result],
) -> str:
    """SHA-256 over the inventory (labels, resolved paths) and each file's metadata."""
    digest = hashlib.sha256(MEMO_SCHEMA.encode() + b"\x00")
    for label, resolved in files:
        info = stats[resolved]
        fields = (info.st_dev, info.st_ino, info.st_mode, info.st_size)
        times = (info.st_mtime_ns, info.st_ctime_ns)
        digest.update(f"f\x00{label}\x00{resolved}\x00{fields}{times}\n".encode())
    for label, resolved in directories:
        digest.update(f"d\x00{label}\x00{resolved}\n".encode())
    return digest.hexdigest()


class RuntimeMemo:
    """The memo file under an open private cache root (``dir_fd``; the caller closes it)."""

    def __init__(self, dir_fd: int) -> None:
        self.dir_fd = dir_fd

    def find(self, key: str) -> MemoEntry | None:
        """The entry for ``key``, or None (no memo, another shape, or no such entry)."""
        return next((entry for entry in self._entries() if entry.signature == key), None)

    def keep(self, entry: MemoEntry) -> None:
        """Put ``entry`` first (dropping the oldest past ``MAX_ENTRIES``); best effort."""
        entries = [entry, *(e for e in self._entries() if e.signature != entry.signature)]
        document = {"schema": MEMO_SCHEMA, "entries": [e.to_dict() for e in entries]}
        data = canonical_json(document)
        while len(data) > MAX_MEMO_BYTES or len(entries) > MAX_ENTRIES:
            entries.pop()
            document["entries"] = [e.to_dict() for e in entries]
            data = canonical_json(document)
        with contextlib.suppress(OSError):
            self._write(data)

    def forget(self) -> None:
        """Remove the memo (a recheck disagreed: the next launch hashes every file)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(MEMO_NAME, dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    def _entries(self) -> list[MemoEntry]:
        data = self._read()
        if data is None:
            return []
        try:
            document = json.loads(data)
        except (ValueError, RecursionError):
            return []
        if not isinstance(document, dict) or document.get("schema") != MEMO_SCHEMA:
            return []
        raw = document.get("entries")
        if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
            return []
        entries = [_entry(item) for item in raw]
        return [] if None in entries else [e for e in entries if e is not None]

    def _read(self) -> bytes | None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(MEMO_NAME, flags, dir_fd=self.dir_fd)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if (
                not stat.S_ISREG(info.st_mode)
                or info.st_uid != os.geteuid()
                or info.st_size > MAX_MEMO_BYTES
            ):
                return None
            data = os.read(fd, MAX_MEMO_BYTES + 1)
            return data if len(data) <= MAX_MEMO_BYTES else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def _write(self, data: bytes) -> None:
        temp = f".{MEMO_NAME}.{os.getpid()}.{os.urandom(8).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o600, dir_fd=self.dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, MEMO_NAME, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self.dir_fd)
            raise
        os.fsync(self.dir_fd)


def _entry(item: object) -> MemoEntry | None:
    if not isinstance(item, dict) or sorted(item) != sorted(("signature", "sha256", *_COUNTS)):
        return None
    key, digest = item["signature"], item["sha256"]
    if not all(isinstance(v, str) and _HEX64.fullmatch(v) for v in (key, digest)):
        return None
    counts = [item[name] for name in _COUNTS]
    if not all(type(count) is int and count >= 0 for count in counts):
        return None
    return MemoEntry(key, digest, *counts)
