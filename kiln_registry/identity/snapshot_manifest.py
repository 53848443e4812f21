"""The staged-snapshot manifest of docs/identity.md section 5.

Owns the canonical bytes of ``snapshot-manifest.json``
(``kiln.vllm-teacher-snapshot.v1``) and ``snapshot_content_sha256``: compact
JSON, raw UTF-8, keys ``schema``, ``has_adapter``, ``directories`` (every
directory including the roots ``model`` and ``adapter``, sorted by UTF-8
bytes) and ``files`` (``path``, ``bytes``, ``sha256``; sorted by path).
Logical paths start with ``model`` or ``adapter`` and use ``/``.

Pure: imports the standard library and ``kiln_registry.identity`` /
``kiln_registry.domain.errors`` only; never touches the file system.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.digests import FileRecord
from kiln_registry.identity.tree import TreeInventory

SNAPSHOT_SCHEMA = "kiln.vllm-teacher-snapshot.v1"
SNAPSHOT_MANIFEST_NAME = "snapshot-manifest.json"
MAX_MANIFEST_BYTES = 128 * 1024 * 1024
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ManifestFile:
    path: str
    bytes: int
    sha256: str


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise IdentityError(f"{what} {text!r} is not valid UTF-8", rule="snapshot.path") from None


def _check_path(path: str, roots: tuple[str, ...], *, is_dir: bool) -> bytes:
    data = _utf8(path, "snapshot path")
    parts = path.split("/")
    if parts[0] not in roots or (not is_dir and len(parts) < 2):
        raise IdentityError(
            f"snapshot path {path!r} is not below {' or '.join(roots)}", rule="snapshot.path"
        )
    if any(p in ("", ".", "..") for p in parts) or any(
        ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path
    ):
        raise IdentityError(
            f"snapshot path {path!r} is not a clean POSIX path", rule="snapshot.path"
        )
    return data


def _check_file(entry: ManifestFile, roots: tuple[str, ...]) -> bytes:
    key = _check_path(entry.path, roots, is_dir=False)
    if isinstance(entry.bytes, bool) or not isinstance(entry.bytes, int) or entry.bytes < 0:
        raise IdentityError(
            f"snapshot file {entry.path!r} has an invalid length {entry.bytes!r}",
            rule="snapshot.file_bytes",
        )
    if not isinstance(entry.sha256, str) or not _SHA256_HEX.fullmatch(entry.sha256):
        raise IdentityError(
            f"snapshot file {entry.path!r} sha256 is not 64 lowercase hex characters",
            rule="snapshot.file_sha256",
        )
    return key


def _sorted_unique(keys: list[bytes], what: str) -> None:
    for previous, current in itertools.pairwise(keys):
        if previous == current:
            raise IdentityError(
                f"snapshot {what} {current.decode('utf-8')!r} is listed twice",
                rule="snapshot.duplicate",
            )


def snapshot_manifest_bytes(
    *, has_adapter: bool, directories: Iterable[str], files: Iterable[ManifestFile]
) -> bytes:
    """The canonical manifest bytes; inputs may come in any order."""
    roots = ("model", "adapter") if has_adapter else ("model",)
    dirs = sorted((_check_path(d, roots, is_dir=True), d) for d in directories)
    _sorted_unique([k for k, _ in dirs], "directory")
    present = {d for _, d in dirs}
    for root in roots:
        if root not in present:
            raise IdentityError(
                f"snapshot directories must include the root {root!r}", rule="snapshot.roots"
            )
    rows = sorted(((_check_file(f, roots), f) for f in files), key=lambda row: row[0])
    _sorted_unique([k for k, _ in rows], "file")
    document = {
        "schema": SNAPSHOT_SCHEMA,
        "has_adapter": has_adapter,
        "directories": [d for _, d in dirs],
        "files": [{"path": f.path, "bytes": f.bytes, "sha256": f.sha256} for _, f in rows],
    }
    data = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(
        "utf-8"
    )
    if len(data) > MAX_MANIFEST_BYTES:
        raise IdentityError(
            f"snapshot manifest is {len(data)} bytes, over {MAX_MANIFEST_BYTES}",
            rule="snapshot.manifest_too_large",
        )
    return data


def snapshot_content_sha256(manifest: bytes) -> str:
    return hashlib.sha256(manifest).hexdigest()


def _logical(
    prefix: str, tree: TreeInventory, records: Sequence[FileRecord]
) -> tuple[list[str], list[ManifestFile]]:
    if len(records) != len(tree.files):
        raise ValueError(f"{prefix} records must match the inventory's files one to one")
    dirs = [prefix, *(f"{prefix}/{d}" for d in tree.directories)]
    files = [
        ManifestFile(f"{prefix}/{entry.relpath}", record.length, record.digest.hex())
        for entry, record in zip(tree.files, records, strict=True)
    ]
    for entry, record in zip(tree.files, records, strict=True):
        if entry.size != record.length:
            raise IdentityError(
                f"{prefix}/{entry.relpath} changed size between inventory and hashing",
                rule="snapshot.changed",
            )
    return dirs, files


def build_snapshot_manifest(
    model: TreeInventory,
    model_records: Sequence[FileRecord],
    adapter: TreeInventory | None = None,
    adapter_records: Sequence[FileRecord] = (),
) -> bytes:
    """Manifest bytes for a model tree (and optional adapter tree) and their hashes.

    ``*_records`` are aligned with ``TreeInventory.files``.
    """
    directories, files = _logical("model", model, model_records)
    if adapter is not None:
        more_dirs, more_files = _logical("adapter", adapter, adapter_records)
        directories += more_dirs
        files += more_files
    elif adapter_records:
        raise ValueError("adapter_records given without an adapter inventory")
    return snapshot_manifest_bytes(
        has_adapter=adapter is not None, directories=directories, files=files
    )
