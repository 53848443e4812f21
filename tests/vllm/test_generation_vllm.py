"""The real-vLLM tier: off-policy generation jobs against a launched vLLM teacher.

This module launches its own ``kiln-teacher`` (tiny model, eager, float32)
with ``max_model_len`` 256 and ``max_top_k`` 16: ChatML and Llama framing
spell out in many tokens of the tiny tokenizer, and 16 is Kiln's smallest
uncapped top-K.  A ``kiln serve`` whose student is the same model with a chat
template (same vocabulary, so the teacher matches it) runs the jobs.

- One template ending with ``eos_token``, greedy, top-K 1 and 16: the corpus
  verifies with its detached signature, its examples have Kiln's serde shape
  and pass Kiln's off-policy preparation, and greedy generation equals
  Transformers' greedy decode token for token.
- Two templates (ChatML, and Llama framing whose assistant block ends without
  EOS), top-K 1, 8 and 16: every example passes
  ``tests/kiln_conformance/kiln_rules.py``, and at 16 its teacher rows are
  Transformers' scores of Kiln's sequence.  One prompt's answer is rewritten
  by the proxy of ``tests/jobs/test_generation_kiln.py`` to ids that split
  "é" across two byte tokens (a random tiny model cannot be made to generate
  that for real: the one stub here); the scoring pass after it is vLLM's.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.jobs.core.signing import parse_keys
from kiln_registry.jobs.generation.sources import render, student_tokenizer
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.testing.tiny_models import TinyModel
from kiln_registry.wire.jobs import KILN_SMALL_K_NOTE
from tests.api.support import write_config
from tests.jobs.generation_harness import CHAT_TEMPLATE, MESSAGES, add_chat_template
from tests.jobs.test_generation import transformers_greedy
from tests.jobs.test_generation_kiln import (
    MB_MESSAGES,
    SPLIT,
    _check_teacher_rows,
    _encoder,
    _proxy,
    _rewritten,
)
from tests.kiln_conformance.kiln_rules import prepare_example
from tests.kiln_conformance.test_off_policy_examples import check_example
from tests.kiln_conformance.test_off_policy_preparation import TEMPLATES
from tests.vllm.support import SERVED, Launched, Registry, launch, start_registry, stop

# This module's vLLM launch happens in its first test's setup: minutes on two busy cores.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]
MAX_TOKENS = 4
WIDE_LEN, WIDE_TOP_K = 256, 16


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Iterator[Launched]:
    """One ``kiln-teacher`` launch for the module, long enough for ChatML and Llama framing."""
    teacher = launch(tmp_path_factory.mktemp("wide"), tiny_model.path,
                     max_model_len=WIDE_LEN, max_top_k=WIDE_TOP_K)  # fmt: skip
    yield teacher
    status = stop(teacher.proc, signal.SIGTERM)
    assert status == 128 + signal.SIGTERM, status
    assert teacher.leftovers() == []


def _run_job(
    http: httpx.Client, top_k: int, prompts: list[dict[str, Any]], max_tokens: int = MAX_TOKENS
) -> tuple[dict[str, Any], httpx.Response]:
    submitted = http.post("/v1/jobs", json={
        "kind": "off_policy_generation", "teacher": "vllm-gen", "prompts": prompts,
        "max_tokens": max_tokens, "top_k": top_k,
    })  # fmt: skip
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    deadline = time.monotonic() + 600
    while (job := http.get(f"/v1/jobs/{job_id}").json())["status"] not in (
        "succeeded", "failed", "cancelled",
    ):  # fmt: skip
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job, http.get(f"/v1/jobs/{job_id}/result")


def _register(http: httpx.Client, url: str) -> None:
    body = {"alias": "vllm-gen", "kind": "remote", "provider": "vllm",
            "url": url + "/v1", "model_id": SERVED}  # fmt: skip
    registered = http.post("/v1/teachers", json=body)
    assert registered.status_code == 200, registered.text


def _verified(result: httpx.Response, keys: Any, path: Path) -> list[dict[str, Any]]:
    """The corpus of a job result, checked against its detached signature; its examples."""
    path.write_bytes(result.content)
    path.with_name(path.name + ".sig").write_text(result.headers["x-kiln-corpus-signature"] + "\n")
    verify_corpus(path, keys)
    return [json.loads(line) for line in result.content.decode().splitlines()[1:]]


def test_a_generation_job_against_real_vllm_writes_a_kiln_corpus(
    wide: Launched, tiny_model: TinyModel, tmp_path: Path
) -> None:
    chat = add_chat_template(tiny_model.path, tmp_path / "chat")
    config = write_config(tmp_path, student=chat, server={"probe_timeout_s": 120.0})
    registry = start_registry(config, tmp_path / "serve.log")
    results: dict[int, httpx.Response] = {}
    prompts = [{"id": f"v{i}", "messages": m} for i, m in enumerate(MESSAGES[:2])]
    try:
        with registry.client() as http:
            _register(http, wide.url)
            for top_k in (1, WIDE_TOP_K):  # the teacher's maximum
                job, results[top_k] = _run_job(http, top_k, prompts)
                assert job["status"] == "succeeded", (job, registry.log.read_text()[-3000:])
            keys = parse_keys(http.get("/v1/keys").json(), "GET /v1/keys")
    finally:
        stop(registry.proc, signal.SIGTERM)
    tokenizer = student_tokenizer(chat)
    for top_k, result in results.items():
        examples = _verified(result, keys, tmp_path / f"corpus-{top_k}.jsonl")
        assert len(examples) == 2
        fixture: dict[Any, Any] = {}
        for example, messages in zip(examples, MESSAGES[:2], strict=True):
            check_example(example, top_k, 512)
            # Kiln's off-policy preparation accepts it: masking, count, ids, top-K rows.
            prepare_example(example, CHAT_TEMPLATE, _encoder(tokenizer), top_k, 512, fixture)
            ids = example["metadata"]["completion_token_ids"]
            prompt = render(tokenizer, messages, "test")
            assert ids == transformers_greedy(chat, prompt, MAX_TOKENS)


def _student(tiny_model: TinyModel, template: str, dest: Path) -> Path:
    shutil.copytree(tiny_model.path, dest)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_corpora_from_real_vllm_pass_kilns_preparation_for_two_templates(
    name: str, wide: Launched, tiny_model: TinyModel, tmp_path: Path
) -> None:
    student = _student(tiny_model, TEMPLATES[name], tmp_path / "student")
    tokenizer = student_tokenizer(student)
    mb_prompt = render(tokenizer, MB_MESSAGES, "test")

    def rewrite(sent: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        return answer if sent["prompt"] != mb_prompt else _rewritten(tokenizer, sent, answer, SPLIT)

    prompts = [{"id": f"p{i}", "messages": m} for i, m in enumerate(MESSAGES)]
    prompts.append({"id": "mb", "messages": MB_MESSAGES})
    config = write_config(tmp_path, student=student, server={"probe_timeout_s": 120.0})
    results: dict[int, httpx.Response] = {}
    with _proxy(wide.url, rewrite) as url:
        registry = start_registry(config, tmp_path / "serve.log")
        try:
            with registry.client() as http:
                _register(http, url)
                for top_k in (1, 8, WIDE_TOP_K):
                    job, results[top_k] = _run_job(http, top_k, prompts, max_tokens=12)
                    _succeeded(job, top_k, registry)
                keys = parse_keys(http.get("/v1/keys").json(), "GET /v1/keys")
        finally:
            stop(registry.proc, signal.SIGTERM)
    vocab = int(json.loads((student / "config.json").read_text())["vocab_size"])
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(student, local_files_only=True)
    for top_k, result in results.items():
        examples = _verified(result, keys, tmp_path / f"corpus-{top_k}.jsonl")
        assert len(examples) == len(prompts)
        fixture: dict[Any, Any] = {}
        for example in examples:
            positions = prepare_example(
                example, TEMPLATES[name], _encoder(tokenizer), top_k, vocab, fixture
            )
            assert positions == example["metadata"]["kiln_action_positions"]
            if top_k == WIDE_TOP_K:
                _check_teacher_rows(model, example, top_k)
        mb = examples[-1]
        assert mb["teacher_response"] == "zy é ka"
        sampled = mb["metadata"]["completion_token_ids"]
        assert [t["token_id"] for t in mb["teacher_tokens"]] != sampled


def _succeeded(job: dict[str, Any], top_k: int, registry: Registry) -> None:
    assert job["status"] == "succeeded", (job, registry.log.read_text()[-3000:])
    note = KILN_SMALL_K_NOTE if top_k < 16 else None
    assert job["generation"].get("kiln_note") == note
