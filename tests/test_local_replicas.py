"""Local replica sets (issue 17, item 4): ``replicas = N`` in a launch profile.

As in tests/test_local_teachers.py, the launcher's ``prepare`` is a
``FakePrepare`` that stages nothing and spawns the real reference teacher as a
real detached process group; here it also spawns replicas
(``spawn_replica``: the same prepared launch on another port, with the
replica's environment added).  Probes, signals, drains and the database rows
are real; only staging and the runtime hash are not.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.config.loader import load_config
from kiln_registry.domain.errors import ConfigError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.launcher.supervisor import ProcessGroup
from kiln_registry.local.launch_spec import LaunchSpec
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port
from tests.test_local_teachers import (
    PROFILE,
    READY_S,
    FakePrepare,
    FakePrepared,
    FakeRunning,
    Setup,
    pid_alive,
    registry,
    spawned_pids,
    teacher_identity,
    write_local_config,
)

pytestmark = pytest.mark.slow  # each replica is a real reference-teacher process (torch)


@dataclass
class ReplicaRunning(FakeRunning):
    """One replica's group: stopping it drains the group; the snapshot is the set's."""

    def stop(self) -> None:
        self.group.drain(grace=5)


@dataclass
class ReplicaPrepared(FakePrepared):
    environs: list[dict[str, str]] = field(default_factory=list)
    other_argv: dict[int, list[str]] = field(default_factory=dict)

    def spawn_replica(self, index: int, port: int, environ: Mapping[str, str]) -> ReplicaRunning:
        argv = self.other_argv.get(index, self.argv)
        argv = [f"--port={port}" if token.startswith("--port=") else token for token in argv]
        group = ProcessGroup(argv, {**self.spec.environ, **environ})
        self.log.append(f"spawn:{group.pid}")
        self.environs.append(dict(environ))
        return ReplicaRunning(self, group, port)


@dataclass
class ReplicaPrepare(FakePrepare):
    """``FakePrepare`` whose prepared launch spawns replicas; ``other_model`` serves replica 1
    from another model (another identity)."""

    other_model: Path | None = None
    prepared: list[ReplicaPrepared] = field(default_factory=list)

    def __call__(self, spec: LaunchSpec) -> ReplicaPrepared:
        base = super().__call__(spec)
        made = ReplicaPrepared(base.spec, base.fingerprint, base.argv, base.dirs, base.log)
        if self.other_model is not None:
            path = f"--model-path={self.other_model}"
            made.other_argv[1] = [path if a.startswith("--model-path=") else a for a in base.argv]
        self.prepared.append(made)
        return made


def write_replica_config(
    tmp_path: Path, model: TinyModel, ports: list[int], extra: list[str] | None = None
) -> Setup:
    placement = [f"replicas = {len(ports)}", f"ports = [{', '.join(map(str, ports))}]"]
    return write_local_config(
        tmp_path, model, profile_port=ports[0], placement=[*placement, *(extra or [])]
    )


def body(alias: str) -> dict[str, Any]:
    return {"alias": alias, "kind": "local", "launch_profile": PROFILE}


@pytest.fixture(scope="module")
def identity(tiny_model: TinyModel) -> TeacherIdentity:
    return teacher_identity(tiny_model.path)


@pytest.fixture
def ports() -> list[int]:
    first = free_port()
    second = free_port()
    while second == first:
        second = free_port()
    return [first, second]


# -- through the registry ---------------------------------------------------------------


def test_two_replicas_launch_as_one_alias_and_delete_stops_both(
    tmp_path: Path, tiny_model: TinyModel, identity: TeacherIdentity, ports: list[int]
) -> None:
    devices = ['devices = ["cuda:3", "cuda:1"]']
    setup = write_replica_config(tmp_path, tiny_model, ports, devices)
    fake = ReplicaPrepare(identity.fingerprint())
    with registry(setup, fake) as http:
        response = http.post("/v1/teachers", json=body("set1"))
        assert response.status_code == 200, response.text
        entry = response.json()
        assert entry["status"] == "verified" and entry["identity_revision"] == identity.revision()
        urls = [f"http://127.0.0.1:{port}/v1" for port in ports]
        assert entry["spec"]["url"] == urls[0]
        assert [r["url"] for r in entry["replicas"]] == urls
        assert {r["status"] for r in entry["replicas"]} == {"verified"}
        receipts = http.get("/v1/teachers/set1/receipts").json()["receipts"]
        assert [r["outcome"] for r in receipts] == ["passed", "passed"]
        # One prepare (snapshot staged once), two groups, each on its own device.
        assert fake.log.count("prepare") == 1
        assert fake.prepared[0].environs == [
            {"CUDA_VISIBLE_DEVICES": "3"},
            {"CUDA_VISIBLE_DEVICES": "1"},
        ]
        pids = spawned_pids(fake)
        assert len(pids) == 2 and all(pid_alive(pid) for pid in pids)
        assert len(setup.leftovers()) == 2  # one snapshot and one cache for the set
        assert http.delete("/v1/teachers/set1").status_code == 200
        assert not any(pid_alive(pid) for pid in pids)
        assert setup.leftovers() == [] and fake.log[-1] == "close"
        assert http.get("/v1/teachers/set1").status_code == 404


def test_restart_marks_replicas_unavailable_relaunch_and_a_job_spreads(
    tmp_path: Path, tiny_model: TinyModel, identity: TeacherIdentity, ports: list[int]
) -> None:
    setup = write_replica_config(tmp_path, tiny_model, ports)
    fake = ReplicaPrepare(identity.fingerprint())
    with registry(setup, fake) as http:
        assert http.post("/v1/teachers", json=body("set2")).status_code == 200
        first = spawned_pids(fake)
    assert len(first) == 2 and not any(pid_alive(pid) for pid in first)  # shutdown drained both
    assert setup.leftovers() == []
    with registry(setup, fake) as http:
        entry = http.get("/v1/teachers/set2").json()
        assert entry["status"] == "unavailable"
        assert {r["status"] for r in entry["replicas"]} == {"unavailable"}
        assert all("/v1/teachers/set2/launch" in r["status_message"] for r in entry["replicas"])
        relaunched = http.post("/v1/teachers/set2/launch")
        assert relaunched.status_code == 200, relaunched.text
        entry = http.get("/v1/teachers/set2").json()
        assert entry["status"] == "verified"
        assert {r["status"] for r in entry["replicas"]} == {"verified"}
        assert fake.log.count("prepare") == 2 and len(spawned_pids(fake)) == 4
        job = _run_job(http, "set2")
        assert job["status"] == "succeeded", job
    assert setup.leftovers() == []


def _run_job(http: Any, alias: str) -> dict[str, Any]:
    sequences = [[3 + i, 40 + i, 90 + i] for i in range(6)]
    submitted = http.post(
        "/v1/jobs",
        json={"kind": "teacher_scoring", "teacher": alias, "top_k": 4, "sequences": sequences},
    )
    assert submitted.status_code in (200, 201, 202), submitted.text
    job_id = submitted.json()["id"]
    deadline = time.monotonic() + READY_S
    while True:
        job: dict[str, Any] = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"job stuck: {job}"
        time.sleep(0.05)


def test_a_replica_that_cannot_start_fails_the_launch_and_stops_all(
    tmp_path: Path, tiny_model: TinyModel, identity: TeacherIdentity, ports: list[int]
) -> None:
    setup = write_replica_config(tmp_path, tiny_model, ports)
    fake = ReplicaPrepare(identity.fingerprint())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken, registry(setup, fake) as http:
        taken.bind(("127.0.0.1", ports[1]))  # replica 1's port is held: its teacher cannot bind
        taken.listen(1)
        response = http.post("/v1/teachers", json=body("set3"))
        assert response.status_code >= 400, response.text
        assert "replica 1" in response.json()["error"]["message"]
        assert http.get("/v1/teachers/set3").status_code == 404
        pids = spawned_pids(fake)
        assert pids and not any(pid_alive(pid) for pid in pids)
        assert setup.leftovers() == [] and fake.log[-1] == "close"


def test_a_replica_with_another_identity_refuses_the_set(
    tmp_path: Path,
    tiny_model: TinyModel,
    tiny_model_padded: TinyModel,
    identity: TeacherIdentity,
    ports: list[int],
) -> None:
    setup = write_replica_config(tmp_path, tiny_model, ports)
    fake = ReplicaPrepare(identity.fingerprint(), other_model=tiny_model_padded.path)
    with registry(setup, fake) as http:
        response = http.post("/v1/teachers", json=body("set4"))
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "teacher_identity_mismatch" and "replica 1" in error["message"]
        assert http.get("/v1/teachers/set4").status_code == 404
        pids = spawned_pids(fake)
        assert len(pids) == 2 and not any(pid_alive(pid) for pid in pids)
        assert setup.leftovers() == []


# -- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (["replicas = 2", "ports = [9101, 9102, 9103]"], "give one port per replica"),
        (["replicas = 2", "port = 9101", "ports = [9101, 9102]"], "not both"),
        (["replicas = 2", "port = 9101"], "needs ports"),
        (["replicas = 2", "ports = [9101, 9101]"], "must not repeat a port"),
        (["replicas = 2", "ports = [9101, 9102]", 'devices = ["cuda:0"]'], "one device per"),
        (["replicas = 2", "ports = [9101, 9102]", 'devices = ["cuda:0", "cuda:0"]'], "repeat"),
        (["replicas = 2", "ports = [9101, 9102]", 'devices = ["cpu", "cuda:1"]'], "cuda:<index>"),
        (["replicas = 9", "ports = [9101, 9102]"], "replicas"),
        (["replicas = 2", "ports = [9101, 8420]"], "repeats the port of server.port"),
        ([], "port is required"),
    ],
)
def test_replica_placement_refusals(
    tmp_path: Path, tiny_model: TinyModel, lines: list[str], needle: str
) -> None:
    config = write_local_config(tmp_path, tiny_model, profile_port=0, placement=lines).config
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert needle in str(caught.value), str(caught.value)
    assert f"teachers.local.{PROFILE}" in str(caught.value)


def test_one_replica_keeps_port_and_ports_of_one_is_the_same(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    setup = write_replica_config(tmp_path, tiny_model, [9111])
    profile = load_config(setup.config).teachers.local[PROFILE]
    assert profile.replicas == 1 and profile.replica_ports() == (9111,) and profile.port is None


def test_relaunch_refuses_a_profile_whose_ports_changed(
    tmp_path: Path, tiny_model: TinyModel, identity: TeacherIdentity, ports: list[int]
) -> None:
    setup = write_replica_config(tmp_path, tiny_model, ports)
    fake = ReplicaPrepare(identity.fingerprint())
    with registry(setup, fake) as http:
        assert http.post("/v1/teachers", json=body("set5")).status_code == 200
    text = setup.config.read_text(encoding="utf-8")
    moved = free_port()
    setup.config.write_text(text.replace(f", {ports[1]}]", f", {moved}]"), encoding="utf-8")
    with registry(setup, fake) as http:
        refused = http.post("/v1/teachers/set5/launch")
        assert refused.status_code == 400, refused.text
        assert "local.relaunch_replicas" in refused.json()["error"]["message"]
        entry = http.get("/v1/teachers/set5").json()
        assert entry["status"] == "unavailable"
        assert {r["status"] for r in entry["replicas"]} == {"unavailable"}
    assert fake.log.count("prepare") == 1 and setup.leftovers() == []  # nothing relaunched
