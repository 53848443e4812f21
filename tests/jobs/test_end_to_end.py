"""A job submitted over HTTP runs against the reference teacher and writes a verified corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.lease_repository import DeviceLeases
from kiln_registry.jobs.core.signing import parse_keys
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.jobs.scoring import cache as score_cache
from kiln_registry.jobs.scoring.sources import token_ids_sha256
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher
from tests.jobs.harness import make_config, running_registry

SEQUENCES = [[5, 9, 11, 40], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 9, 11, 40, 41]]


def _reference_rows(teacher: ReferenceTeacher, tokens: list[int], k: int) -> dict[str, object]:
    """What the reference teacher says for ``tokens`` + probe token, asked directly."""
    import httpx

    body = {"model": REFERENCE_MODEL_ID, "prompt": [*tokens, tokens[-1]], "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": k, "n": 1, "stream": False,
            "add_special_tokens": False}  # fmt: skip
    answer = httpx.post(teacher.url + "/v1/completions", json=body, timeout=30.0).json()
    return dict(answer["choices"][0])


def test_a_job_runs_end_to_end_and_writes_a_verified_identity_bound_corpus(
    tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    config = make_config(tmp_path, tiny_model.path, concurrency=2)
    with running_registry(config) as reg:
        entry = reg.register("ref@tiny", reference_teacher.url, REFERENCE_MODEL_ID)
        submitted = reg.submit("ref@tiny", 4, sequences=SEQUENCES)
        assert submitted.status_code == 201, submitted.text
        job = reg.wait(submitted.json()["id"])
        assert job["status"] == "succeeded", job
        stamps = job["timestamps"]
        order = ["claimed_at", "spec_checked_at", "probed_at", "leased_at", "scoring_started_at",
                 "finished_at"]  # fmt: skip
        assert all(stamps[name] for name in order)
        assert [stamps[name] for name in order] == sorted(stamps[name] for name in order)
        assert job["progress"] == {"total": 4, "done": 4, "scored": 4, "cache_hits": 0,
                                   "requests": 4, "retries": 0}  # fmt: skip
        assert job["device"] == "cpu" and job["identity_revision"] == entry["identity_revision"]
        result = reg.http.get(f"/v1/jobs/{job['id']}/result")
        keys = parse_keys(reg.http.get("/v1/keys").json(), "GET /v1/keys")
        assert result.status_code == 200
        assert result.headers["x-kiln-result-sha256"] == job["result"]["sha256"]
        with unit_of_work(reg.ctx.sessions) as session:
            assert DeviceLeases(session, ("cpu",)).count() == 0
            assert score_cache.count(session, reference_teacher.identity.digest()) == 4

    lines = result.content.decode().splitlines()
    assert lines[0] == entry["off_policy_manifest"]
    corpus = tmp_path / "result.jsonl"
    corpus.write_bytes(result.content)
    summary = verify_corpus(corpus, keys)
    assert (summary.job_id, summary.teacher, summary.top_k) == (job["id"], "ref@tiny", 4)
    assert summary.sequences == 4

    rows = [json.loads(line) for line in lines[1:-1]]  # the last line is the trailer
    assert [r["id"] for r in rows] == ["0", "1", "2", "3"]
    for row, tokens in zip(rows, SEQUENCES, strict=True):
        assert row["token_ids"] == tokens
        assert row["token_ids_sha256"] == token_ids_sha256(tokens)
        assert len(row["topk_ids"]) == len(tokens) and len(row["token_logprobs"]) == len(tokens) - 1
        direct = _reference_rows(reference_teacher, tokens, 4)
        plp = direct["prompt_logprobs"]
        assert isinstance(plp, list)
        for i, entries in enumerate(plp[1:]):
            top = sorted(entries.items(), key=lambda kv: kv[1]["rank"])[: 4 + 1]
            top_ids = [int(t) for t, v in top if v["rank"] <= 4]
            assert row["topk_ids"][i] == top_ids
            expected = [np.float32(v["logprob"]) for _, v in top if v["rank"] <= 4]
            assert np.array_equal(np.float32(row["topk_logprobs"][i]), np.array(expected))
