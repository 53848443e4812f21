"""Off-policy generation jobs refuse bad input and misbehaving teachers, keeping nothing.

Submission refusals (empty messages, unknown roles, prompts longer than
``max_model_len``, ``max_tokens`` beyond the model, ``top_k`` beyond the
teacher, a student without a chat template) leave no job row.  A teacher
that flips its fingerprint mid-job, returns fewer tokens than asked, or NaN
logprobs fails the job with a clear rule; no corpus, partial file or cache
row is kept for the failing prompt or any after it.  The misbehaviour is
produced by a real proxy in front of the real reference teacher: a correct
teacher cannot produce it (stubbed answers, hence the proxy).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.models import GenerationCacheRow, JobSequenceRow
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher
from tests.jobs.generation_harness import (
    CHAT_MODEL_ID,
    MESSAGES,
    ChatTeacher,
    Rewrite,
    rewriting_proxy,
    submit_generation,
)
from tests.jobs.harness import Registry, make_config, running_registry

PROMPTS = [{"id": f"p{i}", "messages": m} for i, m in enumerate(MESSAGES)]


def _refused(reg: Registry, rule: str, **fields: Any) -> None:
    response = submit_generation(reg.http, "ref@chat", **{"max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "job_invalid" and error.get("rule") == rule, error
    assert reg.http.get("/v1/jobs").json()["jobs"] == []


def _corpus(tmp_path: Path, lines: list[object]) -> dict[str, str]:
    (tmp_path / "corpora" / "bad.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"path": "bad.jsonl"}


def test_bad_input_is_refused_at_submission_and_nothing_is_stored(
    tmp_path: Path, chat_model: Path, teacher: ChatTeacher
) -> None:
    config = make_config(tmp_path, chat_model)
    with running_registry(config) as reg:
        reg.register("ref@chat", teacher.url, CHAT_MODEL_ID)
        empty = _corpus(tmp_path, [{"id": "a", "messages": []}])
        _refused(reg, "job.messages_empty", corpus=empty)
        robot = _corpus(tmp_path, [{"id": "a", "messages": [{"role": "robot", "content": "x"}]}])
        _refused(reg, "job.message_role", corpus=robot)
        long = [{"role": "user", "content": "the teacher says hello " * 20}]
        _refused(reg, "job.prompt_length", prompts=[{"messages": long}])
        _refused(reg, "job.max_tokens", prompts=PROMPTS, max_tokens=64)
        _refused(reg, "job.top_k", prompts=PROMPTS, top_k=9)
        # The wire schema refuses the same shapes inline, naming the field.
        for bad in ([], [{"role": "robot", "content": "x"}]):
            response = submit_generation(reg.http, "ref@chat", max_tokens=4,
                                         prompts=[{"messages": bad}])  # fmt: skip
            assert response.status_code == 400, response.text
        assert reg.http.get("/v1/jobs").json()["jobs"] == []


def test_a_student_without_a_chat_template_is_refused(
    tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    config = make_config(tmp_path, tiny_model.path)
    with running_registry(config) as reg:
        reg.register("ref@chat", reference_teacher.url, REFERENCE_MODEL_ID)
        _refused(reg, "job.chat_template", prompts=PROMPTS)


def _run(tmp_path: Path, chat_model: Path, url: str) -> tuple[dict[str, Any], list[str], int]:
    """Submit the four prompts (one request at a time); the job, its prompt SHAs, cache rows."""
    config = make_config(tmp_path, chat_model, concurrency=1)
    with running_registry(config) as reg:
        reg.register("ref@chat", url, CHAT_MODEL_ID)
        submitted = submit_generation(reg.http, "ref@chat", prompts=PROMPTS, max_tokens=4, top_k=2)
        assert submitted.status_code == 201, submitted.text
        job = reg.wait(submitted.json()["id"])
        with unit_of_work(reg.ctx.sessions) as session:
            shas = [
                r.token_sha256 for r in session.query(JobSequenceRow).order_by(JobSequenceRow.idx)
            ]
            cached = {r.prompt_sha256 for r in session.query(GenerationCacheRow)}
    assert config.jobs.result_root is not None
    left = (
        sorted(p.name for p in config.jobs.result_root.iterdir())
        if config.jobs.result_root.exists()
        else []
    )
    assert left == [], left  # no corpus, signature or partial file
    return job, shas, len(cached & set(shas[2:]))


def _after(index: int, change: Rewrite) -> Rewrite:
    return lambda i, body: change(i, body) if i >= index else body


def test_a_fingerprint_flip_mid_job_fails_it_and_keeps_nothing_after(
    tmp_path: Path, chat_model: Path, teacher: ChatTeacher
) -> None:
    other = dataclasses.replace(teacher.identity, inference_config_sha256="e" * 64).fingerprint()

    def flip(i: int, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "system_fingerprint": other}

    with rewriting_proxy(teacher.url, _after(2, flip)) as url:
        job, _, kept_after = _run(tmp_path, chat_model, url)
    assert job["status"] == "failed", job
    assert job["error"]["rule"] == "generation.fingerprint_pinned", job["error"]
    assert kept_after == 0


def _short(i: int, body: dict[str, Any]) -> dict[str, Any]:
    choice = dict(body["choices"][0])
    choice["token_ids"] = choice["token_ids"][:-1]
    logprobs = choice["logprobs"]
    choice["logprobs"] = {key: value[:-1] for key, value in logprobs.items()}
    usage = {**body["usage"], "completion_tokens": len(choice["token_ids"])}
    return {**body, "choices": [choice], "usage": usage}


def _nan(i: int, body: dict[str, Any]) -> bytes:
    choice = body["choices"][0]
    choice["logprobs"]["token_logprobs"][0] = "NAN_HERE"
    return json.dumps(body).encode().replace(b'"NAN_HERE"', b"NaN")


@pytest.mark.parametrize(
    ("rewrite", "rule"),
    [(_short, "generation.token_count"), (_nan, "probe.json_constant")],
)
def test_a_teacher_answer_that_breaks_the_rules_fails_the_job(
    tmp_path: Path, chat_model: Path, teacher: ChatTeacher, rewrite: Rewrite, rule: str
) -> None:
    with rewriting_proxy(teacher.url, _after(2, rewrite)) as url:
        job, _, kept_after = _run(tmp_path, chat_model, url)
    assert job["status"] == "failed", job
    assert job["error"]["rule"] == rule, job["error"]
    assert kept_after == 0
