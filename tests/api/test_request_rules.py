"""Every ``RegisterTeacherRequest`` field rule, over HTTP: 400 naming the field, nothing stored.

One registry serves the whole module (the rules never reach a teacher or
write a row); each case also checks that the refused alias does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, remote, run_registry, write_config

LOOP = "http://127.0.0.1:9"
PASTED_SECRET = "sk-pasted-into-the-wrong-field-0xC0FFEE"


@pytest.fixture(scope="module")
def shared_registry(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[RegistryServer]:
    directory = tmp_path_factory.mktemp("rules")
    with run_registry(write_config(directory, student=tiny_model.path)) as server:
        yield server


CASES: list[tuple[str, Any, str]] = [
    ("unknown field", {**remote("a1", LOOP), "colour": "red"}, "colour: unknown field"),
    ("provider openai", remote("a1", LOOP) | {"provider": "openai"},
     "provider: Input should be 'vllm'"),
    ("provider sglang", remote("a1", LOOP) | {"provider": "sglang"}, "only 'vllm'"),
    ("provider missing", {k: v for k, v in remote("a1", LOOP).items() if k != "provider"},
     "provider is required"),
    ("model_id missing", {k: v for k, v in remote("a1", LOOP).items() if k != "model_id"},
     "model_id is required"),
    ("url missing", {k: v for k, v in remote("a1", LOOP).items() if k != "url"},
     "url (or urls, for a replica set) is required"),
    ("adapter on remote", remote("a1", LOOP, adapter="lora-x"), "adapter must be null"),
    ("blank model_id", remote("a1", LOOP, model_id="  "), "must not be empty"),
    ("kind missing", {"alias": "a1", "model_id": "m"}, "kind: Field required"),
    ("kind unknown", {"alias": "a1", "kind": "cloud", "model_id": "m"}, "kind: Input should be"),
    ("fixture with url", {"alias": "a1", "kind": "fixture", "model_id": "m", "url": LOOP},
     "url was given for kind 'fixture'"),
    ("fixture with provider", {"alias": "a1", "kind": "fixture", "model_id": "m",
                               "provider": "vllm"}, "provider was given for kind 'fixture'"),
    ("notes too long", remote("a1", LOOP, notes="n" * 5000), "longer than 4096"),
    ("control character", remote("a1", LOOP, notes="a\x00b"), "control character"),
    ("alias not a string", remote("a1", LOOP) | {"alias": 7}, "alias: Input should be"),
    ("body is a list", [remote("a1", LOOP)], "Input should be a valid dictionary"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_field_rules(shared_registry: RegistryServer, body: Any, needle: str) -> None:
    with shared_registry.client() as http:
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == 400, response.text
        error = error_of(response)
        assert error["code"] == "teacher_registration_invalid"
        assert needle in error["message"], error["message"]
        assert http.get("/v1/teachers").json() == {"teachers": []}


SERVER_CONTROLLED = ["api_key_env", "identity", "max_top_k", "vocab_size",
                     "supports_full_vocab", "tokenizer_hash", "capabilities", "status"]  # fmt: skip


@pytest.mark.parametrize("field", SERVER_CONTROLLED)
def test_server_controlled_fields_are_refused(shared_registry: RegistryServer, field: str) -> None:
    body = remote("a1", LOOP, credential_id="primary") | {field: PASTED_SECRET}
    with shared_registry.client() as http:
        response = http.post("/v1/teachers", json=body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "teacher_registration_invalid"
    assert field in error["message"] and "server-controlled" in error["message"]
    assert PASTED_SECRET not in response.text


# Kiln accepts any alias that is not blank (teachers.rs, validate_teacher_spec_static); this
# registry adds a length bound, no control characters and no reserved last segment.
BAD_ALIASES = ["", "   ", "x" * 257, "a\nb", "a\x00b", "a\x7fb", "a\x85b", "x/probe",
               "q/r/receipts", "q/launch"]  # fmt: skip


@pytest.mark.parametrize("alias", BAD_ALIASES)
def test_bad_aliases_are_refused(shared_registry: RegistryServer, alias: str) -> None:
    with shared_registry.client() as http:
        response = http.post("/v1/teachers", json=remote(alias, LOOP))
        assert response.status_code == 400
        error = error_of(response)
        assert error["code"] == "teacher_registration_invalid"
        assert error["message"].startswith("alias: ")
        assert http.get("/v1/teachers").json() == {"teachers": []}


def test_unknown_alias_in_a_path_is_not_found(shared_registry: RegistryServer) -> None:
    with shared_registry.client() as http:
        response = http.get("/v1/teachers/" + "x" * 300)
    assert response.status_code == 404
    assert error_of(response)["code"] == "teacher_not_found"


def test_submitted_values_are_never_echoed(shared_registry: RegistryServer) -> None:
    body = remote("a1", LOOP) | {"provider": 12345, "unknown": PASTED_SECRET}
    with shared_registry.client() as http:
        response = http.post("/v1/teachers", json=body)
    assert response.status_code == 400
    assert PASTED_SECRET not in response.text
