"""Live status: an entry re-checks at every read what can have changed since registration.

Kiln's ``teacher_entry`` (``crates/kiln-server/src/api/teachers.rs``) runs
``validate_teacher_spec_for_use`` on every read: the credential id resolves
for the URL's origin (``resolve_api_key_env``), the variable is set, the
identity still matches the loaded student (``validate_remote_identity_
against_student``: vocabulary digest, and ``vocab_size`` equal to BOTH the
tokenizer's size and the model's width), a local adapter directory still
exists.  A failure reads ``status: "unavailable"``, ``usable: false`` and the
error's message as ``status_message``; nothing is rewritten.  Kiln has no
re-probe route: here a failed ``POST /{alias}/probe`` also makes the alias
unavailable (persisted) until a re-probe passes.

Real parts: the reference teacher over loopback HTTP, registries on real
SQLite files, restarts with a rewritten kiln.toml or another student.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.config.loader import load_config
from kiln_registry.db.repository import TeacherRepository
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.teachers.live_status import ReadChecks
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, run_registry, toml_str, write_config
from tests.helpers import serve_app

ENV = "KILN_LIVE_TEST_TEACHER_KEY"
SECRET = "sk-live-status-planted-do-not-echo"
SERVED = "teacher-tiny"
Reference = tuple[ReferenceTeacher, TeacherIdentity]

pytestmark = pytest.mark.secret_env(ENV)


class Switch:
    """An ASGI wrapper that answers 503 while ``broken``: a real teacher outage on the wire."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.broken = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.broken and scope["type"] == "http":
            headers = [(b"content-type", b"text/plain")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": b"down"})
            return
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def reference(tiny_model: TinyModel) -> Reference:
    return load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=8, max_model_len=64
    )


@pytest.fixture(scope="module")
def switch(reference: Reference) -> Switch:
    return Switch(create_reference_app(reference[0], api_key_env=None))


@pytest.fixture(scope="module")
def teacher_url(switch: Switch) -> Iterator[str]:
    with serve_app(switch) as url:
        yield url


def _origin(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def _remote(alias: str, url: str, credential_id: str | None = None) -> dict[str, Any]:
    body = {"alias": alias, "kind": "remote", "provider": "vllm", "model_id": SERVED, "url": url}
    return body | ({"credential_id": credential_id} if credential_id else {})


def _stored_status(server: RegistryServer, alias: str) -> tuple[str, str | None]:
    with server.ctx.reading() as session:
        row = TeacherRepository(session).get(alias)
        assert row is not None
        return row.status, row.status_message


def _entry_now(config: Path, alias: str) -> dict[str, Any]:
    """The entry of ``alias`` in a registry started on ``config``."""
    with run_registry(config) as reg, reg.client() as http:
        entry: dict[str, Any] = http.get(f"/v1/teachers/{alias}").json()
        return entry


def _register(server: RegistryServer, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as http:
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == 200, response.text
        entry: dict[str, Any] = response.json()
        assert entry["status"] == "verified"
        return entry


def test_credential_variable_is_checked_at_every_read(
    tmp_path: Path, tiny_model: TinyModel, teacher_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, SECRET)
    creds = {"live": (_origin(teacher_url), ENV)}
    with run_registry(write_config(tmp_path, student=tiny_model.path, credentials=creds)) as reg:
        _register(reg, _remote("cred@vllm", teacher_url, "live"))
        with reg.client() as http:
            assert http.get("/v1/teachers/cred@vllm").json()["usable"] is True  # fills the cache
            assert http.get("/v1/teachers/cred@vllm").json()["usable"] is True  # from the cache
            monkeypatch.delenv(ENV)
            gone = http.get("/v1/teachers/cred@vllm")
            entry = gone.json()
            assert entry["status"] == "unavailable" and entry["usable"] is False
            assert entry["capabilities"] is None
            assert ENV in entry["status_message"] and "is not set" in entry["status_message"]
            assert "export" in entry["status_message"] and SECRET not in gone.text
            listed = http.get("/v1/teachers").json()["teachers"][0]
            assert listed["status"] == "unavailable"
            assert _stored_status(reg, "cred@vllm") == ("verified", None)  # nothing rewritten
            monkeypatch.setenv(ENV, SECRET)
            back = http.get("/v1/teachers/cred@vllm").json()
            assert back["status"] == "verified" and "status_message" not in back


def test_credential_configuration_change_shows_after_restart(
    tmp_path: Path, tiny_model: TinyModel, teacher_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, SECRET)
    creds = {"live": (_origin(teacher_url), ENV)}
    with run_registry(write_config(tmp_path, student=tiny_model.path, credentials=creds)) as reg:
        _register(reg, _remote("cred@vllm", teacher_url, "live"))
    moved = {"live": ("http://127.0.0.1:9", ENV)}
    with run_registry(write_config(tmp_path, student=tiny_model.path, credentials=moved)) as reg:
        with reg.client() as http:
            entry = http.get("/v1/teachers/cred@vllm").json()
        assert entry["status"] == "unavailable" and entry["usable"] is False
        assert "origin" in entry["status_message"] and "kiln.toml" in entry["status_message"]
        assert _stored_status(reg, "cred@vllm") == ("verified", None)
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as reg:
        with reg.client() as http:
            entry = http.get("/v1/teachers/cred@vllm").json()
        assert entry["status"] == "unavailable"
        assert "unknown credential id 'live'" in entry["status_message"]
    assert _entry_now(write_config(tmp_path, student=tiny_model.path, credentials=creds),
                      "cred@vllm")["status"] == "verified"  # fmt: skip


def test_another_student_makes_the_entry_unavailable(
    tmp_path: Path,
    tiny_model: TinyModel,
    tiny_model_padded: TinyModel,
    teacher_url: str,
) -> None:
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as reg:
        _register(reg, _remote("tiny@vllm", teacher_url))
    with run_registry(write_config(tmp_path, student=tiny_model_padded.path)) as reg:
        with reg.client() as http:
            entry = http.get("/v1/teachers/tiny@vllm").json()
        assert entry["status"] == "unavailable" and entry["usable"] is False
        assert "the loaded student changed since registration" in entry["status_message"]
        assert _stored_status(reg, "tiny@vllm") == ("verified", None)
    config = write_config(tmp_path, student=tiny_model.path)
    assert _entry_now(config, "tiny@vllm")["status"] == "verified"


def test_vocab_size_must_equal_the_tokenizer_size_too(
    tmp_path: Path, tiny_model_padded: TinyModel
) -> None:
    """teachers.rs: vocab_size must match both the loaded tokenizer (512) and model (544)."""
    padded = load_reference_teacher(
        tiny_model_padded.path, served_model_id=SERVED, max_top_k=8, max_model_len=64
    )
    config = write_config(tmp_path, student=tiny_model_padded.path)
    with (
        serve_app(create_reference_app(padded[0], api_key_env=None)) as url,
        run_registry(config) as reg,
        reg.client() as http,
    ):
        response = http.post("/v1/teachers", json=_remote("padded@vllm", url))
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "teacher_identity_mismatch"
        assert "tokenizer (512)" in error["message"] and "model width (544)" in error["message"]
        assert http.get("/v1/teachers").json() == {"teachers": []}


def test_failed_reprobe_is_reflected_in_the_entry(
    tmp_path: Path, tiny_model: TinyModel, teacher_url: str, switch: Switch
) -> None:
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as reg:
        _register(reg, _remote("flaky@vllm", teacher_url))
        with reg.client() as http:
            switch.broken = True
            try:
                failed = http.post("/v1/teachers/flaky@vllm/probe")
            finally:
                switch.broken = False
            assert failed.status_code == 502, failed.text
            entry = http.get("/v1/teachers/flaky@vllm").json()
            assert entry["status"] == "unavailable" and entry["usable"] is False
            message = entry["status_message"]
            assert message.startswith("re-probe failed (teacher_identity_probe_failed")
            assert "/v1/teachers/flaky@vllm/probe" in message
            assert "`kiln teachers probe flaky@vllm`" in message  # issue 30 item 4
            assert entry["identity_revision"].startswith("sha256:")  # the identity stays
            passed = http.post("/v1/teachers/flaky@vllm/probe")
            assert passed.status_code == 200, passed.text
            again = http.get("/v1/teachers/flaky@vllm").json()
            assert again["status"] == "verified" and "status_message" not in again


def test_adapter_directory_is_a_per_read_check(tmp_path: Path, tiny_model: TinyModel) -> None:
    """teachers.rs re-checks `<adapter_dir>/<adapter>` is a directory at every read."""
    adapters = tmp_path / "adapters"
    config_path = write_config(tmp_path, student=tiny_model.path)
    text = config_path.read_text(encoding="utf-8")
    config_path.write_text(
        text.replace("[student]\n", f"[student]\nadapter_dir = {toml_str(adapters)}\n"),
        encoding="utf-8",
    )
    config = load_config(config_path)
    checks = ReadChecks(adapter="prior-self")
    problem = checks.problem(config)
    assert problem is not None and "teacher adapter `prior-self` not found at" in problem
    assert "train or upload it first" in problem
    (adapters / "prior-self").mkdir(parents=True)
    assert checks.problem(config) is None
    assert ReadChecks().problem(config) is None
