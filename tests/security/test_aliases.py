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


def test_lookalike_of_a_reserved_alias_is_refused_until_released(
    registry: RegistryServer,
) -> None:
    """Issue 27 item 9: nobody holds ``VICTIM-X`` while the deleted ``victim-X`` is reserved."""
    with registry.client() as http:
        assert http.post("/v1/teachers", json=_fixture("victim-X")).status_code == 200
        assert http.delete("/v1/teachers/victim-X").status_code == 200
        for squatter in ("VICTIM-X", "vi\u0441tim-x", "victim\u2010X"):
            response = http.post("/v1/teachers", json=_fixture(squatter))
            assert response.status_code == 409, response.text
            assert error_of(response)["code"] == "teacher_alias_reserved"
            assert error_of(response)["rule"] == "alias.reserved_lookalike"
        assert http.get("/v1/teachers").json()["teachers"] == []
        assert http.post("/v1/admin/aliases/victim-X/release").status_code == 200
        assert http.post("/v1/teachers", json=_fixture("victim-X")).status_code == 200


@pytest.mark.parametrize(
    ("squatter", "status", "rule"),
    [
        ("victim-l\u043e", 409, "alias.lookalike"),  # Cyrillic small o
        ("victim\u2010lo", 409, "alias.lookalike"),  # U+2010 hyphen
        ("victim-\u0139o", 409, "alias.lookalike"),  # L with acute
        ("victim-1o", 409, "alias.lookalike"),  # digit one for l
        ("victim-l\uff4f", 409, "alias.lookalike"),  # fullwidth o
        ("victim-\u200blo", 400, "alias.invisible"),  # zero width space
        (" victim-lo", 400, "alias.invisible"),  # leading space
        ("victim-lo\u00a0", 400, "alias.invisible"),  # trailing no-break space
        ("victim-\u202elo", 400, "alias.invisible"),  # right-to-left override
        ("victim-\u2066lo", 400, "alias.invisible"),  # left-to-right isolate
    ],
)
def test_homoglyphs_invisible_and_bidi_characters_are_refused(
    registry: RegistryServer, squatter: str, status: int, rule: str
) -> None:
    with registry.client() as http:
        assert http.post("/v1/teachers", json=_fixture("victim-lo")).status_code == 200
        response = http.post("/v1/teachers", json=_fixture(squatter))
        assert response.status_code == status, response.text
        assert error_of(response)["rule"] == rule
        aliases = [t["spec"]["alias"] for t in http.get("/v1/teachers").json()["teachers"]]
        assert aliases == ["victim-lo"]
