"""Off-policy generation jobs against the reference teacher: Kiln's format, greedy equality.

The reference teacher's greedy generation must equal Transformers' greedy
decode token for token, through the job queue; the corpus passes ``kiln
corpus verify`` (detached signature), is cached for deterministic settings
and written again from the cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kiln_registry.client.sync import RegistryClient
from kiln_registry.db.repository import unit_of_work
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.jobs.core.models import GenerationCacheRow
from kiln_registry.jobs.core.signing import parse_keys, signature_path
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.wire.jobs import KILN_SMALL_K_NOTE, KILN_TEXT_ONLY_NOTE
from tests.jobs.generation_harness import (
    CHAT_MODEL_ID,
    MESSAGES,
    ChatTeacher,
    submit_generation,
)
from tests.jobs.harness import make_config, running_registry
from tests.kiln_conformance.test_off_policy_examples import check_example


def transformers_greedy(model_dir: Path, prompt: list[int], max_tokens: int) -> list[int]:
    """Transformers' own greedy decode (``generate``, no sampling), EOS included."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, local_files_only=True, dtype=torch.float32
    )
    model.eval()
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
            eos_token_id=eos, pad_token_id=eos, attention_mask=torch.ones(1, len(prompt),
                                                                          dtype=torch.long),
        )  # fmt: skip
    return [int(t) for t in out[0, len(prompt) :]]


def _corpus(reg: Any, job_id: str) -> list[dict[str, Any]]:
    result = reg.http.get(f"/v1/jobs/{job_id}/result")
    assert result.status_code == 200, result.text
    lines = result.content.decode().splitlines()
    return [json.loads(line) for line in lines[1:]]


def test_greedy_generation_job_matches_transformers_and_verifies(
    tmp_path: Path, chat_model: Path, teacher: ChatTeacher
) -> None:
    from kiln_registry.jobs.generation.sources import render, student_tokenizer

    config = make_config(tmp_path, chat_model, concurrency=2)
    with running_registry(config) as reg:
        reg.register("ref@chat", teacher.url, CHAT_MODEL_ID)
        prompts = [{"id": f"p{i}", "messages": m} for i, m in enumerate(MESSAGES)]
        submitted = submit_generation(reg.http, "ref@chat", prompts=prompts, max_tokens=6, top_k=4)
        assert submitted.status_code == 201, submitted.text
        assert submitted.json()["kind"] == "off_policy_generation"
        job = reg.wait(submitted.json()["id"])
        assert job["status"] == "succeeded", job
        assert job["generation"] == {"max_tokens": 6, "temperature": 0.0, "top_p": 1.0,
                                     "seed": None, "kiln_note": KILN_SMALL_K_NOTE}  # fmt: skip
        keys = parse_keys(reg.http.get("/v1/keys").json(), "GET /v1/keys")
        assert config.jobs.result_root is not None
        path = config.jobs.result_root / f"{job['id']}.jsonl"
        summary = verify_corpus(path, keys)
        assert summary.sequences == len(MESSAGES) and summary.job_id == job["id"]
        assert signature_path(path).is_file()
        # The Python client downloads and verifies it, its detached signature beside it.
        with RegistryClient(reg.url) as client:
            got = client.download_result(job["id"], tmp_path / "out" / "gen.jsonl")
        assert got.summary is not None and got.summary.sequences == len(MESSAGES)
        assert got.path.read_bytes() == path.read_bytes()
        assert signature_path(got.path).read_bytes() == signature_path(path).read_bytes()
        assert sorted(p.name for p in got.path.parent.iterdir()) == ["gen.jsonl", "gen.jsonl.sig"]
        examples = _corpus(reg, job["id"])
        first = path.read_text().splitlines()[0]
        assert first == off_policy_manifest(teacher.identity)
        # Served again: every generation comes from the cache (greedy is deterministic).
        again = submit_generation(reg.http, "ref@chat", prompts=prompts, max_tokens=6, top_k=4)
        repeat = reg.wait(again.json()["id"])
        assert repeat["progress"]["cache_hits"] == len(MESSAGES), repeat
        assert [e["teacher_response"] for e in _corpus(reg, repeat["id"])] == [
            e["teacher_response"] for e in examples
        ]
    tokenizer = student_tokenizer(chat_model)
    assert [e["id"] for e in examples] == ["p0", "p1", "p2", "p3"]
    for example, messages in zip(examples, MESSAGES, strict=True):
        assert example["messages"] == messages
        check_example(example, 4, teacher.identity.vocab_size)  # Kiln's serde types
        ids = example["metadata"]["completion_token_ids"]
        prompt = render(tokenizer, messages, "test")
        assert ids == transformers_greedy(chat_model, prompt, 6)
        # teacher_tokens follow Kiln's tokenization of the conversation, not the sampled ids
        # (tests/jobs/test_generation_kiln.py checks them against Kiln's rules).
        kiln_ids = example["metadata"]["kiln_token_ids"]
        wanted = [kiln_ids[at] for at in example["metadata"]["kiln_action_positions"]]
        assert [t["token_id"] for t in example["teacher_tokens"]] == wanted
        assert all(len(token["top_logprobs"]) == 4 for token in example["teacher_tokens"])
        assert example["teacher_response"] == tokenizer.decode(ids, skip_special_tokens=True)


def test_text_only_generation_with_a_seed_and_the_cache_key(
    tmp_path: Path, chat_model: Path, teacher: ChatTeacher
) -> None:
    config = make_config(tmp_path, chat_model)
    corpus = tmp_path / "corpora" / "prompts.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"c{i}", "messages": m}) + "\n"
                              for i, m in enumerate(MESSAGES[:2])))  # fmt: skip
    with running_registry(config) as reg:
        reg.register("ref@chat", teacher.url, CHAT_MODEL_ID)
        fields = {"corpus": {"path": "prompts.jsonl"}, "max_tokens": 5, "temperature": 0.8,
                  "seed": 7}  # fmt: skip
        first = reg.wait(submit_generation(reg.http, "ref@chat", **fields).json()["id"])
        assert first["status"] == "succeeded", first
        # Text only: Kiln's production trainer refuses cross_entropy, and the job says so.
        assert first["generation"]["kiln_note"] == KILN_TEXT_ONLY_NOTE
        examples = _corpus(reg, first["id"])
        assert all("teacher_tokens" not in e for e in examples)
        # A different seed is a different cache key; an unseeded sampled job is not cached.
        other = reg.wait(submit_generation(reg.http, "ref@chat", **{**fields, "seed": 8})
                         .json()["id"])  # fmt: skip
        assert other["progress"]["cache_hits"] == 0
        unseeded = {**fields, "seed": None}
        free = reg.wait(submit_generation(reg.http, "ref@chat", **unseeded).json()["id"])
        assert free["status"] == "succeeded" and free["progress"]["cache_hits"] == 0
        with unit_of_work(reg.ctx.sessions) as session:
            assert session.query(GenerationCacheRow).count() == 4
        same = reg.wait(submit_generation(reg.http, "ref@chat", **fields).json()["id"])
        assert same["progress"]["cache_hits"] == 2
        assert _corpus(reg, same["id"]) != [] and [
            e["metadata"]["completion_token_ids"] for e in _corpus(reg, same["id"])
        ] == [e["metadata"]["completion_token_ids"] for e in examples]
