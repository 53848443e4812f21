"""Registering teachers over real loopback HTTP against the reference teacher.

The registry runs in-process under uvicorn (``create_app``), the teachers are
the reference teacher on the session's tiny models or the controllable
``TeacherServer`` from the probe tests; every exchange is a real socket.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.db.opening import open_database
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel, build_tokenizer
from tests.api.conftest import SERVED
from tests.api.support import RegistryServer, error_of, remote, run_registry, write_config
from tests.helpers import captured, serve_app
from tests.probe.teacher_server import Reply, Request, TeacherServer, completion_body

Reference = tuple[ReferenceTeacher, TeacherIdentity]


def _check_verified_entry(
    entry: dict[str, object], alias: str, url: str, ident: TeacherIdentity
) -> None:
    assert entry["status"] == "verified" and entry["usable"] is True
    assert entry["identity_revision"] == ident.revision()
    assert str(entry["identity_revision"]).startswith("sha256:")
    assert entry["off_policy_manifest"] == off_policy_manifest(ident)
    assert "status_message" not in entry  # optional: omitted, never null (Kiln's schema)
    assert entry["spec"] == {
        "alias": alias, "kind": "remote", "provider": "vllm", "model_id": SERVED,
        "max_top_k": 8, "vocab_size": 512, "supports_full_vocab": False,
        "tokenizer_hash": ident.tokenizer_vocab_sha256, "identity": ident.to_dict(),
        "url": url, "notes": "tiny", "adapter": None,
    }  # fmt: skip
    assert entry["capabilities"] == {
        "teacher_id": alias, "vocab_size": 512, "max_top_k": 8, "supports_full_vocab": False,
        "supports_batched": True, "tokenizer_hash": ident.tokenizer_vocab_sha256,
    }  # fmt: skip


def test_register_list_show_probe_receipts_delete(
    registry: RegistryServer, teacher_url: str, reference: Reference
) -> None:
    ident = reference[1]
    with registry.client() as http:
        created = http.post("/v1/teachers", json=remote("tiny@vllm", teacher_url, notes="tiny"))
        assert created.status_code == 200, created.text
        _check_verified_entry(created.json(), "tiny@vllm", teacher_url, ident)
        assert http.get("/v1/teachers").json() == {"teachers": [created.json()]}
        assert http.get("/v1/teachers/tiny@vllm").json() == created.json()

        probed = http.post("/v1/teachers/tiny@vllm/probe")
        assert probed.status_code == 200, probed.text
        report = probed.json()
        assert report["outcome"] == "passed" and report["k_values"] == [1, 8, 9]
        assert report["identity_digest"] == ident.digest() and report["failure"] is None
        assert [a["status_code"] for a in report["attempts"]] == [200, 200, 400]
        assert http.get("/v1/teachers/tiny@vllm").json() == created.json()  # unchanged

        receipts = http.get("/v1/teachers/tiny@vllm/receipts").json()["receipts"]
        assert [r["outcome"] for r in receipts] == ["passed", "passed"]
        assert receipts[0]["id"] > receipts[1]["id"]  # newest first
        assert {r["identity_revision"] for r in receipts} == {ident.revision()}

        again = http.post("/v1/teachers", json=remote("tiny@vllm", teacher_url))
        assert again.status_code == 409
        assert error_of(again)["code"] == "teacher_alias_exists"
        assert "delete" in error_of(again)["hint"]

        assert http.delete("/v1/teachers/tiny@vllm").json() == {
            "status": "deleted",
            "alias": "tiny@vllm",
        }
        for response in (http.get("/v1/teachers/tiny@vllm"), http.delete("/v1/teachers/tiny@vllm")):
            assert response.status_code == 404
            assert error_of(response)["code"] == "teacher_not_found"
        # Receipts outlive the alias (audit); the alias stays reserved (issue 15) until an
        # admin releases it, then it can be registered afresh.
        assert len(http.get("/v1/teachers/tiny@vllm/receipts").json()["receipts"]) == 2
        reserved = http.post("/v1/teachers", json=remote("tiny@vllm", teacher_url))
        assert reserved.status_code == 409
        assert error_of(reserved)["code"] == "teacher_alias_reserved"
        assert http.post("/v1/admin/aliases/tiny@vllm/release").status_code == 200
        assert http.post("/v1/teachers", json=remote("tiny@vllm", teacher_url)).status_code == 200


def test_fixture_teacher_is_configured_and_usable(registry: RegistryServer) -> None:
    """As Kiln reports a fixture (teachers.rs teacher_entry); see tests/kiln_conformance."""
    with registry.client() as http:
        body = {"alias": "demo-fixture", "kind": "fixture", "model_id": "fixture-model"}
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == 200, response.text
        entry = response.json()
        assert entry["status"] == "configured" and entry["usable"] is True
        assert entry["capabilities"] is None and "identity_revision" not in entry
        assert entry["spec"]["model_id"] == "fixture-model" and "identity" not in entry["spec"]
        probe = http.post("/v1/teachers/demo-fixture/probe")
        assert probe.status_code == 409
        assert error_of(probe)["code"] == "teacher_identity_required"


def test_local_kind_with_a_missing_adapter_is_refused_clearly(registry: RegistryServer) -> None:
    with registry.client() as http:
        body = {"alias": "local-one", "kind": "local", "adapter": "prior-self"}
        response = http.post("/v1/teachers", json=body)
        assert http.get("/v1/teachers").json() == {"teachers": []}
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "teacher_registration_invalid"
    assert "teacher adapter `prior-self` not found" in error["message"]


def _refused_without_trace(
    registry: RegistryServer, body: dict[str, object], status: int, code: str
) -> dict[str, str]:
    with registry.client() as http:
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == status, response.text
        error = error_of(response)
        assert error["code"] == code
        alias = str(body["alias"])
        assert http.get(f"/v1/teachers/{alias}").status_code == 404
        assert http.get(f"/v1/teachers/{alias}/receipts").json() == {"receipts": []}
    return error


def test_padded_width_teacher_does_not_match_the_student(
    registry: RegistryServer, tiny_model_padded: TinyModel
) -> None:
    teacher, _ = load_reference_teacher(
        tiny_model_padded.path, served_model_id=SERVED, max_top_k=8, max_model_len=64
    )
    with serve_app(create_reference_app(teacher, api_key_env=None)) as url:
        error = _refused_without_trace(
            registry, remote("padded", url), 409, "teacher_identity_mismatch"
        )
    assert "probe.student_" in error["message"]


def test_teacher_with_another_tokenizer_is_refused(
    tmp_path: Path, tiny_model: TinyModel, teacher_url: str
) -> None:
    student = tmp_path / "student"
    student.mkdir()
    shutil.copy(tiny_model.path / "config.json", student / "config.json")
    build_tokenizer(student, vocab_size=500)
    with run_registry(write_config(tmp_path, student=student)) as registry:
        error = _refused_without_trace(
            registry, remote("other-vocab", teacher_url), 409, "teacher_identity_mismatch"
        )
    assert "probe.student_vocab" in error["message"]


def test_stock_vllm_fingerprint_is_refused(registry: RegistryServer) -> None:
    stock = captured("pl1")[0].split(b'"system_fingerprint":"')[1].split(b'"')[0].decode()
    assert stock.startswith("vllm-")

    def handler(request: Request, index: int) -> Reply:
        k = int(str(request.json()["prompt_logprobs"]))
        return Reply(body=completion_body(model=SERVED, fingerprint=stock, prompt=[0, 0], k=k))

    with TeacherServer(handler) as teacher:
        base = f"http://127.0.0.1:{teacher.port}"
        error = _refused_without_trace(
            registry, remote("stock", base), 502, "teacher_identity_probe_failed"
        )
    assert "probe.fingerprint_stock" in error["message"]


def test_redirect_from_the_teacher_is_refused(registry: RegistryServer, teacher_url: str) -> None:
    target = teacher_url + "/v1/completions"

    def handler(request: Request, index: int) -> Reply:
        return Reply(status=307, headers={"location": target})

    with TeacherServer(handler) as teacher:
        error = _refused_without_trace(
            registry, remote("moved", teacher.url), 502, "teacher_identity_probe_failed"
        )
        assert len(teacher.requests) == 1
    assert "probe.redirect" in error["message"]


def test_unreachable_teacher_fails_the_probe(registry: RegistryServer, free_port: int) -> None:
    body = remote("gone", f"http://127.0.0.1:{free_port}")
    error = _refused_without_trace(registry, body, 502, "teacher_identity_probe_failed")
    assert "probe.unreachable" in error["message"]  # issue 15: one error, no oracle


def test_teacher_error_body_is_not_echoed(registry: RegistryServer) -> None:
    def handler(request: Request, index: int) -> Reply:
        return Reply(
            status=500,
            body=b'{"error":{"message":"' + b"x" * 5000 + b'","type":"E","param":null,"code":500}}',
        )

    with TeacherServer(handler) as teacher:
        error = _refused_without_trace(
            registry, remote("noisy", teacher.url), 502, "teacher_identity_probe_failed"
        )
    # issue 27 item 13: the rule and the status only; the text stays in the receipt and log
    assert "xxxx" not in error["message"] and "HTTP 500" in error["message"]
    assert "probe.http_status" in error["message"]


@pytest.fixture(scope="module")
def any_host_registry(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[RegistryServer]:
    """teacher_hosts = ["*"]: the URL rules below the default host rule (issue 27 item 13)."""
    directory = tmp_path_factory.mktemp("any-host")
    config = write_config(directory, student=tiny_model.path, server={"teacher_hosts": ["*"]})
    with run_registry(config) as server:
        yield server


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://10.1.2.3:8000", "url.http_not_loopback"),
        ("https://10.1.2.3:8000", "credential.loopback_url_required"),
        ("https://teacher.example.com", "credential.loopback_url_required"),
        ("https://127.0.0.1.nip.io:8000", "credential.loopback_url_required"),
        ("http://user:pw@127.0.0.1:8000", "url.userinfo"),
        ("http://127.0.0.1:8000/v1?key=abc", "url.query"),
    ],
)
def test_credential_free_teacher_must_be_an_exact_loopback_url(
    any_host_registry: RegistryServer, url: str, rule: str
) -> None:
    error = _refused_without_trace(
        any_host_registry, remote("offhost", url), 400, "teacher_registration_invalid"
    )
    assert rule in error["message"]
    assert "pw@" not in error["message"] and "key=abc" not in error["message"]


def test_network_bound_server_refuses_credential_free_teachers(
    tmp_path: Path, tiny_model: TinyModel, teacher_url: str
) -> None:
    # The config says 0.0.0.0; the test server itself still listens on loopback.
    # auth = "off" explicitly: this test is about teacher URLs, not tokens (tests/auth).
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "off"})
    with run_registry(config, host="0.0.0.0") as registry:
        error = _refused_without_trace(
            registry, remote("loop", teacher_url), 400, "teacher_registration_invalid"
        )
    assert "credential.loopback_server_required" in error["message"]


def test_reads_do_not_wait_for_a_writer(registry: RegistryServer) -> None:
    """GETs BEGIN DEFERRED: a held write lock (SQLite's BEGIN IMMEDIATE, PostgreSQL's
    advisory write lock: the product's own write transaction) does not block them."""
    with registry.client(timeout=4) as http:
        body = {"alias": "f1", "kind": "fixture", "model_id": "m"}
        assert http.post("/v1/teachers", json=body).status_code == 200
        engine = open_database(registry.ctx.config.server)
        try:
            with engine.connect() as writer, writer.begin():  # the write lock, held
                started = time.monotonic()
                for path in ("/v1/teachers/f1", "/v1/teachers", "/v1/teachers/f1/receipts",
                             "/ready"):  # fmt: skip
                    assert http.get(path).status_code == 200, path
                # 5 s is SQLite's busy timeout: an IMMEDIATE reader would have waited for it
                # (PostgreSQL: a reader taking the write lock would wait until the timeout).
                assert time.monotonic() - started < 4
        finally:
            engine.dispose()


def test_oversized_request_bodies_are_refused_before_reading(registry: RegistryServer) -> None:
    big = b'{"alias":"a","kind":"fixture","model_id":"m","notes":"' + b"n" * 100_000 + b'"}'

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    with registry.client() as http:
        json_type = {"content-type": "application/json"}  # issue 15: bodies must be JSON
        declared = http.post("/v1/teachers", content=big, headers=json_type)
        streamed = http.post("/v1/teachers", content=chunks(), headers=json_type)  # chunked
    for response in (declared, streamed):
        assert response.status_code == 413
        assert error_of(response)["code"] == "request_too_large"


def test_unknown_routes_use_the_error_envelope(registry: RegistryServer) -> None:
    with registry.client() as http:
        missing = http.get("/v1/nothing")
        wrong = http.put("/v1/teachers")
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    assert wrong.status_code == 405 and error_of(wrong)["code"] == "method_not_allowed"


def test_outbound_client_ignores_proxy_variables(
    registry: RegistryServer, teacher_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    with registry.client() as http:
        response = http.post("/v1/teachers", json=remote("direct", teacher_url))
    assert response.status_code == 200, response.text


def test_malformed_json_is_a_registration_error(registry: RegistryServer) -> None:
    with registry.client() as http:
        response = http.post(
            "/v1/teachers", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    assert error_of(response)["code"] == "teacher_registration_invalid"


def test_lookups_see_commits_from_other_connections(
    registry: RegistryServer, teacher_url: str
) -> None:
    """The entry cache follows the database: a status written by another connection (of
    another engine, as another process or replica would) shows at once."""
    with registry.client() as http:
        assert http.post("/v1/teachers", json=remote("watched", teacher_url)).status_code == 200
        assert http.get("/v1/teachers/watched").json()["usable"] is True  # now cached
        assert http.get("/v1/teachers/watched").json()["usable"] is True
        other = open_database(registry.ctx.config.server)
        try:
            with other.begin() as conn:
                conn.exec_driver_sql(
                    "UPDATE teachers SET status = 'unavailable', "
                    "status_message = 'teacher is down' WHERE alias = 'watched'"
                )
        finally:
            other.dispose()
        entry = http.get("/v1/teachers/watched").json()
    assert entry["status"] == "unavailable" and entry["usable"] is False
    assert entry["capabilities"] is None and entry["status_message"] == "teacher is down"


def test_job_submissions_get_a_larger_body_bound(registry: RegistryServer) -> None:
    body = b'{"padding":"' + b"p" * 100_000 + b'"}'  # over the 64 KiB registration bound
    with registry.client() as http:
        response = http.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400  # read and refused by the jobs schema, not 413
    assert error_of(response)["code"] == "job_invalid"
