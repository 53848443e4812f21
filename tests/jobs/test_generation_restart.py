"""A generation job whose `kiln serve` is killed (SIGKILL) mid-job resumes after a restart.

The restarted server requeues the job, runs both probes again, serves the
generations committed before the kill from the cache, and publishes a corpus
that verifies; no partial corpus or signature is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.jobs.corpus_verify import verify_corpus
from kiln_registry.jobs.signing import parse_keys
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.jobs.generation_harness import (
    CHAT_MODEL_ID,
    ChatTeacher,
    add_chat_template,
    chat_teacher,
    rewriting_proxy,
)

PROMPTS = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"quto {i} doan"}]}
           for i in range(12)]  # fmt: skip


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Path:
    return add_chat_template(tiny_model.path, tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def teacher(chat_model: Path) -> Iterator[ChatTeacher]:
    with chat_teacher(chat_model) as served:
        yield served


@contextmanager
def kiln_serve(config: Path, log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """`kiln serve` as a subprocess, up once /health answers (generous on a loaded machine)."""
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kiln_registry.cli.main", "serve", "--config", str(config)],
            stdout=sink, stderr=sink, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
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


def _slow(i: int, body: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.3)  # the proxy answers slowly so the kill lands mid-job
    return body


def _job(url: str, job_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json())


@pytest.mark.slow
def test_sigkill_mid_generation_job_then_restart_resumes_from_the_cache(
    tmp_path: Path, chat_model: Path, teacher: ChatTeacher
) -> None:
    port = free_port()
    config = tmp_path / "kiln.toml"
    config.write_text(
        f'[server]\nport = {port}\ndatabase = "{tmp_path / "registry.db"}"\n'
        f'[student]\nmodel_path = "{chat_model}"\n'
        f'[jobs]\nconcurrency = 1\nresult_root = "{tmp_path / "results"}"\n',
        encoding="utf-8",
    )
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    with rewriting_proxy(teacher.url, _slow) as proxy:
        with kiln_serve(config, log, port) as first:
            body = {"alias": "t", "kind": "remote", "provider": "vllm",
                    "model_id": CHAT_MODEL_ID, "url": proxy}  # fmt: skip
            assert httpx.post(f"{url}/v1/teachers", json=body, timeout=30).status_code == 200
            submitted = httpx.post(f"{url}/v1/jobs", timeout=30, json={
                "kind": "off_policy_generation", "teacher": "t", "max_tokens": 4, "top_k": 2,
                "prompts": PROMPTS,
            })  # fmt: skip
            assert submitted.status_code == 201, submitted.text
            job_id = submitted.json()["id"]
            deadline = time.monotonic() + 60
            while int(_job(url, job_id)["progress"]["done"]) < 5:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        with kiln_serve(config, log, port):
            deadline = time.monotonic() + 120
            while (job := _job(url, job_id))["status"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, job
                time.sleep(0.05)
            result = httpx.get(f"{url}/v1/jobs/{job_id}/result", timeout=30)
            keys = parse_keys(httpx.get(f"{url}/v1/keys", timeout=30).json(), "GET /v1/keys")
    assert job["status"] == "succeeded", job
    assert job["attempts"] == 2
    progress = job["progress"]
    assert progress["cache_hits"] >= 2, progress
    assert progress["cache_hits"] + progress["scored"] == len(PROMPTS)
    results = tmp_path / "results"
    assert not list(results.glob(".*.partial"))
    # The downloaded corpus and its detached signature (sent as a header) verify.
    corpus = tmp_path / "download.jsonl"
    corpus.write_bytes(result.content)
    corpus.with_name("download.jsonl.sig").write_text(
        result.headers["x-kiln-corpus-signature"] + "\n"
    )
    assert verify_corpus(corpus, keys).sequences == len(PROMPTS)
