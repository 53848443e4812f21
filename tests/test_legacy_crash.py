"""Crash safety of both legacy migrations: SIGKILL a real subprocess at injected points.

A harness script (written to tmp_path below) runs the SQLite conversion
(``upgrade_to_head``) or the ``teachers.json`` import and freezes at one
point named by ``LEGACY_CRASH_POINT``; the test waits for its marker file and
kills it with SIGKILL.  Only the harness reads that variable; the product has
no crash hooks.  The harness freezes at a statement through SQLite's trace
callback, or at a file-system step by wrapping ``os.write``/``os.fsync``/
``os.replace`` in its own process: those wrappers only add the freeze, the
real call still does the work.

Afterwards the database holds either the intact legacy registry or the fully
migrated one, never a mix; the registry file is the old bytes or the fully
rewritten bytes; and running the migration again (in this process) completes
it and leaves the planted value nowhere.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.db.engine import head_revision, open_engine, session_factory, upgrade_to_head
from kiln_registry.db.legacy import LEGACY_STATUS_MESSAGE
from kiln_registry.legacy.registry import import_legacy_registry

REPO_ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-crash-PLANTED-0b7d2e19c4"
WAIT_S = 60.0
LEGACY_DDL = (
    "CREATE TABLE teachers (alias TEXT PRIMARY KEY, kind TEXT NOT NULL, provider TEXT, "
    "model_id TEXT, url TEXT, api_key_env TEXT, notes TEXT, spec_json TEXT NOT NULL, "
    "created_at TEXT NOT NULL)"
)
LEGACY_ROWS = [
    (f"t{i:03d}", "remote", "vllm", f"org/m{i}", "https://t.example/v1", SECRET, "n" * 200,
     json.dumps({"api_key_env": SECRET, "max_top_k": 20}), "2024-01-01T00:00:00Z")
    for i in range(300)
]  # fmt: skip
REGISTRY = {
    f"t{i:03d}": {"alias": f"t{i:03d}", "kind": "remote", "provider": "vllm",
                  "model_id": f"org/m{i}", "url": "https://t.example/v1",
                  "api_key_env": SECRET, "notes": "n" * 200}
    for i in range(300)
}  # fmt: skip

# Both legacy migrations are killed inside SQLite statements (the harness freezes through
# SQLite's trace callback) or around the SQLite file's rewrite; the teachers.json import
# into PostgreSQL is covered by tests/test_legacy_registry.py.
pytestmark = pytest.mark.sqlite_only(reason="SIGKILL inside SQLite statements and file rewrites")

HARNESS = '''\
"""Crash harness for tests/test_legacy_crash.py: run one migration, freeze at a point."""
import os
import sys
import time
from pathlib import Path

from sqlalchemy import event

from kiln_registry.db.engine import open_engine, session_factory, upgrade_to_head
from kiln_registry.legacy.registry import import_legacy_registry

POINT = os.environ["LEGACY_CRASH_POINT"]
MARKER = Path(os.environ["LEGACY_CRASH_MARKER"])
STATEMENTS = {
    "sqlite:before_stamp": "INSERT INTO alembic_version",
    "sqlite:before_copy": "INSERT INTO teachers",
    "sqlite:before_drop": "DROP TABLE _kiln_legacy_teachers",
    "sqlite:before_commit": "COMMIT",
    "sqlite:before_vacuum": "VACUUM",
    "sqlite:before_checkpoint": "PRAGMA wal_checkpoint",
    "json:before_commit": "COMMIT",
}


def report(text):
    # Written aside and renamed (os.rename is never wrapped): the test never reads half a marker.
    part = MARKER.with_name(MARKER.name + ".part")
    part.write_text(text)
    os.rename(part, MARKER)


def freeze():
    report(POINT)
    time.sleep(300)  # SIGKILLed here
    os._exit(3)


def trace_statements(engine, prefix):
    def on_connect(dbapi, _record):
        dbapi.set_trace_callback(
            lambda statement: freeze() if statement.strip().startswith(prefix) else None
        )

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # open_engine's first connection has no trace: start afresh


def wrap_os(name, freeze_at_call, after=False):
    real = getattr(os, name)
    calls = [0]

    def wrapper(*args):
        calls[0] += 1
        hit = freeze_at_call(calls[0])
        if hit and not after:
            freeze()
        result = real(*args)
        if hit and after:
            freeze()
        return result

    setattr(os, name, wrapper)


def half_write(real_write):
    def wrapper(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        freeze()

    return wrapper


def main():
    mode, database, registry = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    engine = open_engine(database)
    if POINT in STATEMENTS:
        trace_statements(engine, STATEMENTS[POINT])
    elif POINT == "json:mid_temp_write":
        os.write = half_write(os.write)
    elif POINT == "json:before_temp_fsync":
        wrap_os("fsync", lambda n: n == 1)
    elif POINT == "json:before_rename":
        wrap_os("replace", lambda n: True)
    elif POINT == "json:after_rename":
        wrap_os("replace", lambda n: True, after=True)
    if mode == "sqlite":
        upgrade_to_head(engine)
    else:
        import_legacy_registry(registry, session_factory(engine))
    engine.dispose()
    report("finished")


main()
'''


def _run_until_frozen(tmp_path: Path, mode: str, point: str, registry: Path) -> None:
    """Start the harness, wait until it reports ``point``, SIGKILL it."""
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS, encoding="utf-8")
    marker = tmp_path / "marker"
    env = {**os.environ, "LEGACY_CRASH_POINT": point, "LEGACY_CRASH_MARKER": str(marker)}
    argv = [sys.executable, str(harness), mode, str(tmp_path / "registry.db"), str(registry)]
    proc = subprocess.Popen(
        argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not marker.exists():
            if proc.poll() is not None:
                output = proc.stdout.read().decode() if proc.stdout else ""
                pytest.fail(f"harness exited {proc.returncode} before {point}: {output}")
            if time.monotonic() > deadline:
                pytest.fail(f"harness never reached {point}")
            time.sleep(0.02)
        assert marker.read_text() == point
    finally:
        proc.kill()  # SIGKILL: no cleanup handlers, no rollback, no atexit
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


def _legacy_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(LEGACY_DDL)
        conn.execute("BEGIN")  # one transaction: one fsync, not one per row
        conn.executemany("INSERT INTO teachers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", LEGACY_ROWS)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _read(path: Path, sql: str) -> list[Any]:
    conn = sqlite3.connect(path, isolation_level=None, timeout=5)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _database_state(path: Path) -> str:
    """``legacy`` (exactly the original rows) or ``migrated`` (exactly the converted ones)."""
    tables = {row[0] for row in _read(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    if "alembic_version" not in tables:
        assert tables == {"teachers"}
        assert _read(path, "SELECT * FROM teachers ORDER BY alias") == LEGACY_ROWS
        return "legacy"
    assert _read(path, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    assert "_kiln_legacy_teachers" not in tables
    rows = _read(
        path, "SELECT alias, model_id, status, status_message, identity_json FROM teachers"
    )
    expected = [(r[0], r[3], "legacy_unverified", LEGACY_STATUS_MESSAGE, None) for r in LEGACY_ROWS]
    assert sorted(rows) == expected
    return "migrated"


def _no_secret_anywhere(directory: Path) -> None:
    for file in directory.iterdir():
        if file.is_file() and file.name != "harness.py":
            assert SECRET.encode() not in file.read_bytes(), file.name


@pytest.mark.parametrize(
    ("point", "expected"),
    [
        ("sqlite:before_stamp", "legacy"),
        ("sqlite:before_copy", "legacy"),
        ("sqlite:before_drop", "legacy"),
        ("sqlite:before_commit", "legacy"),
        ("sqlite:before_vacuum", "migrated"),
        ("sqlite:before_checkpoint", "migrated"),
    ],
)
def test_sqlite_conversion_killed_midway(tmp_path: Path, point: str, expected: str) -> None:
    database = tmp_path / "registry.db"
    _legacy_db(database)
    _run_until_frozen(tmp_path, "sqlite", point, tmp_path / "unused.json")
    assert _database_state(database) == expected
    engine = open_engine(database)
    try:
        assert upgrade_to_head(engine) == head_revision()
    finally:
        engine.dispose()
    assert _database_state(database) == "migrated"
    _no_secret_anywhere(tmp_path)


def _stripped() -> bytes:
    clean = {a: {k: v for k, v in e.items() if k != "api_key_env"} for a, e in REGISTRY.items()}
    return (json.dumps(clean, indent=2, ensure_ascii=False) + "\n").encode()


@pytest.mark.parametrize(
    ("point", "file_state", "rows"),
    [
        ("json:mid_temp_write", "old", 0),
        ("json:before_temp_fsync", "old", 0),
        ("json:before_commit", "old", 0),
        ("json:before_rename", "old", len(REGISTRY)),
        ("json:after_rename", "new", len(REGISTRY)),
    ],
)
def test_json_import_killed_midway(tmp_path: Path, point: str, file_state: str, rows: int) -> None:
    engine = open_engine(tmp_path / "registry.db")
    upgrade_to_head(engine)
    registry = tmp_path / "teachers.json"
    registry.write_text(json.dumps(REGISTRY), encoding="utf-8")
    registry.chmod(0o600)
    original = registry.read_bytes()
    try:
        _run_until_frozen(tmp_path, "json", point, registry)
        assert registry.read_bytes() == (original if file_state == "old" else _stripped())
        count = _read(tmp_path / "registry.db", "SELECT COUNT(*) FROM teachers")[0][0]
        assert count == rows  # one transaction: none or all
        result = import_legacy_registry(registry, session_factory(engine))
    finally:
        engine.dispose()
    assert len(result.imported) == len(REGISTRY) - rows
    assert registry.read_bytes() == _stripped() and (registry.stat().st_mode & 0o777) == 0o600
    statuses = _read(tmp_path / "registry.db", "SELECT DISTINCT status FROM teachers")
    assert statuses == [("legacy_unverified",)]
    assert _read(tmp_path / "registry.db", "SELECT COUNT(*) FROM teachers") == [(len(REGISTRY),)]
    _no_secret_anywhere(tmp_path)
