"""Issue 15 attacks 6 and 8: bad text, huge integers and duplicate keys are 400s before any probe.

Each body is sent as raw bytes (a client library would refuse to encode a
lone surrogate) to a real registry; the refusal is Kiln's error envelope
with the endpoint's invalid-request code, the teacher named in the body
never sees a request, and nothing is stored.
"""

from __future__ import annotations

import pytest

from tests.api.support import RegistryServer, error_of
from tests.security.conftest import CountingTeacher

JSON = {"content-type": "application/json"}


def _remote(url: str, **override: str) -> dict[str, str]:
    body = {"alias": "a1", "kind": "remote", "provider": "vllm", "model_id": "m", "url": url}
    return body | override


def _raw(body: dict[str, str], field: str, raw_value: str) -> bytes:
    """``body`` as JSON with ``field``'s value replaced by ``raw_value`` (already JSON text)."""
    parts = [f'"{k}": "{v}"' for k, v in body.items() if k != field]
    parts.append(f'"{field}": {raw_value}')
    return ("{" + ", ".join(parts) + "}").encode("ascii")


@pytest.mark.parametrize("field", ["notes", "model_id", "alias", "credential_id", "url"])
def test_lone_surrogate_is_400_before_any_probe(
    registry: RegistryServer, counting_teacher: CountingTeacher, field: str
) -> None:
    body = _raw(_remote(counting_teacher.url + "/v1"), field, '"x\\ud800y"')
    with registry.client() as http:
        response = http.post("/v1/teachers", content=body, headers=JSON)
        assert response.status_code == 400, response.text
        error = error_of(response)
        assert error["code"] == "teacher_registration_invalid"
        assert error["rule"] == "json.surrogate"
        assert http.get("/v1/teachers").json()["teachers"] == []
    assert counting_teacher.requests == []


def test_paired_surrogates_are_still_text(
    registry: RegistryServer, counting_teacher: CountingTeacher
) -> None:
    """A valid escaped pair (an emoji) is ordinary text and reaches the probe."""
    body = _raw(_remote(counting_teacher.url + "/v1"), "notes", '"\\ud83d\\ude00"')
    with registry.client() as http:
        response = http.post("/v1/teachers", content=body, headers=JSON)
    assert response.status_code == 502, response.text
    assert counting_teacher.requests


@pytest.mark.parametrize("token", [2**63, 2**64 + 5, -(2**63) - 1, 10**30])
def test_huge_token_id_is_400(registry: RegistryServer, token: int) -> None:
    body = f'{{"kind": "teacher_scoring", "teacher": "t", "top_k": 1, "sequences": [[1, {token}]]}}'
    with registry.client() as http:
        response = http.post("/v1/jobs", content=body.encode(), headers=JSON)
        assert response.status_code == 400, response.text
        assert error_of(response)["code"] == "job_invalid"
        assert http.get("/v1/jobs").json()["jobs"] == []


def test_surrogate_in_job_teacher_is_400(registry: RegistryServer) -> None:
    body = b'{"kind": "teacher_scoring", "teacher": "t\\udc00", "top_k": 1, "sequences": [[1]]}'
    with registry.client() as http:
        response = http.post("/v1/jobs", content=body, headers=JSON)
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "job_invalid"


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        (
            "/v1/teachers",
            b'{"alias": "a1", "alias": "a2", "kind": "fixture", "model_id": "m"}',
            "teacher_registration_invalid",
        ),
        (
            "/v1/jobs",
            b'{"kind": "teacher_scoring", "teacher": "t", "teacher": "u", "top_k": 1,'
            b' "sequences": [[1]]}',
            "job_invalid",
        ),
        (
            "/v1/jobs",
            b'{"kind": "teacher_scoring", "teacher": "t", "top_k": 1,'
            b' "corpus": {"path": "a", "path": "b"}}',
            "job_invalid",
        ),
    ],
)
def test_duplicate_keys_are_refused(
    registry: RegistryServer, path: str, body: bytes, code: str
) -> None:
    with registry.client() as http:
        response = http.post(path, content=body, headers=JSON)
        assert response.status_code == 400, response.text
        error = error_of(response)
        assert error["code"] == code
        assert error["rule"] == "json.duplicate_key"
        assert http.get("/v1/teachers").json()["teachers"] == []


def test_non_finite_and_invalid_utf8_are_refused(registry: RegistryServer) -> None:
    with registry.client() as http:
        for body in (b'{"alias": NaN}', b'{"alias": "\xff"}'):
            response = http.post("/v1/teachers", content=body, headers=JSON)
            assert response.status_code == 400, response.text
            assert error_of(response)["code"] == "teacher_registration_invalid"
