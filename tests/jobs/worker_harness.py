"""What the worker-process tests share: `kiln worker` subprocesses and direct database reads.

``worker_config`` writes a kiln.toml for one registry (``[server]`` keys from
the caller: a SQLite path, or a PostgreSQL URL with its password variable and
state directory), with ``kiln serve``'s embedded workers off and short lease
timings (heartbeat 0.2 s, timeout 1 s) so a killed holder's job is taken over
quickly.  ``kiln_worker`` runs ``kiln worker`` as a subprocess; ``sessions``
opens the same database in the test process (through the project's own
opening code, so it works on both backends); ``copy_job`` copies one job, its
sequences and its teacher's entry into another registry's database, for a
reference run of the very same job (same id, so the same bytes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.loader import load_config
from kiln_registry.db.engine import session_factory
from kiln_registry.db.models import Base, TeacherRow
from kiln_registry.db.opening import open_database
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.models import JobRow, JobSequenceRow
from tests.jobs.restart_harness import stop

HEARTBEAT_S = 0.2
TIMEOUT_S = 1.0
LONG_AGO = "2000-01-01T00:00:00.000000Z"


def worker_config(
    directory: Path, port: int, model_path: Path, server: Mapping[str, str], **jobs: object
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    server_lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in server.items())
    job_lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in jobs.items())
    config = directory / "kiln.toml"
    config.write_text(
        f"[server]\nport = {port}\n{server_lines}"
        f"[student]\nmodel_path = {json.dumps(str(model_path))}\n"
        f"[jobs]\nconcurrency = 1\nresult_root = {json.dumps(str(directory / 'results'))}\n"
        f"embedded_workers = false\nlease_heartbeat_s = {HEARTBEAT_S}\n"
        f"lease_timeout_s = {TIMEOUT_S}\n{job_lines}",
        encoding="utf-8",
    )
    return config


def start_worker(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "kiln_registry.cli.main", "worker", "--config", str(config)],
            stdout=sink, stderr=sink, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip


@contextmanager
def kiln_worker(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`kiln worker` as a subprocess, stopped with SIGTERM at the end."""
    proc = start_worker(config, log)
    try:
        yield proc
    finally:
        stop(proc)


@contextmanager
def sessions(config: Path) -> Iterator[sessionmaker[Session]]:
    """The registry's database, opened in the test process (never created or migrated)."""
    engine = open_database(load_config(config).server, create=False)
    try:
        yield session_factory(engine)
    finally:
        engine.dispose()


def job_row(db: sessionmaker[Session], job_id: str) -> JobRow:
    with unit_of_work(db) as session:
        row = session.get(JobRow, job_id)
        assert row is not None, job_id
        session.expunge(row)
        return row


def holder_pid(db: sessionmaker[Session], job_id: str) -> int | None:
    """The pid in the job's ``lease_owner`` (``host:pid:random``), None while unheld."""
    owner = job_row(db, job_id).lease_owner
    return None if owner is None else int(owner.split(":")[1])


def wait_for(check: object, timeout_s: float, what: str) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def expire_lease(session: Session, job_id: str) -> None:
    """Within the caller's transaction: the job's lease ran out long ago."""
    session.execute(update(JobRow).where(JobRow.id == job_id).values(lease_expires_at=LONG_AGO))


def copy_job(source: sessionmaker[Session], target: sessionmaker[Session], job_id: str) -> None:
    """Copy a queued job, its sequences and its teacher's entry into another registry."""
    tables = tuple(Base.metadata.tables[name] for name in ("teachers", "jobs", "job_sequences"))
    with unit_of_work(source) as session:
        alias = job_row(source, job_id).teacher_alias
        wheres = (TeacherRow.alias == alias, JobRow.id == job_id, JobSequenceRow.job_id == job_id)
        rows = [
            [dict(r._mapping) for r in session.execute(select(t).where(w))]
            for t, w in zip(tables, wheres, strict=True)
        ]
    with unit_of_work(target) as session:
        for table, values in zip(tables, rows, strict=True):
            assert values, table.name
            session.execute(insert(table), values)
