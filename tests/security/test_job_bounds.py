"""Issue 27 items 5 and 8 on a real registry: the corpus-path oracle and bounded job growth.

Item 5: a corpus path is judged lexically before the filesystem is touched, so
``/etc/passwd/../../<root>/good.jsonl`` (whose first step exists) and
``/etc/passwdX/../../<root>/good.jsonl`` (whose first step does not) get the
same ``400 job_invalid`` as a missing file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
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
