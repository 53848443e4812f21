"""Bounded inventory of a model or adapter directory tree.

Owns ``inventory_tree``: a walk with ``os.scandir`` that never follows a
symbolic link and refuses anything that would make the tree's content
ambiguous (symlinks, FIFOs, sockets, devices, two paths to one inode,
non-UTF-8 names, names with control characters).  Every limit is checked
before the entry it protects is appended.  Paths are POSIX paths relative to
the root, so moving a model keeps its inventory.

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError

TIB = 1024**4
MIB = 1024**2

SYMLINK_HINT = (
    "a Hugging Face cache checkout (snapshots/<rev>/) is made of symlinks into blobs/;"
    " materialize it first, e.g. `cp -rL SNAPSHOT_DIR /path/model` or"
    " `huggingface-cli download REPO --local-dir /path/model`"
)


@dataclass(frozen=True)
class TreeLimits:
    max_entries: int = 100_000
    max_bytes: int = 16 * TIB
    max_depth: int = 128
    max_path_bytes: int = 4096
    max_total_path_bytes: int = 16 * MIB


@dataclass(frozen=True)
class TreeFile:
    relpath: str
    size: int
    dev: int
    ino: int
    mtime_ns: int


@dataclass(frozen=True)
class TreeInventory:
    root: str
    directories: tuple[str, ...]
    files: tuple[TreeFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, relpath: str) -> TreeFile | None:
        for entry in self.files:
            if entry.relpath == relpath:
                return entry
        return None

    def path_of(self, entry: TreeFile) -> str:
        return os.path.join(self.root, *entry.relpath.split("/"))


def _utf8_key(text: str) -> bytes:
    return text.encode("utf-8")


class _Walk:
    """Mutable state of one walk; every append goes through a limit check."""

    def __init__(self, root: str, limits: TreeLimits) -> None:
        self.root = root
        self.limits = limits
        self.directories: list[str] = []
        self.files: list[TreeFile] = []
        self.total_bytes = 0
        self.total_path_bytes = 0
        self.linked: dict[tuple[int, int], str] = {}

    def where(self, relpath: str) -> str:
        return os.path.join(self.root, relpath)

    def check_name(self, name: str, parent: str) -> str:
        shown = os.path.join(self.root, parent)
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise IdentityError(
                f"a name in {shown} is not valid UTF-8: {name!r}", rule="tree.name_utf8"
            ) from None
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
            raise IdentityError(
                f"a name in {shown} contains a control character: {name!r}",
                rule="tree.name_control",
            )
        relpath = f"{parent}/{name}" if parent else name
        self.count_path(relpath)
        return relpath

    def count_path(self, relpath: str) -> None:
        size = len(relpath.encode("utf-8"))
        if size > self.limits.max_path_bytes:
            raise IdentityError(
                f"path {self.where(relpath)} is {size} bytes, over {self.limits.max_path_bytes}",
                rule="tree.path_too_long",
            )
        if self.total_path_bytes + size > self.limits.max_total_path_bytes:
            raise IdentityError(
                f"paths under {self.root} exceed {self.limits.max_total_path_bytes} bytes in all",
                rule="tree.too_many_path_bytes",
            )
        if len(self.directories) + len(self.files) + 1 > self.limits.max_entries:
            raise IdentityError(
                f"{self.root} has more than {self.limits.max_entries} files and directories",
                rule="tree.too_many_entries",
            )
        self.total_path_bytes += size

    def add_file(self, relpath: str, info: os.stat_result) -> None:
        if self.total_bytes + info.st_size > self.limits.max_bytes:
            raise IdentityError(
                f"{self.root} holds more than {self.limits.max_bytes} bytes",
                rule="tree.too_many_bytes",
            )
        if info.st_nlink > 1:
            key = (info.st_dev, info.st_ino)
            other = self.linked.get(key)
            if other is not None:
                raise IdentityError(
                    f"{self.where(relpath)} and {self.where(other)} are two paths to one"
                    " file (hard link)",
                    rule="tree.hardlink",
                    hint="copy the file so that each path has its own content",
                )
            self.linked[key] = relpath
        self.total_bytes += info.st_size
        self.files.append(
            TreeFile(relpath, info.st_size, info.st_dev, info.st_ino, info.st_mtime_ns)
        )


def _refuse_kind(walk: _Walk, relpath: str, mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise IdentityError(
            f"{walk.where(relpath)} is a symbolic link; identity trees must hold real files",
            rule="tree.symlink",
            hint=SYMLINK_HINT,
        )
    raise IdentityError(
        f"{walk.where(relpath)} is a FIFO, socket or device, not a regular file",
        rule="tree.special_file",
    )


def _scan_directory(walk: _Walk, parent: str, depth: int) -> list[str]:
    """Record one directory's entries; return its subdirectories to visit."""
    subdirs: list[str] = []
    try:
        with os.scandir(walk.where(parent) if parent else walk.root) as entries:
            for entry in entries:
                relpath = walk.check_name(entry.name, parent)
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    if depth + 1 > walk.limits.max_depth:
                        raise IdentityError(
                            f"{walk.where(relpath)} is nested deeper than"
                            f" {walk.limits.max_depth} levels",
                            rule="tree.too_deep",
                        )
                    walk.directories.append(relpath)
                    subdirs.append(relpath)
                elif stat.S_ISREG(info.st_mode):
                    walk.add_file(relpath, info)
                else:
                    _refuse_kind(walk, relpath, info.st_mode)
    except OSError as exc:
        raise IdentityError(
            f"cannot read directory {walk.where(parent)}: {exc.strerror}",
            rule="tree.unreadable",
        ) from None
    return subdirs


def check_root_directory(root: str, what: str = "directory") -> None:
    """Refuse a root that is missing, a symlink, or not a directory."""
    try:
        info = os.lstat(root)
    except OSError as exc:
        raise IdentityError(
            f"{what} {root} cannot be read: {exc.strerror}", rule="tree.root_missing"
        ) from None
    if stat.S_ISLNK(info.st_mode):
        raise IdentityError(
            f"{what} {root} is a symbolic link", rule="tree.symlink", hint=SYMLINK_HINT
        )
    if not stat.S_ISDIR(info.st_mode):
        raise IdentityError(f"{what} {root} is not a directory", rule="tree.root_not_directory")


def inventory_tree(
    root: str | os.PathLike[str], *, limits: TreeLimits = TreeLimits()
) -> TreeInventory:
    """Inventory every directory and regular file below ``root`` (sorted by UTF-8 bytes)."""
    text = os.path.abspath(os.fspath(root))
    check_root_directory(text)
    walk = _Walk(text, limits)
    pending: list[tuple[str, int]] = [("", 0)]
    while pending:
        parent, depth = pending.pop()
        pending.extend((sub, depth + 1) for sub in _scan_directory(walk, parent, depth))
    return TreeInventory(
        root=text,
        directories=tuple(sorted(walk.directories, key=_utf8_key)),
        files=tuple(sorted(walk.files, key=lambda f: _utf8_key(f.relpath))),
    )
