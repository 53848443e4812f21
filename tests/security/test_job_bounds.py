"""Issue 27 items 5 and 8 and job ownership on a real registry.

Item 5: a corpus path is judged lexically before the filesystem is touched, so
``/etc/passwd/../../<root>/good.jsonl`` (whose first step exists) and
``/etc/passwdX/../../<root>/good.jsonl`` (whose first step does not) get the
same ``400 job_invalid`` as a missing file.

Item 8: per-token and registry-wide quotas on active jobs and their tokens
(``429 job_queue_full`` with ``Retry-After``), and a deleted job's space
returned to the file system on SQLite.  Ownership: a ``jobs`` token sees,
cancels and deletes only its own jobs (another's is ``404 job_not_found``);
``admin`` sees all.  With ``embedded_workers = false`` submitted jobs stay
queued, so the quotas are exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kiln_registry.config.settings import KilnConfig
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
from tests.auth.support import bearer, create_token
from tests.jobs.harness import Controlled, Registry, make_config, running_registry, student_identity
from tests.probe.teacher_server import TeacherServer


@pytest.fixture(scope="module")
def jobs_registry(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[tuple[Registry, Path]]:
    tmp = tmp_path_factory.mktemp("job-bounds")
    config = make_config(tmp, tiny_model.path)
    identity = student_identity(student_vocab(tiny_model.path)[0])
    with TeacherServer(Controlled(identity)) as teacher, running_registry(config) as reg:
        reg.register("t", f"http://127.0.0.1:{teacher.port}", "teacher-tiny")
        yield reg, tmp


def _error(reg: Registry, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    response = reg.submit("t", 2, **body)
    return response.status_code, dict(response.json().get("error") or {})


def test_corpus_paths_outside_the_root_get_one_answer_whatever_exists(
    jobs_registry: tuple[Registry, Path],
) -> None:
    reg, tmp = jobs_registry
    root = (tmp / "corpora").resolve()
    (root / "good.jsonl").write_text(json.dumps({"id": "a", "token_ids": [1, 2]}) + "\n")
    status, _ = _error(reg, {"corpus": {"path": "good.jsonl"}})
    assert status == 201  # the file itself is a valid corpus
    missing = _error(reg, {"corpus": {"path": "missing.jsonl"}})
    assert missing[0] == 400 and "job.corpus_unavailable" in str(missing[1]["message"])
    existing_file = Path("/etc/passwd")
    assert existing_file.is_file()
    depth = "/".join([".."] * (len(existing_file.parts) - 1))
    for given in (
        f"{existing_file}/{depth}{root}/good.jsonl",  # first step exists (the old 201)
        f"{existing_file}X/{depth}{root}/good.jsonl",  # first step missing (the old 400)
        f"{root}/../{root.name}/good.jsonl",
        "sub/../good.jsonl",
        "../corpora/good.jsonl",
        str(existing_file),
        "/nonexistent/good.jsonl",
    ):
        assert _error(reg, {"corpus": {"path": given}}) == missing, given
    # An absolute path under the root, written without any '..', is still accepted.
    status, _ = _error(reg, {"corpus": {"path": f"{root}/good.jsonl"}})
    assert status == 201


QUOTAS = {"embedded_workers": False, "max_queued_jobs": 3, "max_queued_jobs_per_token": 2,
          "max_queued_tokens_per_token": 200_000}  # fmt: skip


def _secured(tmp: Path, student: Path, **jobs: object) -> tuple[KilnConfig, dict[str, str]]:
    config = make_config(tmp, student, **jobs)
    server = config.server.model_copy(update={"auth": "required"})
    config = config.model_copy(update={"server": server})
    db = tmp / "db" / "registry.db"
    names = {n: {"jobs", "read"} for n in "abc"} | {"root": {"admin"}}
    return config, {name: create_token(db, name, scopes) for name, scopes in names.items()}


@pytest.fixture(scope="module")
def owned(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[tuple[Registry, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("job-owners")
    config, tokens = _secured(tmp, tiny_model.path, **QUOTAS)
    identity = student_identity(student_vocab(tiny_model.path)[0])
    with TeacherServer(Controlled(identity)) as teacher, running_registry(config) as reg:
        body = {"alias": "t", "kind": "remote", "provider": "vllm", "model_id": "teacher-tiny",
                "url": f"http://127.0.0.1:{teacher.port}"}  # fmt: skip
        created = reg.http.post("/v1/teachers", json=body, headers=bearer(tokens["root"]))
        assert created.status_code == 200, created.text
        yield reg, tokens


def _submit(reg: Registry, token: str, sequences: int, length: int = 10) -> httpx.Response:
    body = {"kind": "teacher_scoring", "teacher": "t", "top_k": 2,
            "sequences": [[1] * length for _ in range(sequences)]}  # fmt: skip
    return reg.http.post("/v1/jobs", json=body, headers=bearer(token))


def _full(response: httpx.Response, rule: str) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == "60"
    error = response.json()["error"]
    assert (error["code"], error["rule"]) == ("job_queue_full", rule)


def test_queue_quotas_and_job_ownership(owned: tuple[Registry, dict[str, str]]) -> None:
    reg, t = owned
    a1, a2 = (_submit(reg, t["a"], 1).json()["id"] for _ in range(2))
    _full(_submit(reg, t["a"], 1), "job.max_queued_jobs_per_token")
    _full(_submit(reg, t["b"], 4000, 60), "job.max_queued_tokens_per_token")
    b1 = _submit(reg, t["b"], 1).json()["id"]
    _full(_submit(reg, t["c"], 1), "job.max_queued_jobs")  # 3 active jobs in all
    # Ownership: another token's job answers exactly like a job that does not exist.
    http, b = reg.http, bearer(t["b"])
    missing = http.get("/v1/jobs/job-" + "0" * 24, headers=b)
    assert missing.status_code == 404
    routes = [("GET", ""), ("POST", "/cancel"), ("DELETE", ""), ("GET", "/result")]
    for method, path in ((m, f"/v1/jobs/{a1}{suffix}") for m, suffix in routes):
        response = http.request(method, path, headers=b)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["code"] == "job_not_found"
    assert [j["id"] for j in http.get("/v1/jobs", headers=b).json()["jobs"]] == [b1]
    admin = http.get("/v1/jobs", headers=bearer(t["root"])).json()["jobs"]
    assert {j["id"] for j in admin} == {a1, a2, b1}
    assert http.get(f"/v1/jobs/{a1}", headers=bearer(t["root"])).status_code == 200
    # The owner cancels its job: the queue has room again, for anyone.
    cancelled = http.post(f"/v1/jobs/{a1}/cancel", headers=bearer(t["a"]))
    assert cancelled.json()["status"] == "cancelled", cancelled.text
    assert _submit(reg, t["c"], 1).status_code == 201
    assert http.delete(f"/v1/jobs/{a1}", headers=bearer(t["a"])).status_code == 200


def _file_bytes(database: Path) -> int:
    wal = database.with_name(database.name + "-wal")
    return database.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


@pytest.mark.sqlite_only("the file size of a SQLite database")
def test_a_deleted_jobs_space_goes_back_to_the_file_system(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config, tokens = _secured(tmp_path, tiny_model.path, embedded_workers=False)
    identity = student_identity(student_vocab(tiny_model.path)[0])
    database = tmp_path / "db" / "registry.db"
    root = bearer(tokens["root"])
    with TeacherServer(Controlled(identity)) as teacher, running_registry(config) as reg:
        body = {"alias": "t", "kind": "remote", "provider": "vllm", "model_id": "teacher-tiny",
                "url": f"http://127.0.0.1:{teacher.port}"}  # fmt: skip
        assert reg.http.post("/v1/teachers", json=body, headers=root).status_code == 200
        before = _file_bytes(database)
        job = _submit(reg, tokens["root"], 4000, 60).json()["id"]
        grown = _file_bytes(database) - before
        assert grown > 1_000_000  # 240,000 token ids stored as int32, plus their rows
        assert reg.http.post(f"/v1/jobs/{job}/cancel", headers=root).status_code == 200
        assert reg.http.delete(f"/v1/jobs/{job}", headers=root).status_code == 200
        assert _file_bytes(database) - before < grown // 4
