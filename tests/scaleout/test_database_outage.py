"""PostgreSQL restarts under load (issue 33 item 4): real `kiln serve`, a real server restarted.

A dedicated PostgreSQL (not the session's, which other tests share) is shut down fast
(every session ended, open transactions rolled back) and started again on the same port
while two clients register aliases and a `kiln worker` runs a job:

* while the database is away the registry answers ``503 database_unavailable`` with
  ``Retry-After``, never a 500;
* every registration answered 200 is in the database and every one refused is not (no
  half-written row);
* `kiln serve` and `kiln worker` reconnect by themselves (pools, the data-version
  reader): registrations succeed again without a restart, and the job completes with a
  corpus byte-identical to an undisturbed run of the same job.

Both a restart (3 s down) and a stop of 20 s.

Figures (printed): how long the replica answered 503, and the time from the database's
return to the first 200.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from kiln_registry.config.loader import load_config
from kiln_registry.db.models import TeacherRow
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.signing import key_path
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.jobs import restart_harness as rh
from tests.jobs import worker_harness as wh
from tests.jobs.harness import Controlled, student_identity
from tests.jobs.test_worker_processes import _reference_registry, _single_worker_result
from tests.pg_server import PostgresServer
from tests.probe.teacher_server import TeacherServer

SEQUENCES = [[i % 500 + 1, (i * 7) % 500 + 1, 3] for i in range(40)]
JOB_S = 180.0


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


class Burst:
    """Register ``burst-<n>-<i>`` aliases one after another until stopped; record answers."""

    def __init__(self, url: str, teacher: str, n: int) -> None:
        self.url, self.teacher, self.n = url, teacher, n
        self.answers: list[tuple[str, int, str | None, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            for i in range(10_000):
                if self.stop.is_set():
                    return
                alias = f"burst-{self.n}-{i:04d}"
                body = {"alias": alias, "kind": "remote", "provider": "vllm",
                        "model_id": "teacher-tiny", "url": self.teacher}  # fmt: skip
                try:
                    reply = client.post(f"{self.url}/v1/teachers", json=body)
                except httpx.HTTPError:
                    self.answers.append((alias, 0, None, time.monotonic()))
                    continue
                retry = reply.headers.get("retry-after")
                self.answers.append((alias, reply.status_code, retry, time.monotonic()))
                if reply.status_code == 503:
                    time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("down_s", [3.0, 20.0])
def test_a_postgres_restart_is_503_then_recovers_without_a_restart_of_kiln_serve(
    tmp_path: Path, tiny_model: TinyModel, own_postgres: PostgresServer,
    monkeypatch: pytest.MonkeyPatch, down_s: float,
) -> None:  # fmt: skip
    monkeypatch.setenv(own_postgres.password_env, own_postgres.password)
    keys = {
        "database": own_postgres.new_database("outage"),
        "database_password_env": own_postgres.password_env,
        "state_dir": str(tmp_path),
    }
    port = free_port()
    config = wh.worker_config(tmp_path, port, tiny_model.path, keys)
    url = f"http://127.0.0.1:{port}"
    identity = student_identity(student_vocab(tiny_model.path)[0])
    with (
        TeacherServer(Controlled(identity, delay_s=0.15)) as srv,
        rh.kiln_serve(config, tmp_path / "serve.log", port),
    ):
        teacher = f"http://127.0.0.1:{srv.port}"
        job_id = rh.submit_scoring(url, srv.port, SEQUENCES)
        with wh.sessions(config) as db:  # the same job, for an undisturbed run afterwards
            reference = _reference_registry(tmp_path / "ref", tiny_model.path, db, job_id)
        worker = wh.start_worker(config, tmp_path / "worker.log")
        rh.wait_progress(url, job_id, 1, timeout_s=JOB_S)  # the worker is up and scoring
        bursts = [Burst(url, teacher, n) for n in range(2)]
        for burst in bursts:
            burst.thread.start()
        time.sleep(2.0)
        assert rh.job(url, job_id)["status"] != "succeeded"  # the outage lands mid-job
        went_down = time.monotonic()
        own_postgres.restart(down_s=down_s)
        came_back = time.monotonic()
        time.sleep(5.0)
        for burst in bursts:
            burst.stop.set()
            burst.thread.join(90)
        job = rh.wait_finished(url, job_id, timeout_s=JOB_S)
        result, keys_ = rh.result_and_keys(url, job_id)
        after = httpx.post(f"{url}/v1/teachers", timeout=60, json={
            "alias": "after-restart", "kind": "remote", "provider": "vllm",
            "model_id": "teacher-tiny", "url": teacher})  # fmt: skip
        with wh.sessions(config) as db, unit_of_work(db) as session:
            stored = set(session.scalars(select(TeacherRow.alias)))
        assert rh.stop(worker) == 0
        key = key_path(load_config(config).server.state_path)
        undisturbed = _single_worker_result(reference, key, job_id)  # the teacher still up
    assert result.content == undisturbed
    answers = [a for burst in bursts for a in burst.answers]
    statuses = {status for _alias, status, _retry, _at in answers}
    assert statuses <= {200, 503}, sorted(statuses)
    assert all(retry is not None for _a, status, retry, _t in answers if status == 503)
    ok = {alias for alias, status, _r, _t in answers if status == 200}
    refused = {alias for alias, status, _r, _t in answers if status != 200}
    assert ok <= stored and not (refused & stored), (ok - stored, refused & stored)
    assert 503 in statuses, "the burst never met the outage"
    assert after.status_code == 200, after.text
    assert job["status"] == "succeeded", job
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(result.content)
    assert verify_corpus(corpus, keys_).sequences == len(SEQUENCES)
    unavailable = [t for _a, status, _r, t in answers if status == 503]
    first_ok = min((t for _a, status, _r, t in answers if status == 200 and t > came_back),
                   default=float("nan"))  # fmt: skip
    print(
        f"database away {came_back - went_down:.1f} s; 503s for "
        f"{max(unavailable) - min(unavailable):.1f} s; first 200 "
        f"{first_ok - came_back:.2f} s after the database returned"
    )
