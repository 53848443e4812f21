"""Issue 15 attack 2: cross-site forms and DNS rebinding are refused by a real registry.

A rebinding page reaches the loopback server under its own name (a foreign
``Host``); a cross-origin form posts ``text/plain`` or a form encoding.  Both
are refused before any route (nothing stored, no probe); no CORS header is
sent unless ``[server] cors_origins`` lists the origin.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config
from tests.security.conftest import CountingTeacher

FIXTURE = b'{"alias": "a1", "kind": "fixture", "model_id": "m"}'


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8420", "127.0.0.1.evil", ""])
def test_foreign_host_is_refused(registry: RegistryServer, host: str) -> None:
    with registry.client() as http:
        for method, path in (
            ("GET", "/v1/teachers"),
            ("GET", "/v1/teachers/a1"),
            ("GET", "/ready"),
        ):
            response = http.request(method, path, headers={"host": host})
            assert response.status_code == 400, (path, response.text)
            assert error_of(response)["code"] == "host_not_allowed"
        response = http.post(
            "/v1/teachers",
            content=FIXTURE,
            headers={"host": host, "content-type": "application/json"},
        )
        assert response.status_code == 400
        assert http.get("/v1/teachers").json()["teachers"] == []


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]", "localhost:1234"])
def test_loopback_names_are_served(registry: RegistryServer, host: str) -> None:
    with registry.client() as http:
        assert http.get("/v1/teachers", headers={"host": host}).status_code == 200


@pytest.mark.parametrize(
    "ctype", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"]
)
def test_cross_site_form_bodies_are_refused(
    registry: RegistryServer, counting_teacher: CountingTeacher, ctype: str | None
) -> None:
    body = (
        b'{"alias": "a1", "kind": "remote", "provider": "vllm", "model_id": "m", "url": "'
        + counting_teacher.url.encode()
        + b'/v1"}'
    )
    headers = {"origin": "https://evil.example"} | ({"content-type": ctype} if ctype else {})
    with registry.client() as http:
        response = http.post("/v1/teachers", content=body, headers=headers)
        assert response.status_code == 415, response.text
        assert error_of(response)["code"] == "unsupported_media_type"
        assert not [h for h in response.headers if h.startswith("access-control-")]
        probe = http.post("/v1/teachers/a1/probe", content=b"x=1", headers=headers)
        assert probe.status_code == 415
        assert http.get("/v1/teachers").json()["teachers"] == []
    assert counting_teacher.requests == []


def test_json_with_charset_is_accepted(registry: RegistryServer) -> None:
    with registry.client() as http:
        response = http.post(
            "/v1/teachers",
            content=FIXTURE,
            headers={"content-type": "Application/JSON; charset=utf-8"},
        )
        assert response.status_code == 200, response.text


def test_no_cors_headers_by_default(registry: RegistryServer) -> None:
    with registry.client() as http:
        preflight = http.options(
            "/v1/teachers",
            headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
        )
        plain = http.get("/v1/teachers", headers={"origin": "https://evil.example"})
    for response in (preflight, plain):
        assert not [h for h in response.headers if h.startswith("access-control-")]


def test_cors_only_for_listed_origins_and_allowed_hosts(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    server = {"cors_origins": ["https://ui.example"], "allowed_hosts": ["registry.example"]}
    config = write_config(tmp_path, student=tiny_model.path, server=server)
    with run_registry(config) as reg, httpx.Client(base_url=reg.url, trust_env=False) as http:
        host = {"host": "registry.example"}
        good = http.get("/v1/teachers", headers=host | {"origin": "https://ui.example"})
        assert good.headers["access-control-allow-origin"] == "https://ui.example"
        bad = http.get("/v1/teachers", headers=host | {"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in bad.headers
        # An explicit list replaces the defaults: loopback names are no longer served.
        assert http.get("/v1/teachers").status_code == 400
