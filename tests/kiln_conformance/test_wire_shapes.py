"""Wire codes and response shapes as Kiln's server answers them, over a real server.

Facts from ericflo/kiln:

* ``crates/kiln-server/src/error.rs``: the envelope is
  ``{"error": {"code", "message", "hint"}}`` with ``hint`` a string (a
  ``&'static str``, never null); ``teacher_registration_invalid`` and
  ``teacher_not_registered`` are ``400 Bad Request``.
* ``crates/kiln-server/src/api/teachers.rs``: credential resolution at
  registration (``resolve_api_key_env``) maps every failure to
  ``teacher_registration_invalid``; ``TeacherSpec`` skips ``identity`` and
  ``credential_id`` when absent, ``TeacherEntry`` skips ``identity_revision``,
  ``off_policy_manifest`` and ``status_message``.
* ``scripts/generate_artifact_schema.py`` (``build_teacher_definitions``,
  ``build_primitives_and_enums``, ``build_receipt_definitions``): the required
  and optional members of ``TeacherSpec``/``TeacherEntry``, the
  ``RemoteProvider``, ``TeacherKind`` and ``TeacherStatus`` enums, the
  ``Sha256``/``RawSha256`` patterns and ``TeacherIdentityV1``'s integer bounds.

This registry adds a ``rule`` member to the envelope when a named rule failed
(allowed by the issue; Kiln clients ignore unknown members).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, remote, run_registry, write_config
from tests.helpers import serve_reference_teacher

SERVED = "teacher-tiny"
KEY_ENV = "WIRE_TEST_TEACHER_KEY"
ORIGIN = "https://teacher.example.com"
SPEC_REQUIRED = {"alias", "kind", "provider", "model_id", "max_top_k", "vocab_size",
                 "supports_full_vocab", "tokenizer_hash", "url", "notes", "adapter"}  # fmt: skip
SPEC_OPTIONAL = {"identity", "credential_id"}
ENTRY_REQUIRED = {"spec", "capabilities", "status", "usable"}
ENTRY_OPTIONAL = {"identity_revision", "off_policy_manifest", "status_message"}
REMOTE_PROVIDERS = ["vllm", "sglang", "llama_cpp", "open_router", "together", "fireworks",
                    "deep_infra", "tgi"]  # fmt: skip
IDENTITY_BOUNDS = {"vocab_size": (1, 16_777_216), "max_top_k": (1, 65_536),
                   "max_model_len": (1, 16_777_216),
                   "max_prompt_logprob_candidates": (1, 1_000_000)}  # fmt: skip
RAW_SHA256 = "^[0-9a-f]{64}$"


@pytest.fixture(scope="module")
def teacher_url(tiny_model: TinyModel) -> Iterator[str]:
    with serve_reference_teacher(tiny_model.path, SERVED) as url:
        yield url


@pytest.fixture(scope="module")
def registry(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[RegistryServer]:
    """A registry with one credential; its variable is set while the module runs."""
    directory = tmp_path_factory.mktemp("wire")
    config = write_config(directory, student=tiny_model.path,
                          credentials={"primary": (ORIGIN, KEY_ENV)})  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, "sk-wire-test-not-a-real-key")
        with run_registry(config) as server:
            yield server


@pytest.fixture(scope="module")
def openapi(registry: RegistryServer) -> dict[str, Any]:
    with registry.client() as http:
        schema: dict[str, Any] = http.get("/openapi.json").json()
    return schema


def _documented(
    schema: dict[str, Any], method: str, template: str, response: httpx.Response
) -> dict[str, Any]:
    """The envelope of ``response``, checked against the operation's documented errors."""
    error = error_of(response)
    documented = schema["paths"][template][method]["responses"][str(response.status_code)]
    assert error["code"] in documented["x-kiln-error-codes"], (template, error)
    return error


def _no_null_optionals(entry: dict[str, Any]) -> None:
    assert ENTRY_REQUIRED <= set(entry) <= ENTRY_REQUIRED | ENTRY_OPTIONAL, entry
    assert SPEC_REQUIRED <= set(entry["spec"]) <= SPEC_REQUIRED | SPEC_OPTIONAL, entry["spec"]
    for name in ENTRY_OPTIONAL & set(entry):
        assert isinstance(entry[name], str) and entry[name], (name, entry)
    for name in SPEC_OPTIONAL & set(entry["spec"]):
        assert entry["spec"][name] is not None, (name, entry)


CREDENTIAL_CASES = [
    ("nope", f"{ORIGIN}/v1", "credential.unknown"),
    # another host: refused first by the default teacher_hosts (issue 27 item 13)
    ("primary", "https://other.example.com/v1", "teacher.host_not_allowed"),
    ("primary", f"{ORIGIN}/v1", "secret.missing"),
]


@pytest.mark.parametrize(("credential_id", "url", "rule"), CREDENTIAL_CASES)
def test_credential_problems_are_400_teacher_registration_invalid(
    registry: RegistryServer,
    openapi: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    credential_id: str,
    url: str,
    rule: str,
) -> None:
    if rule == "secret.missing":
        monkeypatch.delenv(KEY_ENV)  # unset after start-up: refused at request time
    body = remote("cred@vllm", url, credential_id=credential_id)
    with registry.client() as http:
        response = http.post("/v1/teachers", json=body)
        assert http.get("/v1/teachers").json() == {"teachers": []}
    assert response.status_code == 400, response.text
    error = _documented(openapi, "post", "/v1/teachers", response)
    assert error["code"] == "teacher_registration_invalid"
    assert rule in error["message"] and error["rule"] == rule


def test_an_unregistered_job_teacher_is_400_teacher_not_registered(
    registry: RegistryServer, openapi: dict[str, Any]
) -> None:
    body = {"kind": "teacher_scoring", "teacher": "nobody@vllm", "top_k": 1, "sequences": [[1]]}
    with registry.client() as http:
        response = http.post("/v1/jobs", json=body)
        assert http.get("/v1/jobs").json() == {"jobs": []}
    assert response.status_code == 400, response.text
    error = _documented(openapi, "post", "/v1/jobs", response)
    assert error["code"] == "teacher_not_registered" and error["hint"]


REFUSALS = [
    ("post", "/v1/teachers", "/v1/teachers", {}, 400, "teacher_registration_invalid"),
    ("post", "/v1/teachers", "/v1/teachers", {"alias": "a", "kind": "remote",
     "provider": "sglang", "model_id": "m", "url": "http://127.0.0.1:9"}, 400,
     "teacher_registration_invalid"),
    ("post", "/v1/jobs", "/v1/jobs", {}, 400, "job_invalid"),
    ("get", "/v1/jobs/{job_id}", "/v1/jobs/not-a-job", None, 400, "job_invalid"),
    ("get", "/v1/jobs/{job_id}", "/v1/jobs/job-" + "0" * 24, None, 404, "job_not_found"),
    ("get", "/v1/teachers/{alias}", "/v1/teachers/nobody", None, 404, "teacher_not_found"),
    ("delete", "/v1/teachers/{alias}", "/v1/teachers/no%2Fbody", None, 404, "teacher_not_found"),
    ("post", "/v1/teachers/{alias}/probe", "/v1/teachers/nobody/probe", None, 404,
     "teacher_not_found"),
    ("get", "/v1/teachers/{alias}/receipts", "/v1/teachers/a/receipts?limit=0", None, 400,
     "invalid_request"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "template", "path", "body", "status", "code"), REFUSALS)
def test_refusals_use_the_envelope_and_their_documented_codes(
    registry: RegistryServer,
    openapi: dict[str, Any],
    method: str,
    template: str,
    path: str,
    body: dict[str, Any] | None,
    status: int,
    code: str,
) -> None:
    """400 with the envelope where FastAPI would answer 422; hint always a string."""
    with registry.client() as http:
        response = http.request(method.upper(), path, json=body)
    assert response.status_code == status, response.text
    error = _documented(openapi, method, template, response)
    assert error["code"] == code and isinstance(error["hint"], str)


def test_router_refusals_carry_a_string_hint(registry: RegistryServer) -> None:
    with registry.client() as http:
        for response in (http.get("/v1/nowhere"), http.put("/v1/teachers")):
            assert response.status_code in (404, 405)
            assert isinstance(error_of(response)["hint"], str)


def test_a_verified_entry_omits_absent_optionals_and_keeps_the_identity_bytes(
    registry: RegistryServer, teacher_url: str
) -> None:
    with registry.client() as http:
        created = http.post("/v1/teachers", json=remote("wire@vllm", teacher_url))
        assert created.status_code == 200, created.text
        shown = http.get("/v1/teachers/wire@vllm").json()
        listed = http.get("/v1/teachers").json()["teachers"]
        assert http.delete("/v1/teachers/wire@vllm").status_code == 200
    for entry in (created.json(), shown, *listed):
        _no_null_optionals(entry)
        assert "credential_id" not in entry["spec"] and "status_message" not in entry
        assert {"identity_revision", "off_policy_manifest"} <= set(entry)
        # The identity document is fixed bytes: "adapter": null stays.
        assert "adapter" in entry["spec"]["identity"]
        assert entry["spec"]["identity"]["adapter"] is None


def test_a_fixture_entry_omits_identity_and_revision(registry: RegistryServer) -> None:
    body = {"alias": "fixture-teacher", "kind": "fixture", "model_id": "fixture/model",
            "notes": "deterministic local fixture"}  # fmt: skip
    with registry.client() as http:
        created = http.post("/v1/teachers", json=body)
        assert created.status_code == 200, created.text
        shown = http.get("/v1/teachers/fixture-teacher").json()
        assert http.delete("/v1/teachers/fixture-teacher").status_code == 200
    for entry in (created.json(), shown):
        _no_null_optionals(entry)
        assert not {"identity", "credential_id"} & set(entry["spec"])
        assert not {"identity_revision", "off_policy_manifest"} & set(entry)


def _props(schema: dict[str, Any], name: str) -> dict[str, Any]:
    props: dict[str, Any] = schema["components"]["schemas"][name]["properties"]
    return props


def test_openapi_has_no_422_and_lists_errors_per_operation(openapi: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in openapi["components"]["schemas"]
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)
            errors = {s: r for s, r in responses.items() if s.startswith(("4", "5"))}
            assert "500" in errors, (method, path)
            # Kiln's request_timeout (error.rs, 408) for every operation but the relaunch.
            assert ("408" in errors) == (operation["operationId"] != "launchTeacher"), path
            # API tokens (auth.middleware): every operation but /health may answer 401/403.
            assert ({"401", "403"} <= set(errors)) == (path != "/health"), path
            # serve_guard's 431 (head over its bound) comes before any parsing: plain text.
            plain = errors.pop("431")
            assert set(plain["content"]) == {"text/plain"}, (method, path)
            for response in errors.values():
                assert response["x-kiln-error-codes"], (method, path)
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorResponse")
    detail = openapi["components"]["schemas"]["ErrorDetail"]
    assert detail["properties"]["hint"]["type"] == "string"
    assert set(detail["required"]) == {"code", "message", "hint"}


def test_openapi_teacher_schemas_follow_kilns_artifact_schema(openapi: dict[str, Any]) -> None:
    schemas = openapi["components"]["schemas"]
    assert schemas["RemoteProvider"]["enum"] == REMOTE_PROVIDERS
    assert schemas["TeacherKind"]["enum"] == ["fixture", "local", "remote"]
    assert schemas["TeacherStatus"]["enum"] == [
        "verified", "configured", "legacy_unverified", "unavailable"
    ]  # fmt: skip
    for model in ("RegisterTeacherRequest", "TeacherSpec"):
        refs = [v.get("$ref") for v in _props(openapi, model)["provider"]["anyOf"]]
        assert "#/components/schemas/RemoteProvider" in refs
    assert set(schemas["TeacherSpec"]["required"]) == SPEC_REQUIRED
    assert set(schemas["TeacherEntry"]["required"]) == ENTRY_REQUIRED
    for model, optional in (("TeacherSpec", SPEC_OPTIONAL), ("TeacherEntry", ENTRY_OPTIONAL)):
        for name in optional:
            assert "anyOf" not in _props(openapi, model)[name], (model, name)  # not nullable
    revision = _props(openapi, "TeacherEntry")["identity_revision"]
    assert revision["pattern"] == "^sha256:[0-9a-f]{64}$"
    identity = _props(openapi, "TeacherIdentityV1")
    for name in ("base_model_sha256", "tokenizer_vocab_sha256", "tokenizer_config_sha256",
                 "inference_config_sha256"):  # fmt: skip
        assert identity[name]["pattern"] == RAW_SHA256
    for name, (low, high) in IDENTITY_BOUNDS.items():
        bounds = (identity[name]["minimum"], identity[name]["maximum"])
        assert bounds == (low, high) and all(type(b) is int for b in bounds), (name, bounds)
    adapter = _props(openapi, "AdapterIdentityPublic")
    assert adapter["weights_sha256"]["pattern"] == RAW_SHA256


def test_stable_operation_ids(openapi: dict[str, Any]) -> None:
    ids = {op["operationId"] for ops in openapi["paths"].values() for op in ops.values()}
    assert {"listTeachers", "registerTeacher", "getTeacher", "deleteTeacher", "probeTeacher",
            "launchTeacher", "listTeacherReceipts", "submitJob", "listJobs", "getJob",
            "cancelJob", "getJobResult", "health", "ready", "metrics"} <= ids  # fmt: skip
