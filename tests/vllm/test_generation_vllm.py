"""The real-vLLM tier: one tiny off-policy generation job against a launched vLLM teacher.

The session's ``kiln-teacher`` launch (tiny model, eager, float32) serves the
teacher; a ``kiln serve`` whose student is the same model with a chat
template (same vocabulary, so the teacher matches it) runs greedy jobs of
two prompts at top-K 1 and the teacher's maximum.  The corpus verifies with
its detached signature, its examples have Kiln's serde shape and pass Kiln's
off-policy preparation (``tests/kiln_conformance/kiln_rules.py``), and greedy
generation equals Transformers' greedy decode token for token.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.jobs.corpus_verify import verify_corpus
from kiln_registry.jobs.generation_sources import render, student_tokenizer
from kiln_registry.jobs.signing import parse_keys
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import write_config
from tests.jobs.generation_harness import CHAT_TEMPLATE, MESSAGES, add_chat_template
from tests.jobs.test_generation import transformers_greedy
from tests.kiln_conformance.kiln_rules import prepare_example
from tests.kiln_conformance.test_off_policy_examples import check_example
from tests.vllm.support import MAX_TOP_K, SERVED, Launched, start_registry, stop

# The session's vLLM launch may happen in this test's setup: minutes on two busy cores.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]
MAX_TOKENS = 4


def _run_job(http: Any, top_k: int) -> tuple[dict[str, Any], bytes]:
    prompts = [{"id": f"v{i}", "messages": m} for i, m in enumerate(MESSAGES[:2])]
    submitted = http.post("/v1/jobs", json={
        "kind": "off_policy_generation", "teacher": "vllm-gen", "prompts": prompts,
        "max_tokens": MAX_TOKENS, "top_k": top_k,
    })  # fmt: skip
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    deadline = time.monotonic() + 600
    while (job := http.get(f"/v1/jobs/{job_id}").json())["status"] not in (
        "succeeded", "failed", "cancelled",
    ):  # fmt: skip
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job, http.get(f"/v1/jobs/{job_id}/result").content


def test_a_generation_job_against_real_vllm_writes_a_kiln_corpus(
    launched: Launched, tiny_model: TinyModel, tmp_path: Path
) -> None:
    chat = add_chat_template(tiny_model.path, tmp_path / "chat")
    config = write_config(tmp_path, student=chat, server={"probe_timeout_s": 120.0})
    registry = start_registry(config, tmp_path / "serve.log")
    corpora: dict[int, bytes] = {}
    try:
        with registry.client() as http:
            body = {"alias": "vllm-gen", "kind": "remote", "provider": "vllm",
                    "url": launched.url + "/v1", "model_id": SERVED}  # fmt: skip
            assert http.post("/v1/teachers", json=body).status_code == 200
            for top_k in (1, MAX_TOP_K):  # the teacher's maximum
                job, corpora[top_k] = _run_job(http, top_k)
                assert job["status"] == "succeeded", (job, registry.log.read_text()[-3000:])
            result = http.get(f"/v1/jobs/{job['id']}/result")
            keys = parse_keys(http.get("/v1/keys").json(), "GET /v1/keys")
    finally:
        stop(registry.proc, signal.SIGTERM)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(result.content)
    corpus.with_name("corpus.jsonl.sig").write_text(
        result.headers["x-kiln-corpus-signature"] + "\n"
    )
    assert verify_corpus(corpus, keys).sequences == 2
    tokenizer = student_tokenizer(chat)

    def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
        got = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        return list(got.ids), list(got.offsets)

    for top_k, content in corpora.items():
        examples = [json.loads(line) for line in content.decode().splitlines()[1:]]
        fixture: dict[Any, Any] = {}
        for example, messages in zip(examples, MESSAGES[:2], strict=True):
            check_example(example, top_k, 512)
            # Kiln's off-policy preparation accepts it: masking, count, ids, top-K rows.
            prepare_example(example, CHAT_TEMPLATE, encode, top_k, 512, fixture)
            ids = example["metadata"]["completion_token_ids"]
            prompt = render(tokenizer, messages, "test")
            assert ids == transformers_greedy(chat, prompt, MAX_TOKENS)
