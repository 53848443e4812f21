"""Leases on the database's clock (issue 33 item 3): a worker with a skewed clock, on PostgreSQL.

A worker whose clock runs 10 minutes ahead or behind (Debian's libfaketime, a real
LD_PRELOAD clock offset for that process alone) neither steals a live lease nor keeps a
dead one: lease expiry is written and judged on PostgreSQL's ``statement_timestamp()``.
PostgreSQL only, whatever ``KILN_TEST_BACKEND`` says: a SQLite registry lives on one host,
whose processes share one clock.  Real processes: a worker-less `kiln serve`, two
`kiln worker` processes (one under faketime) and a reference-protocol teacher
that holds scoring requests until the test has watched four lease timeouts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.jobs import restart_harness as rh
from tests.jobs import worker_harness as wh
from tests.jobs.harness import Controlled, student_identity
from tests.pg_server import PostgresServer
from tests.probe.teacher_server import TeacherServer

SEQUENCES = [[i % 500 + 1, (i * 7) % 500 + 1, 3] for i in range(20)]
JOB_S = 120.0
# Debian's libfaketime (package faketime), under the platform's multiarch folder.
LIBFAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), Path("/nonexistent"))


@pytest.fixture
def registry(
    tmp_path: Path, tiny_model: TinyModel,
    postgres_server: PostgresServer, pg_database: str, monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Path, str, int, threading.Event]]:  # fmt: skip
    """A worker-less `kiln serve` on PostgreSQL and a teacher that holds scoring at a gate."""
    student_vocab_sha256 = student_vocab(tiny_model.path)[0]
    if not LIBFAKETIME.is_file():
        pytest.fail("Debian's libfaketime is missing: scripts/install-test-deps.sh installs it")
    monkeypatch.setenv(postgres_server.password_env, postgres_server.password)
    keys = {"database": pg_database, "database_password_env": postgres_server.password_env,
            "state_dir": str(tmp_path)}  # fmt: skip
    port = free_port()
    # Two devices: the second worker is never held back by the first one's device lease.
    config = wh.worker_config(tmp_path, port, tiny_model.path, keys, devices=["cuda:0", "cuda:1"])
    gate = threading.Event()  # scoring requests wait until the test opens it
    teacher = Controlled(student_identity(student_vocab_sha256), gate=gate)
    with TeacherServer(teacher) as srv, rh.kiln_serve(config, tmp_path / "serve.log", port):
        yield config, f"http://127.0.0.1:{port}", srv.port, gate
    gate.set()


def _faketime(offset: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    """`kiln worker` with libfaketime preloaded into the worker process itself.

    Not through the ``faketime`` wrapper: that forks, so a SIGKILL would miss the worker.
    """
    argv = [sys.executable, "-m", "kiln_registry.cli.main", "worker", "--config", str(config)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LD_PRELOAD": str(LIBFAKETIME),
           "FAKETIME": offset, "FAKETIME_DONT_RESET": "1"}  # fmt: skip
    with log.open("ab") as sink:
        return subprocess.Popen(argv, stdout=sink, stderr=sink, env=env)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("offset", "skewed"), [("+10m", "holder"), ("-10m", "holder"), ("+10m", "thief")]
)
def test_a_skewed_worker_clock_neither_steals_a_live_lease_nor_keeps_a_dead_one(
    registry: tuple[Path, str, int, threading.Event], tmp_path: Path, offset: str, skewed: str
) -> None:
    config, url, teacher_port, gate = registry
    skew = lambda n: _faketime(offset, config, tmp_path / f"worker-{n}.log")  # noqa: E731
    plain = lambda n: wh.start_worker(config, tmp_path / f"worker-{n}.log")  # noqa: E731
    first_start, second_start = (skew, plain) if skewed == "holder" else (plain, skew)
    with wh.sessions(config) as db:
        job_id = rh.submit_scoring(url, teacher_port, SEQUENCES)
        first = first_start(0)
        second: subprocess.Popen[bytes] | None = None
        try:
            wh.wait_for(lambda: wh.holder_pid(db, job_id) is not None, JOB_S, "a claim")
            holder = wh.holder_pid(db, job_id)
            second = second_start(1)
            log = tmp_path / "worker-1.log"
            wh.wait_for(lambda: "started" in log.read_text(), JOB_S, "the second worker")
            time.sleep(4 * wh.TIMEOUT_S)  # four lease timeouts: a steal would have happened
            assert wh.holder_pid(db, job_id) == holder
            assert wh.job_row(db, job_id).attempts == 1
            rh.kill(first)  # the holder dies: its lease must run out on the database's clock
            gate.set()
            job = rh.wait_finished(url, job_id, timeout_s=JOB_S)
        finally:
            statuses = [rh.stop(p) for p in (first, second) if p is not None]
    assert statuses[0] == -9 and statuses[1:] == [0]
    assert job["status"] == "succeeded" and job["attempts"] == 2, job
