"""Import of Kiln's ``teachers.json`` registry as Kiln migrates it, ``api_key_env`` unread.

This module owns the file side of the import: the bounded read (a regular
file, no symlink, at most ``MAX_REGISTRY_BYTES`` checked before reading),
the strict parse (UTF-8 JSON, no duplicate keys at any level, no NaN), the
shape (an object of objects keyed by alias, each alias one the API can
address), the atomic rewrite without ``api_key_env``, and the start-up run,
which never stops the server.  Each entry's rules and status are Kiln's
(``kiln_registry.legacy.entries``): only entries that carried
``api_key_env`` become ``legacy_unverified``; current-format entries keep
their identity and status.

``api_key_env`` is the one field Kiln's current format lacks that is
tolerated: it is removed from every entry without its value being looked
at, the entries are imported in one database transaction, and then the file
is atomically replaced by a copy without the field (temporary file in the
same directory, fsync, rename, fsync of the directory, same mode and
owner), as Kiln rewrites it.  The temporary file is
written before the transaction commits and renamed after, so a crash leaves
the old file or the new one, and the database with none or all entries;
running again finishes the job.  A second run changes nothing: aliases
already present are left alone, an alias imported before and deleted since
is not added again (``legacy_imports`` remembers it), and a file without
the field is not rewritten.  A new alias obeys the registration rules (issue
27 item 10): a reserved alias, a look-alike of a registered or reserved one,
an alias with an invisible character, or one past ``max_teachers`` is
skipped, logged and listed in ``ImportResult.refused``; every alias added is
an audit row (``teacher.import``, no token) in the import's transaction, at
start-up too.  Anything else is refused with an
``InputError``, nothing is imported and the file is left untouched; at
start-up (``import_configured_legacy_registry``) the refusal is logged and
recorded for ``GET /ready`` instead of stopping the server.  A crash can
leave a ``.<name>.*.kiln-import.tmp`` file beside the registry; it holds the
stripped copy (no secret) and may be deleted.

Imports: the standard library, SQLAlchemy's session types, ``kiln_registry.auth``
(the audit log, the reservation rule),
``kiln_registry.domain.aliases``, ``kiln_registry.config.settings``, ``kiln_registry.db``
(legacy, repository), ``kiln_registry.domain`` (errors, text),
``kiln_registry.identity.hashing`` (the bounded read) and
``kiln_registry.legacy.entries`` (which asks the teacher kind table); never the
API layer.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.auth.repository import AuditBounds, AuditRepository
from kiln_registry.auth.reserved import refuse_reserved
from kiln_registry.config.settings import KilnConfig, ServerConfig
from kiln_registry.db.legacy import MAX_LEGACY_ROWS, LegacyEntry, insert_legacy_entries
from kiln_registry.db.repository import LegacyImportRepository, TeacherRepository, unit_of_work
from kiln_registry.domain.aliases import alias_problem
from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.domain.text import shown
from kiln_registry.identity.strict_read import (
    DuplicateKeyError,
    FileProblem,
    Problem,
    loads_strict,
    read_regular_file,
)
from kiln_registry.legacy.entries import LEGACY_FIELD, legacy_entry

log = logging.getLogger("kiln_registry.legacy.registry")

MAX_REGISTRY_BYTES: Final = 64 * 1024 * 1024
MAX_ENTRIES: Final = MAX_LEGACY_ROWS
_TMP_SUFFIX: Final = ".kiln-import.tmp"
IMPORT_ACTION: Final = "teacher.import"


@dataclass(frozen=True, slots=True)
class ImportResult:
    """What one import did: aliases added, left alone or deleted since; whether it rewrote."""

    path: Path
    imported: tuple[str, ...]
    already_present: tuple[str, ...]
    stripped_entries: int
    rewritten: bool
    deleted_since_import: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()  # (alias, why): reserved, look-alike, invisible


def _refuse(path: Path, message: str, rule: str) -> InputError:
    return InputError(
        f"legacy registry {path}: {message}; the file was not changed",
        rule=rule,
        hint="fix the file by hand, or remove [server] legacy_registry",
    )


def _read_registry(path: Path) -> tuple[bytes, os.stat_result]:
    """The file's bytes and its stat: a regular file (not a symlink) of bounded size."""

    def refuse(problem: FileProblem) -> InputError:
        if problem.kind in (Problem.SYMLINK, Problem.NOT_REGULAR):
            what = (
                "is a symbolic link" if problem.kind is Problem.SYMLINK else "is not a regular file"
            )
            return _refuse(path, what, "legacy.not_regular")
        if problem.kind is Problem.TOO_LARGE:
            return _refuse(path, f"is larger than {MAX_REGISTRY_BYTES} bytes", "legacy.size")
        if problem.kind is Problem.GREW:
            return _refuse(path, f"grew beyond {MAX_REGISTRY_BYTES} bytes", "legacy.size")
        return _refuse(path, f"cannot open ({problem.detail})", "legacy.open")

    return read_regular_file(path, limit=MAX_REGISTRY_BYTES, refuse=refuse)


def _parse(path: Path, data: bytes) -> dict[str, Any]:
    """Strict JSON: UTF-8, duplicate keys refused at every level, an object at the top."""
    try:
        doc = loads_strict(data)
    except UnicodeDecodeError as exc:
        raise _refuse(path, f"is not UTF-8 (byte {exc.start})", "legacy.encoding") from None
    except DuplicateKeyError as exc:
        raise _refuse(
            path,
            f"key {shown(exc.key)} appears twice in one object (a duplicate alias or field)",
            "legacy.duplicate_key",
        ) from None
    except RecursionError:
        raise _refuse(path, "is nested too deeply", "legacy.json") from None
    except ValueError as exc:  # JSONDecodeError: message and position, never the document
        raise _refuse(path, f"is not valid JSON ({exc})", "legacy.json") from None
    if not isinstance(doc, dict):
        raise _refuse(path, "is not a JSON object of teacher entries", "legacy.not_object")
    if b"\\u" in data and not _all_text_encodable(doc):
        raise _refuse(path, "holds a lone surrogate escape (not UTF-8 text)", "legacy.encoding")
    return doc


def _all_text_encodable(doc: object) -> bool:
    """Every key and string in the parsed document is valid UTF-8 (no lone surrogate)."""
    pending: list[object] = [doc]
    while pending:  # bounded: json.loads already limited the document's size and depth
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
    return True


def _entries(path: Path, doc: Mapping[str, Any]) -> tuple[list[LegacyEntry], int]:
    """Every entry checked; and how many of them carry ``api_key_env``."""
    if len(doc) > MAX_ENTRIES:
        raise _refuse(path, f"has more than {MAX_ENTRIES} entries", "legacy.too_many")
    entries: list[LegacyEntry] = []
    carrying = 0
    for alias, entry in doc.items():
        problem = alias_problem(alias)
        if problem is not None:
            raise _refuse(path, f"alias {shown(alias)}: {problem}", "legacy.alias")
        if not isinstance(entry, dict):
            raise _refuse(path, f"entry {alias!r} is not an object", "legacy.not_object")
        try:
            entries.append(legacy_entry(alias, entry))
        except ValueError as exc:
            raise _refuse(path, f"entry {alias!r}: {exc}", "legacy.entry") from None
        carrying += LEGACY_FIELD in entry
    return entries, carrying


def _stripped_bytes(doc: Mapping[str, Any]) -> bytes:
    """The registry without ``api_key_env``; other fields keep their order."""
    clean = {
        alias: {key: value for key, value in entry.items() if key != LEGACY_FIELD}
        for alias, entry in doc.items()
    }
    text = json.dumps(clean, indent=2, ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8")


def _write_temp(path: Path, data: bytes, original: os.stat_result) -> Path:
    """Write and fsync ``data`` to a new file beside ``path`` with ``path``'s mode and owner."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TMP_SUFFIX, dir=path.parent)
    tmp = Path(name)
    try:
        try:
            if (original.st_uid, original.st_gid) != (os.geteuid(), os.getegid()):
                os.fchown(fd, original.st_uid, original.st_gid)
            os.fchmod(fd, stat.S_IMODE(original.st_mode))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _refuse(
            path, f"cannot write the rewritten copy ({exc.strerror})", "legacy.rewrite"
        ) from None
    return tmp


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns) == (
        b.st_dev,
        b.st_ino,
        b.st_size,
        b.st_mtime_ns,
    )


def _replace(path: Path, tmp: Path, original: os.stat_result) -> None:
    """Rename ``tmp`` over ``path`` unless ``path`` changed since it was read; fsync the dir."""
    try:
        current = os.lstat(path)
    except OSError:
        current = None
    if current is None or not _same_file(current, original):
        raise _refuse(path, "changed while it was being imported; run again", "legacy.changed")
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _refusal(session: Session, server: ServerConfig) -> Callable[[str], str | None]:
    """The registration rules an imported alias obeys: not reserved, no look-alike of a
    registered or reserved alias, no invisible character, within ``max_teachers``."""

    def refusal(alias: str) -> str | None:
        try:
            refuse_reserved(session, alias)
            TeacherRepository(session).check_new_alias(alias, server.max_teachers)
        except KilnError as exc:
            return f"{exc.rule or exc.code}: {exc.message}"
        return None

    return refusal


def _audit(session: Session, server: ServerConfig, imported: list[str]) -> None:
    """One audit row per alias the import added (``teacher.import``, no token)."""
    bounds = AuditBounds(max_events=server.audit_max_events, retain_days=server.audit_retain_days)
    audit = AuditRepository(session, bounds)
    for alias in imported:
        audit.record(token_name=None, action=IMPORT_ACTION, target=alias, outcome="ok")


def import_legacy_registry(
    path: Path,
    sessions: sessionmaker[Session],
    on_progress: Callable[[int, int], None] | None = None,
    server: ServerConfig | None = None,
) -> ImportResult:
    """Import ``path`` into the registry database; ``on_progress(entries done, total)``.

    Each new alias obeys the registration rules of ``server`` (default settings
    when not given) and is written to the audit log in the same transaction.
    """
    server = server or ServerConfig()
    data, original = _read_registry(path)
    doc = _parse(path, data)
    entries, carrying = _entries(path, doc)
    tmp = _write_temp(path, _stripped_bytes(doc), original) if carrying else None
    try:
        with unit_of_work(sessions) as session:
            imported, present, deleted, refused = insert_legacy_entries(
                session, entries, str(path), on_progress, _refusal(session, server)
            )
            _audit(session, server, imported)
        if tmp is not None:
            _replace(path, tmp, original)
            tmp = None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    result = ImportResult(
        path, tuple(imported), tuple(present), carrying, carrying > 0, tuple(deleted),
        tuple(refused),
    )  # fmt: skip
    log.info("%s", _summary(result))
    for alias, why in refused:
        log.warning("legacy registry %s: alias %r not imported (%s)", path, alias, why)
    return result


def _summary(result: ImportResult) -> str:
    carrying = result.stripped_entries
    return (
        f"legacy registry {result.path}: imported {len(result.imported)} teacher(s),"
        f" {len(result.already_present)} already present,"
        f" {len(result.deleted_since_import)} deleted since an earlier import (not imported"
        f" again), {len(result.refused)} refused by the registration rules;"
        f" api_key_env removed from {carrying} entr{'y' if carrying == 1 else 'ies'}"
        + (" and the file rewritten" if carrying else "")
    )


def _record(sessions: sessionmaker[Session], path: Path, error: KilnError | None) -> None:
    with unit_of_work(sessions) as session:
        repo = LegacyImportRepository(session)
        if error is None:
            repo.set_status(str(path), "imported", None, "imported")
        else:
            repo.set_status(str(path), "refused", error.rule, error.message)


def import_configured_legacy_registry(
    config: KilnConfig, sessions: sessionmaker[Session]
) -> ImportResult | None:
    """Run the import for ``[server] legacy_registry`` at server start-up.

    A broken file does not stop the server: the refusal is logged (its
    message names the file and the rule, never a value of ``api_key_env``),
    nothing is imported, the file is left as it was, and the outcome is
    recorded for ``GET /ready``.  Without the setting any earlier outcome is
    cleared.
    """
    path = config.server.legacy_registry
    if path is None:
        with unit_of_work(sessions) as session:
            LegacyImportRepository(session).clear_status()
        return None
    try:
        result = import_legacy_registry(path, sessions, server=config.server)
    except KilnError as exc:
        log.error("legacy registry not imported (%s): %s", exc.rule, exc.message)
        _record(sessions, path, exc)
        return None
    _record(sessions, path, None)
    return result
