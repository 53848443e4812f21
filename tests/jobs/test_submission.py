"""Submission over HTTP: what is refused before a job is queued, and with which code and rule."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.harness import Controlled, Registry, make_config, running_registry, student_identity
from tests.probe.teacher_server import TeacherServer


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel, student_vocab_sha256: str
) -> Iterator[tuple[Registry, Path]]:
    tmp = tmp_path_factory.mktemp("submission")
    config = make_config(tmp, tiny_model.path)
    with (
        TeacherServer(Controlled(student_identity(student_vocab_sha256))) as teacher,
        running_registry(config) as reg,
    ):
        reg.register("t", f"http://127.0.0.1:{teacher.port}", "teacher-tiny")
        fixture = {"alias": "fix", "kind": "fixture", "model_id": "m"}
        assert reg.http.post("/v1/teachers", json=fixture).status_code == 200
        yield reg, tmp


def _corpus(root: Path, name: str, lines: list[object]) -> Path:
    path = root / "corpora" / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def _refused(reg: Registry, status: int, code: str, **body: object) -> dict[str, object]:
    response = reg.submit(**{"teacher": "t", "top_k": 2, **body})  # type: ignore[arg-type]
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return dict(error)


def test_a_valid_corpus_is_copied_into_the_job(setup: tuple[Registry, Path]) -> None:
    reg, tmp = setup
    path = _corpus(
        tmp, "ok.jsonl", [{"id": "a", "token_ids": [1, 2]}, {"id": "b", "token_ids": [3]}]
    )
    response = reg.submit("t", 2, corpus={"path": "ok.jsonl"})
    assert response.status_code == 201, response.text
    job = response.json()
    assert (
        job["source"]["kind"] == "corpus" and job["source"]["path"] == path.name
    )  # relative to [jobs] corpus_root
    path.write_text("changed after submission\n")  # the job holds its own copy
    assert reg.wait(job["id"])["status"] == "succeeded"


@pytest.mark.parametrize(
    ("lines", "rule", "where"),
    [
        (
            [{"id": "a", "token_ids": [1, 2]}, {"id": "b", "token_ids": [1, 512]}],
            "job.token_id",
            "line 2",
        ),
        ([{"id": "a", "token_ids": [-1]}], "job.token_id", "line 1"),
        ([{"id": "a", "token_ids": list(range(63))}], "job.sequence_length", "line 1"),
        (
            [{"id": "a", "token_ids": [1]}, {"id": "a", "token_ids": [2]}],
            "job.duplicate_id",
            "line 2",
        ),
        ([{"id": "a", "token_ids": [True, 2]}], "job.token_type", "line 1"),
        ([{"id": "a", "token_ids": [1.0]}], "job.token_type", "line 1"),
        ([{"id": "a", "tokens": [1]}], "job.corpus_keys", "line 1"),
        ([{"id": "a", "token_ids": []}], "job.sequence_empty", "line 1"),
        ([{"id": 7, "token_ids": [1]}], "job.sequence_id", "line 1"),
    ],
)
def test_bad_corpus_lines_are_refused_naming_the_line_and_rule(
    setup: tuple[Registry, Path], lines: list[object], rule: str, where: str
) -> None:
    reg, tmp = setup
    _corpus(tmp, "bad.jsonl", lines)
    error = _refused(reg, 400, "job_invalid", corpus={"path": "bad.jsonl"})
    assert str(error["message"]).startswith(f"job.{rule.split('.')[1]}: corpus {where}:")


def test_malformed_corpus_bytes_are_refused(setup: tuple[Registry, Path]) -> None:
    reg, tmp = setup
    cases = {
        b'{"id":"a","token_ids":[1]}\n\n{"id":"b","token_ids":[2]}\n': "job.corpus_blank_line",
        b'{"id":"a","id":"b","token_ids":[1]}\n': "job.corpus_json",
        b'{"id":"a","token_ids":[NaN]}\n': "job.corpus_json",
        b"\xff\xfe\n": "job.corpus_json",
        b"": "job.empty",
    }
    for raw, rule in cases.items():
        (tmp / "corpora" / "raw.jsonl").write_bytes(raw)
        error = _refused(reg, 400, "job_invalid", corpus={"path": "raw.jsonl"})
        assert str(error["message"]).startswith(rule + ":"), (raw, error)


def test_corpus_paths_outside_the_root_are_refused_symlinks_too(
    setup: tuple[Registry, Path],
) -> None:
    reg, tmp = setup
    outside = tmp / "outside.jsonl"
    outside.write_text(json.dumps({"id": "a", "token_ids": [1]}) + "\n")
    (tmp / "corpora" / "escape.jsonl").unlink(missing_ok=True)
    os.symlink(outside, tmp / "corpora" / "escape.jsonl")
    (tmp / "corpora" / "sub").mkdir(exist_ok=True)
    if not (tmp / "corpora" / "sub" / "up").exists():
        os.symlink(tmp, tmp / "corpora" / "sub" / "up")
    for given in (str(outside), "../outside.jsonl", "escape.jsonl", "sub/up/outside.jsonl"):
        error = _refused(reg, 400, "job_invalid", corpus={"path": given})
        assert "job.corpus_unavailable" in str(error["message"]), given
    # A missing file gets the very same refusal (issue 15: no existence oracle).
    missing = _refused(reg, 400, "job_invalid", corpus={"path": "missing.jsonl"})
    assert missing == _refused(reg, 400, "job_invalid", corpus={"path": str(outside)})
    if not (tmp / "corpora" / "fifo").exists():
        os.mkfifo(tmp / "corpora" / "fifo")
    error = _refused(reg, 400, "job_invalid", corpus={"path": "fifo"})
    assert "job.corpus_not_regular" in str(error["message"])


def test_teacher_and_request_refusals(setup: tuple[Registry, Path]) -> None:
    reg, _ = setup
    _refused(reg, 400, "teacher_not_registered", teacher="nobody", sequences=[[1]])
    _refused(reg, 409, "teacher_identity_required", teacher="fix", sequences=[[1]])
    error = _refused(reg, 400, "job_invalid", top_k=9, sequences=[[1]])
    assert "job.top_k" in str(error["message"])
    _refused(reg, 400, "job_invalid", sequences=[[1, True]])
    _refused(reg, 400, "job_invalid", sequences=[[1]], corpus={"path": "x"})
    _refused(reg, 400, "job_invalid", sequences=[[1]], extra=1)
    _refused(reg, 400, "job_invalid", sequences=[])
    _refused(reg, 400, "job_invalid", sequences=[[1, 600]])
    bad_id = reg.http.get("/v1/jobs/job-nope")
    assert bad_id.status_code == 400 and bad_id.json()["error"]["code"] == "job_invalid"
    missing = reg.http.get("/v1/jobs/job-" + "0" * 24)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"


def test_corpus_jobs_need_a_configured_root(
    tmp_path: Path, tiny_model: TinyModel, student_vocab_sha256: str
) -> None:
    config = make_config(tmp_path, tiny_model.path)
    config = config.model_copy(
        update={"jobs": config.jobs.model_copy(update={"corpus_root": None})}
    )
    with (
        TeacherServer(Controlled(student_identity(student_vocab_sha256))) as teacher,
        running_registry(config) as reg,
    ):
        reg.register("t", f"http://127.0.0.1:{teacher.port}", "teacher-tiny")
        error = _refused(reg, 400, "job_invalid", corpus={"path": "a.jsonl"})
        assert "job.corpus_root" in str(error["message"])


def test_list_and_filter_jobs(setup: tuple[Registry, Path]) -> None:
    reg, _ = setup
    job = reg.submit("t", 1, sequences=[[1, 2, 3]]).json()
    reg.wait(job["id"])
    listed = reg.http.get("/v1/jobs", params={"status": "succeeded", "limit": 5}).json()["jobs"]
    assert job["id"] in [j["id"] for j in listed] and len(listed) <= 5
    assert all(j["status"] == "succeeded" for j in listed)
    assert reg.http.get("/v1/jobs", params={"status": "bogus"}).status_code == 400
