"""Issue 18 item 7: an OpenAPI document that generates a good client.

* every schema property has a description and every request and response
  body an example, and every example is a valid body of its pydantic model;
* ``openapi-python-client`` (offline, no post-hooks) generates a client from
  the app's own schema in ``tmp_path``; the test imports it and calls the
  teacher and job routes through it against a live registry, reading the
  NDJSON corpus line by line with the generated line models.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from kiln_registry.api import schemas
from kiln_registry.api.app import create_app
from kiln_registry.api.examples import body_examples, error_example, ndjson_example
from kiln_registry.api.routes import keys
from kiln_registry.wire import admin, corpus, system, teachers
from kiln_registry.wire import jobs as wire_jobs
from tests.client.conftest import ALIAS
from tests.jobs.harness import Registry

CONFIG = """\
project_name_override: kiln-registry-generated
package_name_override: kiln_generated
content_type_overrides:
  application/x-ndjson: application/octet-stream
post_hooks: []
"""
NO_ENV = {"trust_env": False}  # no proxy or certificate settings from the environment


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    schema: dict[str, Any] = create_app(None).openapi()
    return schema


def _media(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            for media_type, media in op.get("requestBody", {}).get("content", {}).items():
                yield f"{method} {path} request {media_type}", media
            for status, response in op["responses"].items():
                for media_type, media in response.get("content", {}).items():
                    yield f"{method} {path} {status} {media_type}", media


def test_every_property_has_a_description(document: dict[str, Any]) -> None:
    missing = [
        f"{name}.{prop}"
        for name, component in document["components"]["schemas"].items()
        for prop, spec in component.get("properties", {}).items()
        if not spec.get("description")
    ]
    assert missing == []


def test_every_parameter_and_operation_is_described(document: dict[str, Any]) -> None:
    missing = [
        f"{method} {path} {parameter['name']}"
        for path, operations in document["paths"].items()
        for method, op in operations.items()
        for parameter in [*op.get("parameters", []), {"name": "(operation)", **op}]
        if not parameter.get("description")
    ]
    assert missing == []


def test_every_body_has_an_example(document: dict[str, Any]) -> None:
    missing = [where for where, media in _media(document) if not media.get("example")
               and not media.get("examples")]  # fmt: skip
    assert missing == []


def _models() -> dict[str, type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for module in (schemas, teachers, system, wire_jobs, admin, keys, corpus):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel):
                found[value.__name__] = value
    return found


def test_every_example_is_a_valid_body(document: dict[str, Any]) -> None:
    models = _models()
    for name, example in body_examples().items():
        assert name in document["components"]["schemas"], name
        models[name].model_validate(example)
    system.ErrorResponse.model_validate(error_example("teacher_not_found"))
    lines = ndjson_example().splitlines()
    assert len(lines) == 3
    for line, model in zip(lines, corpus.LINE_MODELS, strict=True):
        model.model_validate_json(line)


def test_ndjson_result_is_described(document: dict[str, Any]) -> None:
    response = document["paths"]["/v1/jobs/{job_id}/result"]["get"]["responses"]["200"]
    media = response["content"]["application/x-ndjson"]
    assert (
        media["schema"]["format"] == "binary"
        and "TeacherScoresRow" in media["schema"]["description"]
    )
    refs = [item["$ref"].rsplit("/", 1)[1] for item in media["x-ndjson-line-schema"]["anyOf"]]
    assert refs == ["OffPolicyManifestLine", "TeacherScoresRow", "CorpusTrailerLine"]
    assert all(name in document["components"]["schemas"] for name in refs)


@pytest.fixture(scope="module")
def generated(document: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The generated package, imported from the temporary directory."""
    root = tmp_path_factory.mktemp("generated")
    (root / "openapi.json").write_text(json.dumps(document), encoding="utf-8")
    (root / "config.yaml").write_text(CONFIG, encoding="utf-8")
    tool = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    assert tool is not None, "openapi-python-client is in the test extra"
    done = subprocess.run(
        [tool, "generate", "--path", "openapi.json", "--config", "config.yaml", "--meta", "none",
         "--output-path", "kiln_generated"],
        cwd=root, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("kiln_generated")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.split(".")[0] == "kiln_generated"]:
            del sys.modules[name]


def _import(name: str) -> Any:
    return importlib.import_module(f"kiln_generated.{name}")


def test_generated_client_calls_teacher_routes(generated: Any, live: Registry) -> None:
    models = _import("models")
    teachers = {op: _import(f"api.teachers.{op}") for op in (
        "list_teachers", "get_teacher", "register_teacher", "probe_teacher",
        "list_teacher_receipts", "delete_teacher")}  # fmt: skip
    client = generated.Client(base_url=live.url, timeout=httpx.Timeout(60), httpx_args=NO_ENV)
    with client as c:
        listed = teachers["list_teachers"].sync(client=c)
        assert isinstance(listed, models.TeachersListResponse)
        assert ALIAS in [t.spec.alias for t in listed.teachers]
        entry = teachers["get_teacher"].sync(ALIAS, client=c)
        assert isinstance(entry, models.TeacherEntry) and entry.usable
        assert entry.status == models.TeacherStatus.VERIFIED
        report = teachers["probe_teacher"].sync(ALIAS, client=c)
        assert isinstance(report, models.ProbeReportPublic)
        assert report.outcome == models.ProbeOutcome.PASSED
        receipts = teachers["list_teacher_receipts"].sync(ALIAS, client=c)
        assert isinstance(receipts, models.ReceiptsResponse) and receipts.receipts
        body = models.RegisterTeacherRequest(
            alias="gen-fixture", kind=models.TeacherKind.FIXTURE, model_id="m"
        )
        made = teachers["register_teacher"].sync(client=c, body=body)
        assert isinstance(made, models.TeacherEntry) and made.spec.alias == "gen-fixture"
        gone = teachers["delete_teacher"].sync("gen-fixture", client=c)
        assert isinstance(gone, models.DeleteTeacherResponse)
        missing = teachers["get_teacher"].sync("gen-fixture", client=c)
        assert isinstance(missing, models.ErrorResponse)
        assert missing.error.code == "teacher_not_found"


def test_generated_client_calls_job_routes(generated: Any, live: Registry) -> None:
    models = _import("models")
    jobs = {op: _import(f"api.jobs.{op}") for op in (
        "submit_job", "get_job", "list_jobs", "cancel_job", "get_job_result")}  # fmt: skip
    client = generated.Client(base_url=live.url, timeout=httpx.Timeout(60), httpx_args=NO_ENV)
    with client as c:
        body = models.JobCreate(kind="teacher_scoring", teacher=ALIAS, top_k=2,
                                sequences=[[1, 2, 3], [4, 5]])  # fmt: skip
        job = jobs["submit_job"].sync(client=c, body=body)
        assert isinstance(job, models.JobPublic), job
        deadline = time.monotonic() + 120
        while job.status not in (models.JobStatus.SUCCEEDED, models.JobStatus.FAILED):
            assert time.monotonic() < deadline, job
            time.sleep(0.05)
            job = jobs["get_job"].sync(job.id, client=c)
        assert job.status == models.JobStatus.SUCCEEDED
        listed = jobs["list_jobs"].sync(client=c, limit=5)
        assert job.id in [j.id for j in listed.jobs]
        conflict = jobs["cancel_job"].sync(job.id, client=c)
        assert isinstance(conflict, models.ErrorResponse)
        assert conflict.error.code == "job_conflict"
        result = jobs["get_job_result"].sync(job.id, client=c)
        lines = result.payload.read().decode("utf-8").splitlines()
    manifest = models.OffPolicyManifestLine.from_dict(json.loads(lines[0]))
    assert manifest.teacher_identity.served_model_id
    rows = [models.TeacherScoresRow.from_dict(json.loads(line)) for line in lines[1:-1]]
    assert [r.id for r in rows] == ["0", "1"] and all(len(r.topk_ids[0]) == 2 for r in rows)
    trailer = models.CorpusTrailerLine.from_dict(json.loads(lines[-1]))
    assert len(trailer.kiln_corpus_trailer_v1.signature) == 128
