"""Credentials over real TLS: a trustme CA, the reference teacher behind uvicorn's ssl options.

The credential's origin is ``https://localhost:<port>``; ``[server]
teacher_ca_file`` names the test CA.  The bearer key lives only in
``KEY_ENV`` (read by both the registry and the reference teacher at request
time).  Also: origin binding, unknown ids, a variable that disappears or
turns blank after start-up, and a teacher that reflects the key it was sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI, Request, Response

from kiln_registry.api.context import RegistryContext
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.report import ProbeReport
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.teachers.probing import scrubbed_report
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import KEY_ENV, SECRET, SERVED, TlsFiles, TlsTeacher
from tests.api.support import (
    RegistryServer,
    error_of,
    remote,
    run_registry,
    serve_tls,
    write_config,
)
from tests.probe.teacher_server import completion_body

pytestmark = pytest.mark.secret_env(KEY_ENV)
Reference = tuple[ReferenceTeacher, TeacherIdentity]


def _config(tmp_path: Path, student: Path, origin: str, ca: Path | None) -> Path:
    server = {"teacher_ca_file": ca} if ca is not None else {}
    return write_config(tmp_path, student=student, server=server,
                        credentials={"tls-teacher": (origin, KEY_ENV)})  # fmt: skip


@pytest.fixture
def tls_registry(
    tmp_path: Path,
    tiny_model: TinyModel,
    tls_teacher: TlsTeacher,
    tls_files: TlsFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[RegistryServer]:
    monkeypatch.setenv(KEY_ENV, SECRET)
    config = _config(tmp_path, tiny_model.path, tls_teacher.origin, tls_files.ca_pem)
    with run_registry(config) as server:
        yield server


def test_tls_registration_with_a_credential(
    tls_registry: RegistryServer, tls_teacher: TlsTeacher, reference: Reference
) -> None:
    body = remote("tls@vllm", tls_teacher.url, credential_id="tls-teacher")
    with tls_registry.client() as http:
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == 200, response.text
        entry = response.json()
        assert entry["usable"] is True and entry["identity_revision"] == reference[1].revision()
        assert entry["spec"]["credential_id"] == "tls-teacher"
        assert entry["spec"]["url"] == tls_teacher.url
        probed = http.post("/v1/teachers/tls@vllm/probe").json()
        assert probed["authenticated"] is True and probed["outcome"] == "passed"
        receipts = http.get("/v1/teachers/tls@vllm/receipts").text
    assert SECRET not in response.text + json.dumps(probed) + receipts


def test_untrusted_certificate_is_refused(
    tmp_path: Path, tiny_model: TinyModel, tls_teacher: TlsTeacher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    config = _config(tmp_path, tiny_model.path, tls_teacher.origin, None)
    with run_registry(config) as registry, registry.client() as http:
        body = remote("tls@vllm", tls_teacher.url, credential_id="tls-teacher")
        response = http.post("/v1/teachers", json=body)
        assert http.get("/v1/teachers/tls@vllm").status_code == 404
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "teacher_identity_probe_failed"
    # Issue 15: a TLS refusal reads like any other failure before an HTTP answer; the
    # certificate detail is in the server log, the hint still names teacher_ca_file.
    assert "probe.unreachable" in error["message"]
    assert "teacher_ca_file" in error["hint"]


def test_teacher_error_body_is_withheld_for_authenticated_requests(
    tls_registry: RegistryServer, tls_teacher: TlsTeacher
) -> None:
    # A model the teacher does not serve: it answers 404 with a body naming it.
    body = remote(
        "wrong-model", tls_teacher.url, model_id="not-served", credential_id="tls-teacher"
    )
    with tls_registry.client() as http:
        response = http.post("/v1/teachers", json=body)
    assert response.status_code == 502
    message = error_of(response)["message"]
    assert "HTTP 404" in message and "not shown to the caller" in message  # issue 27 item 13
    assert "not-served" not in message


@pytest.mark.parametrize(
    ("url", "credential", "rule"),
    [
        # another host: refused earlier, by the default teacher_hosts (issue 27 item 13)
        ("https://teacher.example.com:8443/v1", "tls-teacher", "teacher.host_not_allowed"),
        ("http://127.0.0.1:{port}/v1", "tls-teacher", "credential.origin_mismatch"),
        ("https://127.0.0.1:{port}/v1", "tls-teacher", "credential.origin_mismatch"),
        ("https://localhost:{port}/v1", "nope", "credential.unknown"),
    ],
)
def test_credential_is_bound_to_its_exact_origin(
    tls_registry: RegistryServer, tls_teacher: TlsTeacher, url: str, credential: str, rule: str
) -> None:
    body = remote("bound", url.format(port=tls_teacher.port), credential_id=credential)
    with tls_registry.client() as http:
        response = http.post("/v1/teachers", json=body)
        assert http.get("/v1/teachers/bound").status_code == 404
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "teacher_registration_invalid"
    assert rule in error["message"] and error["rule"] == rule


@pytest.mark.parametrize(("value", "rule"), [(None, "secret.missing"), ("   ", "secret.blank")])
def test_secret_variable_that_changes_after_startup_is_refused_at_request_time(
    tls_registry: RegistryServer,
    tls_teacher: TlsTeacher,
    monkeypatch: pytest.MonkeyPatch,
    value: str | None,
    rule: str,
) -> None:
    with tls_registry.client() as http:
        body = remote("tls@vllm", tls_teacher.url, credential_id="tls-teacher")
        assert http.post("/v1/teachers", json=body).status_code == 200
        if value is None:
            monkeypatch.delenv(KEY_ENV)
        else:
            monkeypatch.setenv(KEY_ENV, value)
        again = http.post("/v1/teachers", json=body | {"alias": "second"})
        probe = http.post("/v1/teachers/tls@vllm/probe")
    for response in (again, probe):
        assert response.status_code == 400, response.text
        error = error_of(response)
        assert error["code"] == "teacher_registration_invalid"
        assert rule in error["message"] and KEY_ENV in error["message"]
        assert SECRET not in response.text


def _echo_app(identity: TeacherIdentity) -> FastAPI:
    """A hostile teacher: reflects the Authorization header it was sent into its answer."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def complete(request: Request) -> Response:
        sent = request.headers.get("authorization", "")
        req = json.loads(await request.body())
        if req["model"] == "echo-500":
            return Response(content=f'{{"error":"{sent}"}}', status_code=500)
        raw = completion_body(
            model=SERVED,
            fingerprint=identity.fingerprint(),
            prompt=req["prompt"],
            k=req["prompt_logprobs"],
        )
        doc = json.loads(raw)
        doc["object"] = sent.removeprefix("Bearer ")
        return Response(content=json.dumps(doc), media_type="application/json")

    return app


def test_a_reflected_key_never_reaches_a_response(
    tmp_path: Path,
    tiny_model: TinyModel,
    tls_files: TlsFiles,
    reference: Reference,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    with serve_tls(_echo_app(reference[1]), tls_files.cert_pem) as port:
        origin = f"https://localhost:{port}"
        config = _config(tmp_path, tiny_model.path, origin, tls_files.ca_pem)
        with run_registry(config) as registry, registry.client() as http:
            responses = [
                http.post("/v1/teachers", json=remote(f"echo{i}", origin, model_id=model,
                                                      credential_id="tls-teacher"))
                for i, model in enumerate([SERVED, "echo-500"])
            ]  # fmt: skip
    for response in responses:
        assert response.status_code == 502, response.text
        assert SECRET not in response.text and SECRET not in str(response.headers)
    # the probe never quotes an authenticated response, and the API no teacher text at all
    assert "not shown to the caller" in responses[0].text


def test_stored_reports_are_scrubbed(
    tmp_path: Path, tiny_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    config = _config(tmp_path, tiny_model.path, "https://teacher.example.com", None)
    with run_registry(config) as registry:
        ctx: RegistryContext = registry.ctx
        report = ProbeReport(
            url="https://teacher.example.com/v1/completions",
            model_id="m",
            authenticated=True,
            failure_message=f"object was {SECRET!r}",
        )
        scrubbed = json.dumps(scrubbed_report(report, ctx.config.secret_env_names()))
    assert SECRET not in scrubbed and "[redacted]" in scrubbed


def test_scoring_job_over_tls_with_a_credential(
    tls_registry: RegistryServer, tls_teacher: TlsTeacher, reference: Reference
) -> None:
    # The job's scoring requests go through probe.wire, not httpx: the same CA file,
    # the same bearer key read at request time, and the key in no output.
    body = remote("tls-job@vllm", tls_teacher.url, credential_id="tls-teacher")
    sequences = [[1, 2, 3, 4, 5], [9, 8, 7], [4, 4, 4, 4, 4, 4, 4]]
    with tls_registry.client() as http:
        assert http.post("/v1/teachers", json=body).status_code == 200
        submitted = http.post(
            "/v1/jobs",
            json={"kind": "teacher_scoring", "teacher": "tls-job@vllm", "top_k": 4,
                  "sequences": sequences},
        )  # fmt: skip
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        deadline = time.monotonic() + 60
        while (job := http.get(f"/v1/jobs/{job_id}").json())["status"] not in (
            "succeeded", "failed", "cancelled",
        ):  # fmt: skip
            assert time.monotonic() < deadline, job
            time.sleep(0.05)
        corpus = http.get(f"/v1/jobs/{job_id}/result").text
    assert job["status"] == "succeeded", job
    assert job["progress"]["scored"] == len(sequences)
    lines = corpus.splitlines()
    assert len(lines) == 1 + len(sequences) + 1  # manifest, rows, signature trailer
    assert "kiln.corpus-trailer.v1" in json.loads(lines[-1])
    assert json.loads(lines[0])["teacher_identity"] == json.loads(reference[1].canonical_bytes())
    assert SECRET not in json.dumps(job) + corpus
