"""`kiln worker` processes sharing one database with a worker-less `kiln serve` (issue 17).

Real processes throughout: `kiln serve` with ``embedded_workers = false``,
two `kiln worker` subprocesses and a slow reference-protocol teacher on
loopback.  The worker holding a job is killed with SIGKILL mid-job; the other
takes the job over once the lease runs out and finishes it, and the corpus is
byte-identical to a single-worker run of the same job (copied, same id, into
a second registry).  A worker whose lease is taken over stops writing.  `kiln
worker` never migrates: a database behind head is refused.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.loader import load_config
from kiln_registry.db.engine import open_engine
from kiln_registry.db.opening import ensure_schema, open_database
from kiln_registry.db.repository import unit_of_work
from kiln_registry.domain.errors import ConfigError
from kiln_registry.jobs.core.models import ScoreCacheRow
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.core.signing import key_path
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.testing.tiny_models import TinyModel
from tests.db.test_migration_0005 import _alembic
from tests.helpers import free_port
from tests.jobs import restart_harness as rh
from tests.jobs import worker_harness as wh
from tests.jobs.harness import Controlled, student_identity
from tests.probe.teacher_server import TeacherServer

SEQUENCES = [[i % 500 + 1, (i * 7) % 500 + 1, 3] for i in range(60)]
JOB_S = 120.0


def _server_keys(backend: str, directory: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    if backend == "sqlite":
        return {"database": str(directory / "registry.db")}
    server = request.getfixturevalue("postgres_server")
    url: str = request.getfixturevalue("pg_database")
    # The per-test isolation cleared KILN_* before this fixture was asked for: set it again.
    request.getfixturevalue("monkeypatch").setenv(server.password_env, server.password)
    return {"database": url, "database_password_env": server.password_env,
            "state_dir": str(directory)}  # fmt: skip


def _reference_registry(
    directory: Path, model: Path, source: sessionmaker[Session], job: str
) -> Path:
    """A second (SQLite) registry holding a copy of the queued job, for a single-worker run."""
    config = wh.worker_config(directory, free_port(), model, {"database": str(directory / "r.db")})
    engine = open_database(load_config(config).server)
    try:
        ensure_schema(engine, upgrade=False)  # empty: created at head
    finally:
        engine.dispose()
    with wh.sessions(config) as target:
        wh.copy_job(source, target, job)
    return config


def _single_worker_result(config: Path, key: Path, job_id: str) -> bytes:
    """Run the copied job with one `kiln worker` (same signing key) and read its corpus."""
    copy = key_path(load_config(config).server.state_path)
    shutil.copyfile(key, copy)
    copy.chmod(0o600)  # the registry refuses a key others can read
    with wh.sessions(config) as db, wh.kiln_worker(config, config.parent / "worker.log"):
        wh.wait_for(lambda: wh.job_row(db, job_id).status in ("succeeded", "failed"), JOB_S,
                    "the reference run")  # fmt: skip
        row = wh.job_row(db, job_id)
    assert row.status == "succeeded" and row.result_path is not None, row.error_message
    return Path(row.result_path).read_bytes()


def _cache_rows(db: sessionmaker[Session]) -> tuple[int, int]:
    with unit_of_work(db) as session:
        total = session.scalar(select(func.count()).select_from(ScoreCacheRow))
        unique = session.scalar(select(func.count(distinct(ScoreCacheRow.token_sha256))))
    return int(total or 0), int(unique or 0)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_killed_workers_job_is_taken_over_and_matches_a_single_worker_run(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, tiny_model: TinyModel,
    student_vocab_sha256: str,
) -> None:  # fmt: skip
    port, main = free_port(), tmp_path / "main"
    config = wh.worker_config(main, port, tiny_model.path, _server_keys(backend, main, request))
    url = f"http://127.0.0.1:{port}"
    teacher = Controlled(student_identity(student_vocab_sha256), delay_s=0.05)
    with TeacherServer(teacher) as srv, rh.kiln_serve(config, main / "serve.log", port):
        job_id = rh.submit_scoring(url, srv.port, SEQUENCES)
        with wh.sessions(config) as db:
            reference = _reference_registry(tmp_path / "ref", tiny_model.path, db, job_id)
            workers = [wh.start_worker(config, main / f"worker-{n}.log") for n in range(2)]
            try:
                rh.wait_progress(url, job_id, 5, timeout_s=JOB_S)
                victim = next(p for p in workers if p.pid == wh.holder_pid(db, job_id))
                rh.kill(victim)
                job = rh.wait_finished(url, job_id, timeout_s=JOB_S)
                result, keys = rh.result_and_keys(url, job_id)
                assert wh.job_row(db, job_id).lease_owner is None
                cache = _cache_rows(db)
            finally:
                statuses = [rh.stop(p) for p in workers]
        key = key_path(load_config(config).server.state_path)
        expected = _single_worker_result(reference, key, job_id)
    assert job["status"] == "succeeded" and job["attempts"] == 2, job
    assert job["progress"]["cache_hits"] >= 5  # the survivor resumed from committed scores
    assert sorted(statuses) == [-9, 0]  # the victim was killed; the survivor stopped cleanly
    assert result.content == expected
    assert cache == (len(SEQUENCES), len(SEQUENCES))  # no sequence cached twice
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(result.content)
    assert verify_corpus(corpus, keys).sequences == len(SEQUENCES)
    assert not list((main / "results").glob(".*.partial"))


def _steal(db: sessionmaker[Session], job_id: str) -> None:
    """What another worker does to an expired lease: requeue the job, then claim it."""
    with unit_of_work(db) as session:
        wh.expire_lease(session, job_id)
        repo = JobRepository(session)
        assert repo.requeue_expired() == [job_id]
        stolen = repo.claim_next("thief-token", owner="thief:0:0", timeout_s=3600)
        assert stolen is not None and stolen.id == job_id


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_worker_whose_lease_was_taken_over_writes_nothing_more(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, tiny_model: TinyModel,
    student_vocab_sha256: str,
) -> None:  # fmt: skip
    port = free_port()
    keys = _server_keys(backend, tmp_path, request)
    config = wh.worker_config(tmp_path, port, tiny_model.path, keys)
    url, log = f"http://127.0.0.1:{port}", tmp_path / "worker.log"
    teacher = Controlled(student_identity(student_vocab_sha256), delay_s=0.05)
    with TeacherServer(teacher) as srv, rh.kiln_serve(config, tmp_path / "serve.log", port):
        job_id = rh.submit_scoring(url, srv.port, SEQUENCES)
        with wh.sessions(config) as db, wh.kiln_worker(config, log) as worker:
            rh.wait_progress(url, job_id, 5, timeout_s=JOB_S)
            _steal(db, job_id)
            wh.wait_for(lambda: "lost" in log.read_text(), JOB_S, "the worker to notice")
            before = wh.job_row(db, job_id)
            time.sleep(5 * wh.HEARTBEAT_S)  # several heartbeats and flushes would have passed
            after = wh.job_row(db, job_id)
            assert worker.poll() is None  # the worker lives on; only that job stopped
            published = list((tmp_path / "results").glob("*.jsonl"))
            with unit_of_work(db) as session:  # the thief gives the job back
                assert JobRepository(session).release_claim(job_id, "thief-token")
            job = rh.wait_finished(url, job_id, timeout_s=JOB_S)
    fields = ("status", "claim_token", "lease_owner", "lease_expires_at", "scored_count",
              "cache_hits", "requests_sent", "updated_at", "device")  # fmt: skip
    assert [getattr(before, f) for f in fields] == [getattr(after, f) for f in fields]
    assert (after.claim_token, after.lease_owner) == ("thief-token", "thief:0:0")
    assert published == []
    assert job["status"] == "succeeded" and job["attempts"] == 3, job


def test_kiln_worker_refuses_a_database_behind_head(tmp_path: Path, tiny_model: TinyModel) -> None:
    database = tmp_path / "registry.db"
    config = wh.worker_config(tmp_path, free_port(), tiny_model.path, {"database": str(database)})
    missing = _kiln_worker(config)
    assert missing.returncode == 2 and "does not exist" in missing.stderr, missing.stderr
    engine = open_engine(database)
    try:
        _alembic(engine, "upgrade", "0005_off_policy_generation")
    finally:
        engine.dispose()
    behind = _kiln_worker(config)
    assert behind.returncode == 2, behind.stderr
    assert "0005_off_policy_generation" in behind.stderr and "kiln db upgrade" in behind.stderr


def _kiln_worker(config: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "kiln_registry.cli.main", "worker", "--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_lease_timeout_must_exceed_twice_the_heartbeat(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config = wh.worker_config(tmp_path, free_port(), tiny_model.path,
                              {"database": str(tmp_path / "r.db")})  # fmt: skip
    text = config.read_text(encoding="utf-8").replace(
        "lease_timeout_s = 1.0", "lease_timeout_s = 0.4"
    )
    config.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"lease_timeout_s .* more than twice lease_heartbeat_s"):
        load_config(config)
