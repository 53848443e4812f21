"""Teacher replica sets (issue 17, item 4): one alias, several reference teachers.

Three real reference teachers on loopback (the session's tiny model) register
as one alias; every replica is probed and listed with its status; a replica
proving another identity (same model and tokenizer, another ``max_top_k``)
refuses the registration, naming the replica; the body rules of ``urls`` fail
closed with a rule; a re-probe re-proves each replica and marks a stopped one
``unavailable`` while the alias stays usable.  All real sockets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import KEY_ENV, SERVED
from tests.api.support import RegistryServer, error_of, remote, run_registry, write_config
from tests.helpers import serve_app

Reference = tuple[ReferenceTeacher, TeacherIdentity]
LOOP_1 = "http://127.0.0.1:1/v1"


def replica_set(alias: str, urls: list[str], **extra: Any) -> dict[str, Any]:
    body = remote(alias, urls[0], **extra)
    del body["url"]
    return {**body, "urls": urls}


@pytest.fixture(scope="module")
def three_teachers(reference: Reference) -> Iterator[list[str]]:
    """Three reference teachers serving the one tiny model (one identity)."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(serve_app(create_reference_app(reference[0], api_key_env=None)))
            for _ in range(3)
        ]


def test_three_replicas_register_as_one_alias(
    registry: RegistryServer, three_teachers: list[str], reference: Reference, teacher_url: str
) -> None:
    ident = reference[1]
    with registry.client() as http:
        created = http.post("/v1/teachers", json=replica_set("set@vllm", three_teachers))
        assert created.status_code == 200, created.text
        entry = created.json()
        assert entry["status"] == "verified" and entry["usable"] is True
        assert entry["identity_revision"] == ident.revision()
        assert entry["spec"]["url"] == three_teachers[0]  # the first replica's
        replicas = entry["replicas"]
        assert [r["url"] for r in replicas] == three_teachers
        assert {r["status"] for r in replicas} == {"verified"}
        assert all("status_message" not in r and r["checked_at"] for r in replicas)
        assert http.get("/v1/teachers/set@vllm").json() == entry
        receipts = http.get("/v1/teachers/set@vllm/receipts").json()["receipts"]
        assert sorted(r["report"]["url"] for r in receipts) == sorted(
            u + "/v1/completions" for u in three_teachers
        )
        assert {r["identity_revision"] for r in receipts} == {ident.revision()}

        single = http.post("/v1/teachers", json=remote("one@vllm", teacher_url)).json()
        assert "replicas" not in single  # Kiln's wire shape for a single-URL alias
        listed = http.get("/v1/teachers").json()["teachers"]
        assert [("replicas" in e) for e in listed] == [False, True]  # one@vllm, set@vllm

        probed = http.post("/v1/teachers/set@vllm/probe")
        assert probed.status_code == 200, probed.text
        assert probed.json()["identity_digest"] == ident.digest()
        after = http.get("/v1/teachers/set@vllm").json()["replicas"]
        assert all(a["checked_at"] >= b["checked_at"] for a, b in zip(after, replicas, strict=True))
        assert len(http.get("/v1/teachers/set@vllm/receipts").json()["receipts"]) == 6
        assert http.delete("/v1/teachers/set@vllm").status_code == 200
    with registry.ctx.reading() as session:
        left = session.execute(_count_replicas()).scalar_one()
    assert left == 0  # gone with the alias (ON DELETE CASCADE)


def _count_replicas() -> Any:
    from sqlalchemy import func, select

    from kiln_registry.db.models import TeacherReplicaRow

    return select(func.count()).select_from(TeacherReplicaRow)


def test_a_replica_with_another_identity_refuses_the_alias(
    registry: RegistryServer, three_teachers: list[str], tiny_model: TinyModel
) -> None:
    other, other_ident = load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=4, max_model_len=64
    )
    with serve_app(create_reference_app(other, api_key_env=None)) as odd, registry.client() as http:
        body = replica_set("mixed", [*three_teachers[:2], odd])
        refused = http.post("/v1/teachers", json=body)
        assert refused.status_code == 409, refused.text
        error = error_of(refused)
        assert error["code"] == "teacher_identity_mismatch"
        assert error["rule"] == "registration.urls.identity"
        assert "replica 2" in error["message"] and other_ident.revision() in error["message"]
        assert http.get("/v1/teachers/mixed").status_code == 404
        assert http.get("/v1/teachers/mixed/receipts").json() == {"receipts": []}


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"url": "http://127.0.0.1:1/v1"}, "registration.urls.exclusive"),
        ({"urls": ["http://127.0.0.1:1/v1"]}, "registration.urls.count"),
        ({"urls": [LOOP_1, LOOP_1 + "/"]}, "registration.urls.distinct"),
        # another host: refused first by the default teacher_hosts (issue 27 item 13)
        ({"urls": ["http://127.0.0.1:1/v1", "http://10.0.0.1:1/v1"]}, "teacher.host_not_allowed"),
    ],
)  # fmt: skip
def test_replica_url_rules_fail_closed_with_a_rule(
    registry: RegistryServer, change: dict[str, Any], rule: str
) -> None:
    body = {**replica_set("bad", ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]), **change}
    with registry.client() as http:
        refused = http.post("/v1/teachers", json=body)
        assert refused.status_code == 400, refused.text
        error = error_of(refused)
        assert error["code"] == "teacher_registration_invalid" and error["rule"] == rule
        if rule.startswith(("url.", "teacher.")):
            assert "replica 1:" in error["message"]
        assert http.get("/v1/teachers/bad").status_code == 404


def test_replica_shapes_refused_by_the_schema(registry: RegistryServer) -> None:
    too_many = [f"http://127.0.0.1:{port}/v1" for port in range(1, 18)]
    cases = [
        replica_set("many", too_many),
        {"alias": "fx", "kind": "fixture", "model_id": "m", "urls": too_many[:2]},
        replica_set("blank", ["http://127.0.0.1:1/v1", " "]),
    ]
    with registry.client() as http:
        for body in cases:
            refused = http.post("/v1/teachers", json=body)
            assert refused.status_code == 400, refused.text
            assert error_of(refused)["code"] == "teacher_registration_invalid"


@pytest.mark.secret_env(KEY_ENV)
def test_every_replica_must_match_the_credential_origin(
    tmp_path: Path, tiny_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-replica-test-not-echoed")
    origin = "https://localhost:8443"
    config = write_config(tmp_path, student=tiny_model.path,
                          credentials={"gpu": (origin, KEY_ENV)})  # fmt: skip
    body = replica_set("cred", [origin + "/v1", "https://localhost:9443/v1"], credential_id="gpu")
    with run_registry(config) as registry, registry.client() as http:
        refused = http.post("/v1/teachers", json=body)
        assert refused.status_code == 400, refused.text
        error = error_of(refused)
        assert error["rule"] == "credential.origin_mismatch"
        assert "replica 1:" in error["message"]
        assert "sk-replica" not in refused.text


def test_reprobe_marks_a_stopped_replica_unavailable(
    registry: RegistryServer, reference: Reference, teacher_url: str
) -> None:
    with registry.client() as http:
        with serve_app(create_reference_app(reference[0], api_key_env=None)) as brief:
            body = replica_set("flaky", [teacher_url, brief])
            assert http.post("/v1/teachers", json=body).status_code == 200
        probed = http.post("/v1/teachers/flaky/probe")
        assert probed.status_code == 200, probed.text  # replica 0 still proves the identity
        entry = http.get("/v1/teachers/flaky").json()
        assert entry["status"] == "verified" and entry["usable"] is True
        first, second = entry["replicas"]
        assert first["status"] == "verified" and second["status"] == "unavailable"
        assert "replica 1:" in second["status_message"]
