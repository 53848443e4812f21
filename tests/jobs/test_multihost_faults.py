"""Several workers on one database under faults (issue 33): real `kiln worker` processes.

Each test runs on the active backend (SQLite in the main pass, a real PostgreSQL in
the PostgreSQL pass of scripts/check.sh), with a worker-less `kiln serve`, a
reference-protocol teacher on loopback and short leases (heartbeat 0.2 s, timeout
1 s):

* a worker frozen (SIGSTOP) after sealing its corpus and before publishing it, until
  its lease is taken over: the other worker's corpus is the job's result, exactly
  once, and the first, resumed (SIGCONT), publishes nothing and says so;
* a worker frozen mid-job past its lease stops at its next fenced write and says so
  in its log; the job finishes elsewhere with a valid corpus;
* three workers sweeping the same expired jobs at once delete each row and file
  exactly once, log no error, and touch no file of a live job.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.loader import load_config
from kiln_registry.db.opening import ensure_schema, open_database
from kiln_registry.db.postgres import BEGIN_OPTION, WRITE_LOCK_KEY
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.jobs import restart_harness as rh
from tests.jobs import worker_harness as wh
from tests.jobs.harness import Controlled, student_identity
from tests.jobs.test_retention import _job as finished_job
from tests.pg_server import active_server, database_settings
from tests.probe.teacher_server import TeacherServer

SEQUENCES = [[i % 500 + 1, (i * 7) % 500 + 1, 3] for i in range(40)]
JOB_S = 120.0

# Instrumentation, not a stand-in: the worker runs unchanged, but its publication step
# first announces itself (``<marker>``) and waits for ``<marker>.go``: the one moment no
# outside observer can see, after its corpus is sealed and before the transaction that
# would publish it.  The test freezes it there with a real SIGSTOP, and resumes it.
PAUSE_BEFORE_PUBLISH = """
import sys, time
from pathlib import Path
from kiln_registry.jobs.core import ordered_pipeline
marker = Path(sys.argv[1])
publish = ordered_pipeline.OrderedPipeline._succeed
def paused(self, writer, sha, size):
    if not marker.exists():
        marker.write_text("sealed")
        while not marker.with_suffix(".go").exists():
            time.sleep(0.05)
    return publish(self, writer, sha, size)
ordered_pipeline.OrderedPipeline._succeed = paused
from kiln_registry.cli.main import run
sys.exit(run(["worker", "--config", sys.argv[2]]))
"""


def _write_lock_free(db: sessionmaker[Session]) -> bool:
    """Whether no process holds the registry's write lock right now."""
    engine: Engine = db.kw["bind"]
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(**{BEGIN_OPTION: "DEFERRED"}) as conn:
            lock = text(f"SELECT pg_try_advisory_xact_lock({WRITE_LOCK_KEY})")
            free = bool(conn.execute(lock).scalar_one())
            conn.rollback()
            return free
    probe = sqlite3.connect(str(engine.url.database), timeout=0.2, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def _freeze(proc: subprocess.Popen[bytes], db: sessionmaker[Session]) -> None:
    """SIGSTOP ``proc`` at a moment it holds no write transaction.

    A process frozen inside a write transaction stops every writer: SQLite cannot break
    its lock, and PostgreSQL ends such a session only after
    ``idle_in_transaction_session_timeout`` (20 s).  That fault is real but not this test's.
    """
    for _ in range(100):
        proc.send_signal(signal.SIGSTOP)
        if _write_lock_free(db):
            return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("the worker always held the write lock")


def _server_keys(directory: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    keys = database_settings(directory)
    server = active_server()
    if server is not None:  # the per-test isolation cleared the password variable
        monkeypatch.setenv(server.password_env, server.password)
    return keys


def _popen(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(argv, stdout=sink, stderr=sink,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


def _resume_and_stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
    return rh.stop(proc)


@pytest.fixture
def registry(
    tmp_path: Path, tiny_model: TinyModel, student_vocab_sha256: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Path, str, int]]:  # fmt: skip
    """A worker-less `kiln serve` and a slow teacher: (config, registry URL, teacher port)."""
    port = free_port()
    config = wh.worker_config(tmp_path, port, tiny_model.path, _server_keys(tmp_path, monkeypatch))
    teacher = Controlled(student_identity(student_vocab_sha256), delay_s=0.03)
    with TeacherServer(teacher) as srv, rh.kiln_serve(config, tmp_path / "serve.log", port):
        yield config, f"http://127.0.0.1:{port}", srv.port


def _check_result(url: str, db: sessionmaker[Session], job_id: str, tmp_path: Path) -> JobRow:
    """The published corpus verifies, and its bytes are the ones the row records."""
    row = wh.job_row(db, job_id)
    assert row.status == "succeeded" and row.result_path is not None, row.error_message
    data = Path(row.result_path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == row.result_sha256 and len(data) == row.result_bytes
    result, keys = rh.result_and_keys(url, job_id)
    assert result.content == data
    copy = tmp_path / "downloaded.jsonl"
    copy.write_bytes(data)
    assert verify_corpus(copy, keys).sequences == len(SEQUENCES)
    return row


@pytest.mark.slow
def test_a_worker_frozen_before_publishing_never_replaces_the_new_holders_corpus(
    registry: tuple[Path, str, int], tmp_path: Path
) -> None:
    config, url, teacher_port = registry
    marker, results = tmp_path / "sealed.txt", tmp_path / "results"
    argv = [sys.executable, "-c", PAUSE_BEFORE_PUBLISH, str(marker), str(config)]
    started = time.monotonic()
    with wh.sessions(config) as db:
        job_id = rh.submit_scoring(url, teacher_port, SEQUENCES)
        first = _popen(argv, tmp_path / "first.log")
        second: subprocess.Popen[bytes] | None = None
        try:
            wh.wait_for(marker.exists, JOB_S, "the first worker to seal its corpus")
            _freeze(first, db)
            marker.with_suffix(".go").write_text("go")  # seen once it is resumed
            assert list(results.glob(f".{job_id}.jsonl.*.partial"))  # sealed, not published
            assert not (results / f"{job_id}.jsonl").exists()
            second = wh.start_worker(config, tmp_path / "second.log")
            rh.wait_finished(url, job_id, timeout_s=JOB_S)
            elapsed = time.monotonic() - started
            won = _check_result(url, db, job_id, tmp_path)
            winner_bytes = Path(str(won.result_path)).read_bytes()
            first.send_signal(signal.SIGCONT)
            log = tmp_path / "first.log"
            wh.wait_for(lambda: " lost" in log.read_text(), JOB_S, "the first to stop")
            time.sleep(5 * wh.HEARTBEAT_S)
            after = wh.job_row(db, job_id)
            assert first.poll() is None  # it lives on; only that job stopped
        finally:
            statuses = [_resume_and_stop(p) for p in (first, second) if p is not None]
    assert statuses == [0, 0]
    assert Path(str(after.result_path)).read_bytes() == winner_bytes
    fields = ("status", "result_sha256", "result_bytes", "updated_at", "attempts", "claim_token")
    assert [getattr(won, f) for f in fields] == [getattr(after, f) for f in fields]
    assert after.attempts == 2 and after.lease_owner is None
    assert sorted(p.name for p in results.iterdir()) == [f"{job_id}.jsonl"]  # no partial left
    print(f"frozen-before-publish job: {elapsed:.1f} s to the second worker's result")


@pytest.mark.slow
def test_a_worker_frozen_past_its_lease_stops_at_its_next_fenced_write(
    registry: tuple[Path, str, int], tmp_path: Path
) -> None:
    config, url, teacher_port = registry
    with wh.sessions(config) as db:
        job_id = rh.submit_scoring(url, teacher_port, SEQUENCES)
        workers = [wh.start_worker(config, tmp_path / f"worker-{n}.log") for n in range(2)]
        try:
            rh.wait_progress(url, job_id, 5, timeout_s=JOB_S)
            holder = next(p for p in workers if p.pid == wh.holder_pid(db, job_id))
            _freeze(holder, db)
            job = rh.wait_finished(url, job_id, timeout_s=JOB_S)
            done = _check_result(url, db, job_id, tmp_path)
            holder.send_signal(signal.SIGCONT)
            log = tmp_path / f"worker-{workers.index(holder)}.log"
            wh.wait_for(lambda: " lost" in log.read_text(), JOB_S, "the frozen to notice")
            time.sleep(5 * wh.HEARTBEAT_S)
            after = wh.job_row(db, job_id)
            assert holder.poll() is None
        finally:
            statuses = [_resume_and_stop(p) for p in workers]
    assert statuses == [0, 0]
    assert job["status"] == "succeeded" and job["attempts"] == 2, job
    fields = ("status", "result_sha256", "updated_at", "scored_count", "cache_hits")
    assert [getattr(done, f) for f in fields] == [getattr(after, f) for f in fields]
    assert not list((tmp_path / "results").glob(".*"))


@pytest.mark.slow
def test_three_workers_sweeping_the_same_expired_jobs_delete_each_once(
    tmp_path: Path, tiny_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = _server_keys(tmp_path, monkeypatch)
    config = wh.worker_config(tmp_path, free_port(), tiny_model.path, keys, retain_days=1)
    engine = open_database(load_config(config).server)
    try:
        ensure_schema(engine, upgrade=False)  # empty: created at head
    finally:
        engine.dispose()
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    expired = [f"job-{i:024x}" for i in range(150)]
    live = [f"job-{i:024x}" for i in range(150, 153)]
    with wh.sessions(config) as db:
        with unit_of_work(db) as session:
            for job_id in expired + live:
                path = results / f"{job_id}.jsonl"
                path.write_bytes(job_id.encode())
                days = 3.0 if job_id in expired else 0.1
                row = finished_job(job_id, "succeeded", days, path)
                JobRepository(session).insert(row, [])
        logs = [tmp_path / f"worker-{n}.log" for n in range(3)]
        workers = [wh.start_worker(config, log) for log in logs]
        try:
            wh.wait_for(lambda: _ids(db) == set(live), JOB_S, "the sweeps")
        finally:
            statuses = [rh.stop(p) for p in workers]
    assert statuses == [0, 0, 0]
    assert sorted(p.name for p in results.iterdir()) == sorted(f"{j}.jsonl" for j in live)
    assert all((results / f"{j}.jsonl").read_bytes() == j.encode() for j in live)
    text = "\n".join(log.read_text() for log in logs)
    assert "not deleted" not in text and "ERROR" not in text and "Traceback" not in text, text
    assert text.count("retention: deleted") >= 1


def _ids(db: sessionmaker[Session]) -> set[str]:
    with unit_of_work(db) as session:
        return set(session.scalars(select(JobRow.id)))
