"""``kiln serve --config`` as a real subprocess: restart, SIGKILL mid-registration, secrets.

Each test starts the server with ``python -m kiln_registry.cli.main serve``
on a free loopback port and a database under ``tmp_path`` (or PostgreSQL:
tests/backend.py); teachers are the
session's in-process reference teachers (plain and TLS) or the stalling
``TeacherServer``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from kiln_registry.db.engine import head_revision
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import KEY_ENV, SECRET, TlsFiles, TlsTeacher
from tests.api.support import CLEAN_EXIT, ServerProcess, remote, serve_tls, write_config
from tests.api.test_credentials import _echo_app
from tests.backend import integrity, registry_database, rows_text
from tests.observability.support import metric_samples
from tests.probe.teacher_server import Reply, Request, TeacherServer

pytestmark = pytest.mark.slow


def test_register_survives_a_restart(
    tmp_path: Path, tiny_model: TinyModel, teacher_url: str
) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    with ServerProcess(config, tmp_path / "first.log") as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as http:
            created = http.post("/v1/teachers", json=remote("kept", teacher_url))
            assert created.status_code == 200, created.text
        assert server.stop() in CLEAN_EXIT
    with ServerProcess(config, tmp_path / "second.log") as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as http:
            assert http.get("/v1/teachers/kept").json() == created.json()
            metrics = http.get("/metrics").text
        server.stop()
    assert metric_samples(metrics)[("kiln_teachers", (("status", "verified"),))] == 1
    assert integrity(tmp_path / "registry.db") == "ok"


def test_sigkill_during_registration_leaves_no_alias(tmp_path: Path, tiny_model: TinyModel) -> None:
    def stall(request: Request, index: int) -> Reply:
        return Reply(body=b" " * 200, mode="drip", drip_interval=0.5)

    config = write_config(tmp_path, student=tiny_model.path)
    outcome: list[object] = []
    with TeacherServer(stall) as teacher, ServerProcess(config, tmp_path / "a.log") as server:
        server.wait_ready()

        def register() -> None:
            try:
                with httpx.Client(timeout=30, trust_env=False) as http:
                    outcome.append(
                        http.post(server.url + "/v1/teachers", json=remote("half", teacher.url))
                    )
            except httpx.TransportError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=register, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not teacher.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert teacher.requests, "the registry never reached the teacher"
        server.kill()
        thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError), outcome
    assert integrity(tmp_path / "registry.db") == "ok"
    with ServerProcess(config, tmp_path / "b.log") as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as http:
            assert http.get("/v1/teachers/half").status_code == 404
            assert http.get("/v1/teachers").json() == {"teachers": []}
            assert http.get("/v1/teachers/half/receipts").json() == {"receipts": []}
        server.stop()
    assert integrity(tmp_path / "registry.db") == "ok"


def test_database_upgrade_at_startup_and_newer_revision_refused(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    database = tmp_path / "registry.db"
    with registry_database(database) as engine, engine.connect():
        pass  # an empty database (SQLite: a new file): upgraded to head at start-up
    with ServerProcess(config, tmp_path / "a.log") as server:
        server.wait_ready()
        ready = httpx.get(server.url + "/ready", trust_env=False, timeout=10).json()
        server.stop()
    assert ready["database_revision"] == head_revision()
    with registry_database(database) as engine, engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    with ServerProcess(config, tmp_path / "b.log") as server:
        assert server.wait_exit() == 2
        output = server.output()
    assert "db.newer_revision" in output and "9999_from_the_future" in output
    with registry_database(database) as engine, engine.connect() as conn:
        found = conn.exec_driver_sql("SELECT version_num FROM alembic_version").fetchall()
    assert [tuple(row) for row in found] == [("9999_from_the_future",)]


@pytest.mark.secret_env(KEY_ENV)
def test_planted_secret_never_leaks(
    tmp_path: Path,
    tiny_model: TinyModel,
    tls_teacher: TlsTeacher,
    tls_files: TlsFiles,
    reference: tuple[ReferenceTeacher, TeacherIdentity],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)  # the registry's credential AND the teacher's key
    with serve_tls(_echo_app(reference[1]), tls_files.cert_pem) as echo_port:
        echo = f"https://localhost:{echo_port}"
        credentials = {"tls": (tls_teacher.origin, KEY_ENV), "echo": (echo, KEY_ENV)}
        server_keys = {"log_level": "debug", "teacher_ca_file": tls_files.ca_pem}
        config = write_config(tmp_path, student=tiny_model.path, server=server_keys,
                              credentials=credentials)  # fmt: skip
        seen: list[str] = []
        with ServerProcess(config, tmp_path / "server.log") as server:
            server.wait_ready()
            with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as http:
                for method, path, body in [
                    ("POST", "/v1/teachers", remote("ok", tls_teacher.url, credential_id="tls")),
                    ("POST", "/v1/teachers/ok/probe", None),
                    ("GET", "/v1/teachers/ok/receipts", None),
                    ("POST", "/v1/teachers", remote("e1", echo, credential_id="echo")),
                    (
                        "POST",
                        "/v1/teachers",
                        remote("e2", echo, model_id="echo-500", credential_id="echo"),
                    ),
                    ("POST", "/v1/teachers", remote("x", tls_teacher.url, credential_id="echo")),
                    (
                        "POST",
                        "/v1/teachers",
                        remote("ok", tls_teacher.url) | {"api_key_env": SECRET},
                    ),
                    ("GET", "/v1/teachers", None),
                    ("GET", "/metrics", None),
                ]:
                    response = http.request(method, path, json=body)
                    seen.append(f"{response.status_code} {response.headers} {response.text}")
            assert server.stop() in CLEAN_EXIT
            log = server.output()
    assert [s.split()[0] for s in seen] == [
        "200",
        "200",
        "200",
        "502",
        "502",
        "400",
        "400",
        "200",
        "200",
    ]
    assert "DEBUG" in log and "/v1/teachers" in log
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("registry.db*"))  # SQLite's files
    assert SECRET.encode() not in stored
    assert SECRET not in rows_text(tmp_path / "registry.db")
    assert SECRET not in log
    for text in seen:
        assert SECRET not in text


def test_json_logs_and_metrics_in_the_process(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path, server={"log_format": "json"})
    with ServerProcess(config, tmp_path / "a.log") as server:
        server.wait_ready()
        text = httpx.get(server.url + "/metrics", trust_env=False, timeout=10).text
        server.stop()
    assert metric_samples(text)[("kiln_teachers", (("status", "verified"),))] == 0  # parses
    records = [json.loads(line) for line in server.output().splitlines() if line.strip()]
    assert any(r["level"] == "info" for r in records)  # log_format = "json": one object a line
