"""A coherent cache of rendered ``TeacherEntry`` bodies for ``GET /v1/teachers/{alias}``.

Lookups are the registry's hot path (Kiln resolves an alias before every
job), and a full read transaction plus re-rendering costs several times the
HTTP handling.  The cache keeps the rendered JSON bytes per alias and stays
coherent with the database itself through ``db.data_version``: SQLite's
``PRAGMA data_version`` on a dedicated read-only connection, or on
PostgreSQL the trigger-maintained ``kiln_data_version`` row, moves whenever
ANY other connection (this process's writers, the job worker, another
process, another registry replica) commits.  Any change empties the cache,
and an entry is stored only if no commit happened since the version was read
before its row was loaded, so a reader never sees a deleted alias or an old
status.

The version read never waits for a writer (a PRAGMA on an idle WAL reader;
one autocommit SELECT on PostgreSQL).  Bounded: at most ``MAX_ENTRIES``
aliases, then the cache is emptied.  Imports the standard library and
``db.data_version``.
"""

from __future__ import annotations

import threading

from kiln_registry.db.data_version import VersionReader, VersionUnreadable

MAX_ENTRIES = 4096


class EntryCache:
    """Rendered entries keyed by alias, invalidated by the database's data_version."""

    def __init__(self, reader: VersionReader) -> None:
        self._reader = reader
        self._lock = threading.Lock()
        self._version: int | None = None
        self._entries: dict[str, bytes] = {}
        # Per-read checks stored with each body (teachers.live_status.ReadChecks); a body
        # served from here is only published after its checks pass.
        self._checks: dict[str, object] = {}

    def version(self) -> int | None:
        """The current data_version (None if unreadable); empties the cache if it moved."""
        with self._lock:
            try:
                current = self._reader.read()
            except VersionUnreadable:
                current = None
            if current is None or current != self._version:
                self._entries.clear()
                self._checks.clear()
                self._version = current
            return current

    def get(self, alias: str) -> bytes | None:
        self.version()
        with self._lock:
            return self._entries.get(alias)

    def get_checked(self, alias: str) -> tuple[bytes, object] | None:
        """The cached body of ``alias`` with the checks stored beside it, or None."""
        self.version()
        with self._lock:
            body = self._entries.get(alias)
            checks = self._checks.get(alias)
            return None if body is None or checks is None else (body, checks)

    def put(self, alias: str, body: bytes, seen_version: int | None, checks: object = None) -> None:
        """Store ``body`` (and its per-read ``checks``) if nothing was committed since
        ``seen_version`` was read."""
        with self._lock:
            if seen_version is None or seen_version != self._version:
                return
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
                self._checks.clear()
            self._entries[alias] = body
            if checks is not None:
                self._checks[alias] = checks

    def close(self) -> None:
        with self._lock:
            self._reader.close()
            self._entries.clear()
            self._checks.clear()
