"""Issue 27, item 6: an empty-body cross-origin form post changes nothing, auth on or off.

A real registry on 127.0.0.1.  A browser's cross-site form (or ``fetch`` in
``no-cors`` mode) can send an empty ``POST`` with no non-simple header; before
the fix one deleted nothing but ran ``/probe``, ``/release``, ``/launch`` and
``/cancel``.  Now every state change whose ``Origin`` is not the server's own
(or whose ``Sec-Fetch-Site`` says another site sent it) is ``403
cross_origin_refused`` before auth or a route runs; the server's own pages
(same origin) and non-browser clients (no ``Origin``) still work.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, run_registry, write_config
from tests.auth.support import bearer, create_token

JOB = "job-" + "0" * 24
FORM_POSTS = [
    ("POST", "/v1/teachers/victim/probe"),
    ("POST", "/v1/teachers/victim/launch"),
    ("POST", "/v1/admin/aliases/victim/release"),
    ("POST", f"/v1/jobs/{JOB}/cancel"),
    ("DELETE", "/v1/teachers/victim"),
    ("POST", "/v1/teachers"),
]
FOREIGN = [
    {"origin": "https://evil.example"},
    {"origin": "null"},
    {"origin": "http://127.0.0.1.evil.example"},
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site"},
    {"origin": "https://evil.example", "content-type": "application/x-www-form-urlencoded"},
    {"origin": "https://evil.example", "content-type": "text/plain"},
]


def _refused_everywhere(registry: RegistryServer, extra: dict[str, str]) -> None:
    with registry.client() as http:
        for headers in FOREIGN:
            for method, path in FORM_POSTS:
                response = http.request(method, path, headers=headers | extra)
                assert response.status_code == 403, (method, path, headers, response.text)
                assert error_of(response)["code"] == "cross_origin_refused"
        two = httpx.Headers([("origin", registry.url), ("origin", "https://evil.example")])
        assert http.post("/v1/teachers/victim/probe", headers=two).status_code == 403


def _register_victim(http: httpx.Client, headers: dict[str, str]) -> None:
    body = {"alias": "victim", "kind": "fixture", "model_id": "m"}
    assert http.post("/v1/teachers", json=body, headers=headers).status_code == 200


def test_cross_origin_state_changes_are_refused_with_auth_off(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as registry:
        with registry.client() as http:
            _register_victim(http, {})
            assert http.delete("/v1/teachers/victim").status_code == 200  # now reserved
        _refused_everywhere(registry, {})
        with registry.client() as http:
            # Still reserved: the forged release did nothing.
            again = http.post("/v1/teachers", json={"alias": "victim", "kind": "fixture",
                                                    "model_id": "m"})  # fmt: skip
            assert error_of(again)["code"] == "teacher_alias_reserved"
            # The server's own pages (same origin, with or without the default port).
            own = {"origin": registry.url, "sec-fetch-site": "same-origin"}
            release = http.post("/v1/admin/aliases/victim/release", headers=own)
            assert release.status_code == 200, release.text
            _register_victim(http, {"origin": registry.url.upper().replace("HTTP", "http")})
            probe = http.post("/v1/teachers/victim/probe", headers={"sec-fetch-site": "none"})
            assert probe.status_code == 409, probe.text  # reached the route (a fixture: no probe)
            events = http.get("/v1/audit").json()["events"]
    # No refused cross-origin request reached the audit log either.
    assert [e["action"] for e in reversed(events)] == [
        "teacher.register", "teacher.delete", "teacher.register", "alias.release",
        "teacher.register", "teacher.probe",
    ]  # fmt: skip


@pytest.fixture
def secured(tmp_path: Path, tiny_model: TinyModel) -> tuple[Path, str]:
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "required"})
    return config, create_token(tmp_path / "registry.db", "root", {"admin"})


def test_cross_origin_state_changes_are_refused_with_auth_on(secured: tuple[Path, str]) -> None:
    config, admin = secured
    with run_registry(config) as registry:
        with registry.client() as http:
            _register_victim(http, bearer(admin))
        _refused_everywhere(registry, bearer(admin))  # a token does not make it same-origin
        with registry.client() as http:
            assert http.get("/v1/teachers/victim", headers=bearer(admin)).status_code == 200
            listed = http.get(
                "/v1/teachers", headers=bearer(admin) | {"origin": "https://x.example"}
            )
            assert listed.status_code == 200  # reads are not state changes
