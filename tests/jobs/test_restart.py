"""Durability: `kiln serve` killed with SIGKILL mid-job, restarted, finishes from phase (a)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.jobs import restart_harness as rh
from tests.jobs.harness import Controlled, student_identity
from tests.probe.teacher_server import TeacherServer

SEQUENCES = [[i % 500 + 1, (i * 7) % 500 + 1, 3] for i in range(60)]


@pytest.mark.slow
def test_sigkill_mid_job_then_restart_requeues_and_finishes(
    tmp_path: Path, tiny_model: TinyModel, student_vocab_sha256: str
) -> None:
    port = free_port()
    (tmp_path / "corpora").mkdir()
    config = rh.serve_config(tmp_path, port, tiny_model.path)
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    teacher = Controlled(student_identity(student_vocab_sha256), delay_s=0.05)
    with TeacherServer(teacher) as srv:
        with rh.kiln_serve(config, log, port) as first:
            job_id = rh.submit_scoring(url, srv.port, SEQUENCES)
            rh.wait_progress(url, job_id, 5, timeout_s=30)
            rh.kill(first)
        probes_before = teacher.prompts.count([0, 0])
        with rh.kiln_serve(config, log, port):
            job = rh.wait_finished(url, job_id, timeout_s=60)
            result, keys = rh.result_and_keys(url, job_id)
    assert job["status"] == "succeeded", job
    assert job["attempts"] == 2
    progress = job["progress"]
    assert isinstance(progress, dict) and progress["cache_hits"] >= 5
    assert progress["cache_hits"] + progress["scored"] == len(SEQUENCES)
    assert teacher.prompts.count([0, 0]) == probes_before + 2  # both probes ran again
    assert not _partial_files(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(result.content)
    assert verify_corpus(corpus, keys).sequences == len(SEQUENCES)


def _partial_files(tmp_path: Path) -> list[Path]:
    results = tmp_path / "results"
    return list(results.glob(".*.partial")) if results.is_dir() else []


def test_a_graceful_stop_requeues_the_running_job_and_the_next_start_finishes_it(
    tmp_path: Path, tiny_model: TinyModel, student_vocab_sha256: str
) -> None:
    from tests.jobs.harness import make_config, running_registry

    config = make_config(tmp_path, tiny_model.path, concurrency=1)
    teacher = Controlled(student_identity(student_vocab_sha256), delay_s=0.02)
    with TeacherServer(teacher) as srv:
        with running_registry(config) as reg:
            reg.register("t", f"http://127.0.0.1:{srv.port}", "teacher-tiny")
            job_id = reg.submit("t", 2, sequences=SEQUENCES).json()["id"]
            reg.wait(job_id, ("running",))
        # The lifespan stopped the workers: the job went back to queued, lease released.
        with running_registry(config) as reg:
            job = reg.wait(job_id)
    assert job["status"] == "succeeded" and job["attempts"] == 2
    assert job["progress"]["done"] == len(SEQUENCES)
    assert not _partial_files(tmp_path)
