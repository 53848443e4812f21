"""No worker, no silence (issue 30, item 6): a queued job nobody will claim is visible.

Real processes: `kiln serve` with ``embedded_workers = false`` and no `kiln
worker`, a vLLM-like teacher on loopback.  While no worker is alive, ``/ready``
reports ``workers.live = 0``, the queue and the age of its oldest job (and still
answers 200), ``/metrics`` exports ``kiln_job_workers_live 0``, the job's view and
`kiln jobs show` say "no worker has claimed this job; start `kiln worker`".  A
`kiln worker` then beats, claims and finishes the job; its clean stop removes its
heartbeat at once.  A worker that died without stopping stops counting after
``[jobs] lease_timeout_s`` (its row is judged stale, then pruned by the next beat).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select, update

from kiln_registry.config.loader import load_config
from kiln_registry.db.opening import ensure_schema, open_database
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.liveness import NO_WORKER, STALE_FACTOR, WorkerBeats, WorkerSlot
from kiln_registry.jobs.core.models import WorkerRow
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.jobs import restart_harness as rh
from tests.jobs import worker_harness as wh
from tests.jobs.harness import Controlled, student_identity
from tests.observability.support import metric_samples
from tests.pg_server import database_settings
from tests.probe.teacher_server import TeacherServer

SEQUENCES = [[1, 2, 3], [4, 5, 6]]


def _ready(url: str) -> dict[str, Any]:
    response = httpx.get(url + "/ready", timeout=10, trust_env=False)
    assert response.status_code == 200, response.text  # readiness is the API's, never gated
    return dict(response.json())


def _live_metric(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    return metric_samples(text)[("kiln_job_workers_live", ())]


def _show(url: str, job_id: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", "jobs", "show", job_id, "--server", url],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_queued_job_without_a_worker_says_so_until_kiln_worker_runs_it(
    tmp_path: Path, tiny_model: TinyModel, student_vocab_sha256: str
) -> None:
    port, main = free_port(), tmp_path / "main"
    config = wh.worker_config(main, port, tiny_model.path, database_settings(main))
    url = f"http://127.0.0.1:{port}"
    teacher = Controlled(student_identity(student_vocab_sha256))
    with TeacherServer(teacher) as srv, rh.kiln_serve(config, main / "serve.log", port):
        job_id = rh.submit_scoring(url, srv.port, SEQUENCES)
        workers = _ready(url)["workers"]
        assert workers["live"] == 0 and workers["embedded"] is False and workers["queued"] == 1
        assert workers["oldest_queued_age_s"] >= 0
        assert "no live job worker: start `kiln worker`" in workers["warning"]
        assert _live_metric(url) == 0
        assert rh.job(url, job_id)["waiting"] == NO_WORKER
        assert NO_WORKER in _show(url, job_id)
        with wh.kiln_worker(config, main / "worker.log"):
            job = rh.wait_finished(url, job_id, timeout_s=120)
            assert _ready(url)["workers"]["live"] == 1 and _live_metric(url) == 1
        assert job["status"] == "succeeded" and "waiting" not in job, job
        workers = _ready(url)["workers"]  # a clean stop removed the heartbeat row
    assert workers == {"live": 0, "embedded": False, "queued": 0, "oldest_queued_age_s": None}


def test_a_dead_workers_heartbeat_stops_counting_and_is_pruned(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config = wh.worker_config(tmp_path, free_port(), tiny_model.path, database_settings(tmp_path))
    engine = open_database(load_config(config).server)
    try:
        ensure_schema(engine, upgrade=False)  # empty: created at head
    finally:
        engine.dispose()
    slot = WorkerSlot(worker_id="h:1:a", host="h", pid=1, slots=1)
    with wh.sessions(config) as db:
        with unit_of_work(db) as session:
            WorkerBeats(session).beat(slot, timeout_s=wh.TIMEOUT_S)
            assert WorkerBeats(session).live_count(timeout_s=wh.TIMEOUT_S) == 1
            # SIGKILLed long ago: never renewed since.
            session.execute(update(WorkerRow).values(seen_at=wh.LONG_AGO))
            assert WorkerBeats(session).live_count(timeout_s=wh.TIMEOUT_S) == 0
        other = WorkerSlot(worker_id="h:2:b", host="h", pid=2, slots=1)
        with unit_of_work(db) as session:  # another worker's beat drops the dead row
            WorkerBeats(session).beat(other, timeout_s=wh.TIMEOUT_S / STALE_FACTOR)
            ids = session.scalars(select(WorkerRow.worker_id)).all()
            count = session.scalar(select(func.count()).select_from(WorkerRow))
    assert ids == ["h:2:b"] and count == 1
