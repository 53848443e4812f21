"""Durability: `kiln serve` killed with SIGKILL mid-job, restarted, finishes from phase (a)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from kiln_registry.jobs.corpus_verify import verify_corpus
from kiln_registry.jobs.signing import parse_keys
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.jobs.harness import Controlled, student_identity
from tests.probe.teacher_server import TeacherServer

SEQUENCES = [[i % 500 + 1, (i * 7) % 500 + 1, 3] for i in range(60)]


@contextmanager
def kiln_serve(config: Path, log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kiln_registry.cli.main", "serve", "--config", str(config)],
            stdout=sink,
            stderr=sink,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "kiln serve did not start"
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _job(url: str, job_id: str) -> dict[str, object]:
    return dict(httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json())


@pytest.mark.slow
def test_sigkill_mid_job_then_restart_requeues_and_finishes(
    tmp_path: Path, tiny_model: TinyModel, student_vocab_sha256: str
) -> None:
    port = free_port()
    (tmp_path / "corpora").mkdir()
    config = tmp_path / "kiln.toml"
    config.write_text(
        f'[server]\nport = {port}\ndatabase = "{tmp_path / "registry.db"}"\n'
        f'[student]\nmodel_path = "{tiny_model.path}"\n'
        f'[jobs]\nconcurrency = 1\nresult_root = "{tmp_path / "results"}"\n',
        encoding="utf-8",
    )
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    teacher = Controlled(student_identity(student_vocab_sha256), delay_s=0.05)
    with TeacherServer(teacher) as srv:
        with kiln_serve(config, log, port) as first:
            body = {"alias": "t", "kind": "remote", "provider": "vllm",
                    "model_id": "teacher-tiny", "url": f"http://127.0.0.1:{srv.port}"}  # fmt: skip
            assert httpx.post(f"{url}/v1/teachers", json=body, timeout=30).status_code == 200
            submitted = httpx.post(f"{url}/v1/jobs", timeout=30, json={
                "kind": "teacher_scoring", "teacher": "t", "top_k": 2, "sequences": SEQUENCES,
            })  # fmt: skip
            job_id = submitted.json()["id"]
            deadline = time.monotonic() + 30
            while int(_job(url, job_id)["progress"]["done"]) < 5:  # type: ignore[index]
                assert time.monotonic() < deadline
                time.sleep(0.05)
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        probes_before = teacher.prompts.count([0, 0])
        with kiln_serve(config, log, port):
            deadline = time.monotonic() + 60
            while (job := _job(url, job_id))["status"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, job
                time.sleep(0.05)
            result = httpx.get(f"{url}/v1/jobs/{job_id}/result", timeout=30)
            keys = parse_keys(httpx.get(f"{url}/v1/keys", timeout=30).json(), "GET /v1/keys")
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
