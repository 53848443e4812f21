"""Operational endpoints, the OpenAPI file and the generic 500.

``/health``, ``/ready``, ``/metrics`` (Prometheus text), ``kiln openapi --check`` against the
committed schema and a stale copy, and an unexpected exception rendered as a
generic 500 whose log line is redacted.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from kiln_registry.cli.main import run as kiln
from kiln_registry.cli.serve_cmds import render_openapi
from kiln_registry.credentials.redaction import install_redaction
from kiln_registry.db.engine import head_revision
from kiln_registry.testing.tiny_models import TinyModel
from kiln_registry.version import package_version
from tests.api.conftest import KEY_ENV, SECRET
from tests.api.support import REPO, RegistryServer, error_of, remote, run_registry, write_config
from tests.observability.support import metric_samples

COMMITTED = REPO / "openapi" / "kiln-registry.openapi.json"
OPERATIONS = ["listTeachers", "registerTeacher", "getTeacher", "deleteTeacher", "probeTeacher",
              "listTeacherReceipts", "health", "ready", "metrics"]  # fmt: skip


def test_health_and_ready(registry: RegistryServer) -> None:
    with registry.client() as http:
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/ready").json() == {
            "status": "ready",
            "version": package_version(),
            "database_revision": head_revision(),
            "teachers": 0,
            # The embedded workers beat at start (issue 30, item 6).
            "workers": {"live": 1, "embedded": True, "queued": 0, "oldest_queued_age_s": None},
        }


def test_metrics_are_prometheus_text(registry: RegistryServer, teacher_url: str) -> None:
    with registry.client() as http:
        assert http.post("/v1/teachers", json=remote("m1", teacher_url)).status_code == 200
        assert http.post("/v1/teachers", json=remote("m1", teacher_url)).status_code == 409
        bad = remote("m2", teacher_url, model_id="not-served")
        assert http.post("/v1/teachers", json=bad).status_code == 502
        response = http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = metric_samples(response.text)  # prometheus_client's parser: the text is valid
    assert samples[("kiln_registrations_total", (("outcome", "registered"), ("rule", "none")))] == 1
    conflict = ("kiln_registrations_total", (("outcome", "teacher_alias_exists"), ("rule", "none")))
    assert samples[conflict] == 1
    failed = [v for (name, labels), v in samples.items() if name == "kiln_registrations_total"
              and ("outcome", "teacher_identity_probe_failed") in labels]  # fmt: skip
    assert failed == [1]
    assert samples[("kiln_probes_total", (("outcome", "passed"), ("rule", "none")))] == 1
    assert samples[("kiln_probe_duration_seconds_count", ())] == 2
    assert samples[("kiln_teachers", (("status", "verified"),))] == 1


def test_openapi_file_is_current() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == render_openapi()
    done = subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", "openapi", "--check"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    operations = {
        op["operationId"]
        for path in json.loads(COMMITTED.read_text(encoding="utf-8"))["paths"].values()
        for op in path.values()
    }
    assert set(OPERATIONS) <= operations


def test_openapi_check_fails_on_a_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "schema.json"
    stale.write_text(render_openapi().replace("listTeachers", "listAllTeachers"), encoding="utf-8")
    assert kiln(["openapi", "--check", "--output", str(stale)]) == 2
    assert "openapi.stale" in capsys.readouterr().err
    assert kiln(["openapi", "--check", "--output", str(tmp_path / "missing.json")]) == 2
    assert kiln(["openapi", "--output", str(stale)]) == 0
    assert kiln(["openapi", "--check", "--output", str(stale)]) == 0


def _boom_route(app: FastAPI) -> None:
    # Test-only route: an unexpected exception carrying a secret cannot be
    # produced through the real routes, so one is planted here.
    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError(f"unexpected failure holding {SECRET}")


@pytest.fixture
def redacted_api_log() -> Iterator[None]:
    logger = logging.getLogger("kiln_registry.api")
    redaction = install_redaction({KEY_ENV}, logger_names=("kiln_registry.api",))
    yield
    logger.removeFilter(redaction)


@pytest.mark.secret_env(KEY_ENV)
def test_unexpected_errors_are_generic_and_redacted(
    tmp_path: Path,
    tiny_model: TinyModel,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    redacted_api_log: None,
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    credentials = {"c": ("https://teacher.example.com", KEY_ENV)}
    config = write_config(tmp_path, student=tiny_model.path, credentials=credentials)
    with run_registry(config, extend=_boom_route) as registry, registry.client() as http:
        response = http.get("/boom")
    assert response.status_code == 500
    assert error_of(response) == {
        "code": "internal_error",
        "message": "internal server error",
        "hint": "see the server log",
    }
    assert "unexpected failure" in caplog.text and "Traceback" in caplog.text
    assert SECRET not in caplog.text and SECRET not in response.text
