"""Issue 15 attacks 7 and 8: look-alike aliases and the alias cap, on a real registry.

An alias whose NFKC case-fold equals a registered one's is refused as
``409 teacher_alias_exists`` (rule ``alias.lookalike``) before any probe;
past ``[server] max_teachers`` a new alias is ``409 teacher_limit_reached``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config
from tests.security.conftest import CountingTeacher


def _fixture(alias: str) -> dict[str, str]:
    return {"alias": alias, "kind": "fixture", "model_id": "m"}


@pytest.mark.parametrize(
    "lookalike", ["Qwen/Tiny", "QWEN/TINY", "\uff51wen/tiny", "qwen/t\u0131ny".upper(), "qwen/tiny"]
)
def test_lookalike_aliases_are_refused(registry: RegistryServer, lookalike: str) -> None:
    with registry.client() as http:
        assert http.post("/v1/teachers", json=_fixture("qwen/tiny")).status_code == 200
        response = http.post("/v1/teachers", json=_fixture(lookalike))
        assert response.status_code == 409, response.text
        assert error_of(response)["code"] == "teacher_alias_exists"
        aliases = [t["spec"]["alias"] for t in http.get("/v1/teachers").json()["teachers"]]
        assert aliases == ["qwen/tiny"]


def test_lookalike_remote_is_refused_before_any_probe(
    registry: RegistryServer, counting_teacher: CountingTeacher
) -> None:
    remote = {"kind": "remote", "provider": "vllm", "model_id": "m"}
    with registry.client() as http:
        assert http.post("/v1/teachers", json=_fixture("Teacher")).status_code == 200
        body = remote | {"alias": "teacher", "url": counting_teacher.url + "/v1"}
        response = http.post("/v1/teachers", json=body)
    assert response.status_code == 409, response.text
    assert error_of(response)["rule"] == "alias.lookalike"
    assert counting_teacher.requests == []


def test_alias_cap(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path, server={"max_teachers": 2})
    with run_registry(config) as server, server.client() as http:
        for alias in ("a", "b"):
            assert http.post("/v1/teachers", json=_fixture(alias)).status_code == 200
        response = http.post("/v1/teachers", json=_fixture("c"))
        assert response.status_code == 409, response.text
        assert error_of(response)["code"] == "teacher_limit_reached"
        assert http.delete("/v1/teachers/a").status_code == 200
        assert http.post("/v1/teachers", json=_fixture("c")).status_code == 200
