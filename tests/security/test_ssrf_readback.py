"""Issue 27 item 13: a failed probe reads nothing of the far side back to its caller.

An internal URL's vLLM-shaped error was echoed (up to 400 characters) and a
200 that was not a completion leaked its structure.  Now a probe that fails
on the teacher's HTTP answer tells the caller the rule, the probe and the
status only; the full text stays in the probe report, which an ``admin``
token reads in the receipts (others see it withheld), and in the server log.
Unset ``[server] teacher_hosts`` allows loopback names and the configured
credential origins only.  Real registries, a real reference teacher on
127.0.0.1 (switched to answer like an internal service) and real tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, remote, run_registry, write_config
from tests.auth.support import bearer, create_token
from tests.helpers import serve_app
from tests.security.conftest import CountingTeacher

SERVED = "teacher-tiny"
INTERNAL_TEXT = "internal-db password=hunter2 at 10.9.8.7"
INTERNAL_ERROR = (
    b'{"error":{"message":"' + INTERNAL_TEXT.encode() + b'","type":"NotFoundError",'
    b'"param":null,"code":404}}'
)
KEY_ENV = "KILN_SSRF_READBACK_KEY"


@dataclass
class Switch:
    """The reference teacher until ``broken``; then an internal service's vLLM-shaped 404."""

    inner: Any
    broken: bool = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.broken:
            await self.inner(scope, receive, send)
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": INTERNAL_ERROR})


@pytest.fixture(scope="module")
def switch(tiny_model: TinyModel) -> Iterator[tuple[Switch, str]]:
    teacher, _ = load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=8, max_model_len=64
    )
    app = Switch(create_reference_app(teacher, api_key_env=None))
    with serve_app(app) as url:
        yield app, url


def _failure_messages(http: httpx.Client, token: str) -> list[str]:
    response = http.get("/v1/teachers/victim/receipts", headers=bearer(token))
    assert response.status_code == 200, response.text
    reports = [r["report"] for r in response.json()["receipts"]]
    return [r["failure"]["message"] for r in reports if r["failure"] is not None]


def test_reprobe_error_text_reaches_admins_only(
    tmp_path: Path, tiny_model: TinyModel, switch: tuple[Switch, str]
) -> None:
    app, url = switch
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "required"})
    db = tmp_path / "registry.db"
    register = create_token(db, "registrar", {"register", "read"})
    reader = create_token(db, "reader", {"read"})
    admin = create_token(db, "root", {"admin"})
    app.broken = False
    try:
        with run_registry(config) as registry, registry.client() as http:
            ok = http.post("/v1/teachers", json=remote("victim", url), headers=bearer(register))
            assert ok.status_code == 200, ok.text
            app.broken = True
            failed = http.post("/v1/teachers/victim/probe", headers=bearer(register))
            entry = http.get("/v1/teachers/victim", headers=bearer(reader)).text
            seen_by_reader = _failure_messages(http, reader)
            seen_by_admin = _failure_messages(http, admin)
    finally:
        app.broken = False
    assert failed.status_code == 502
    error = error_of(failed)
    assert error["rule"] == "probe.http_status" and "HTTP 404" in error["message"]
    for text in (failed.text, entry, str(seen_by_reader)):
        assert "hunter2" not in text and "internal-db" not in text
    assert len(seen_by_reader) == 1 and "admin tokens only" in seen_by_reader[0]
    assert len(seen_by_admin) == 1 and INTERNAL_TEXT in seen_by_admin[0]


def test_a_200_that_is_not_a_completion_leaks_no_structure(
    registry: RegistryServer, counting_teacher: CountingTeacher
) -> None:
    counting_teacher.status = 200
    counting_teacher.body = b'{"object": "internal-user-list", "users": [{"name": "hunter2"}]}'
    with registry.client() as http:
        response = http.post("/v1/teachers", json=remote("peek", counting_teacher.url + "/v1"))
    assert response.status_code == 502, response.text
    error = error_of(response)
    assert "HTTP 200" in error["message"] and error["rule"].startswith("probe.")
    for leaked in ("hunter2", "users", "internal-user-list"):
        assert leaked not in response.text
    assert counting_teacher.requests  # it answered; only the rule and the status came back


def test_default_teacher_hosts_are_loopback_and_credential_origins(
    tmp_path: Path,
    tiny_model: TinyModel,
    counting_teacher: CountingTeacher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-readback-0123456789")
    # 127.0.0.2 is a loopback address but not a default name: only its credential allows it.
    credentials = {"inner": ("https://127.0.0.2:8443", KEY_ENV)}
    config = write_config(tmp_path, student=tiny_model.path, credentials=credentials)
    with run_registry(config) as registry, registry.client() as http:
        for url, credential in (
            ("http://10.0.0.1:8000/v1", None),
            ("https://internal.example/v1", None),
            ("https://127.0.0.2:9443/v1", "inner"),  # the credential's host, another port
            ("http://127.0.0.3:8000/v1", None),
        ):
            body = remote("elsewhere", url, credential_id=credential)
            response = http.post("/v1/teachers", json=body)
            error = error_of(response)
            assert (response.status_code, error["rule"]) == (400, "teacher.host_not_allowed"), url
        allowed = http.post("/v1/teachers", json=remote("inner", "https://127.0.0.2:8443/v1",
                                                        credential_id="inner"))  # fmt: skip
        assert error_of(allowed)["rule"] == "probe.unreachable"  # allowed; nothing listens
        loopback = http.post("/v1/teachers", json=remote("local", counting_teacher.url + "/v1"))
        assert error_of(loopback)["rule"] == "probe.http_status"  # allowed and probed
    assert len(counting_teacher.requests) == 1
