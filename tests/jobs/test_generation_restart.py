"""A generation job whose `kiln serve` is killed (SIGKILL) mid-job resumes after a restart.

The restarted server requeues the job, runs both probes again, serves the
generations committed before the kill from the cache, and publishes a corpus
that verifies; no partial corpus or signature is left behind.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.jobs.kinds import verify_corpus
from tests.helpers import free_port
from tests.jobs import restart_harness as rh
from tests.jobs.generation_harness import (
    CHAT_MODEL_ID,
    ChatTeacher,
    rewriting_proxy,
)

PROMPTS = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"quto {i} doan"}]}
           for i in range(12)]  # fmt: skip


def _slow(i: int, body: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.3)  # the proxy answers slowly so the kill lands mid-job
    return body


@pytest.mark.slow
def test_sigkill_mid_generation_job_then_restart_resumes_from_the_cache(
    tmp_path: Path, chat_model: Path, teacher: ChatTeacher
) -> None:
    port = free_port()
    config = rh.serve_config(tmp_path, port, chat_model)
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    with rewriting_proxy(teacher.url, _slow) as proxy:
        with rh.kiln_serve(config, log, port) as first:
            rh.register(url, {"alias": "t", "kind": "remote", "provider": "vllm",
                           "model_id": CHAT_MODEL_ID, "url": proxy})  # fmt: skip
            submitted = httpx.post(f"{url}/v1/jobs", timeout=120, json={
                "kind": "off_policy_generation", "teacher": "t", "max_tokens": 4, "top_k": 2,
                "prompts": PROMPTS,
            })  # fmt: skip
            assert submitted.status_code == 201, submitted.text
            job_id = submitted.json()["id"]
            rh.wait_progress(url, job_id, 5, timeout_s=60)
            rh.kill(first)
        with rh.kiln_serve(config, log, port):
            job = rh.wait_finished(url, job_id, timeout_s=120)
            result, keys = rh.result_and_keys(url, job_id)
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
