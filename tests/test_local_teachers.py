"""Local teachers through the registry, without vLLM: the manager, the service and the route.

The launcher library's ``prepare`` is replaced (``build_context(local_prepare=...)``)
by ``FakePrepare``: it creates a snapshot and a cache directory under the
profile's roots, and spawns the real reference teacher (eager Transformers on
the vLLM protocol) as a real detached process group with the launcher's own
``ProcessGroup``.  So every probe, signal, drain and removal is real; only
staging and the runtime hash are not (they are tested in tests/launcher and,
with real vLLM, in tests/vllm).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.api.app import create_app
from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.supervisor import HealthTarget, ProcessGroup
from kiln_registry.local.launch_spec import LaunchSpec, launch_environment, launcher_flags
from kiln_registry.model.inspect import inspect_model
from kiln_registry.reference_teacher.identity import RuntimeVersions, reference_identity
from kiln_registry.serve.startup import build_context, prepare
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import _uvicorn_thread, toml_str, write_config
from tests.helpers import free_port

pytestmark = pytest.mark.slow  # each launch starts a real reference-teacher process (torch)

REPO = Path(__file__).resolve().parents[1]
SERVED = "teacher-tiny"
PROFILE = "tiny"
READY_S = 120.0


def teacher_identity(model: Path) -> TeacherIdentity:
    inspection = inspect_model(model, limiter=ReadRateLimiter(None), use_transformers=True)
    return reference_identity(
        inspection,
        served_model_id=SERVED,
        max_top_k=8,
        max_model_len=64,
        versions=RuntimeVersions.current(),
    )


@dataclass
class FakeRunning:
    prepared: FakePrepared
    group: ProcessGroup
    port: int

    @property
    def fingerprint(self) -> str:
        return self.prepared.fingerprint

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, deadline: float) -> None:
        outcome = self.group.wait_ready(HealthTarget(port=self.port), deadline)
        if outcome != "ready":
            self.group.drain(grace=5)
            raise LauncherError(f"fake teacher not ready ({outcome})", rule="supervisor.not_ready")

    def stop(self) -> None:
        try:
            self.group.drain(grace=5)
        finally:
            self.prepared.close()


@dataclass
class FakePrepared:
    spec: LaunchSpec
    fingerprint: str
    argv: list[str]
    dirs: list[Path]
    log: list[str]

    def spawn(self) -> FakeRunning:
        port = self.spec.request.vllm_options.port
        assert port is not None and self.spec.request.vllm_options.host == "127.0.0.1"
        group = ProcessGroup(self.argv, dict(self.spec.environ))
        self.log.append(f"spawn:{group.pid}")
        return FakeRunning(self, group, port)

    def spawn_replica(self, index: int, port: int, environ: Mapping[str, str]) -> FakeRunning:
        """Replica sets: tests/test_local_replicas.py (``ReplicaPrepare``)."""
        raise AssertionError("a single-process profile never spawns replicas")

    def close(self) -> None:
        self.log.append("close")
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)


@dataclass
class FakePrepare:
    """A ``Prepare`` that stages nothing and spawns the reference teacher."""

    fingerprint: str
    argv_override: list[str] | None = None
    log: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    def __call__(self, spec: LaunchSpec) -> FakePrepared:
        request = spec.request
        assert request.snapshot_root is not None and request.cache_root is not None
        spec.progress("copy", 0, 1 << 20)
        dirs = [Path(request.snapshot_root) / f"ready-{os.getpid()}-fake"]
        dirs.append(Path(request.cache_root) / f"cache-{os.getpid()}-fake")
        for path in dirs:
            path.mkdir(mode=0o700)
        spec.progress("copy", 1 << 20, 1 << 20)
        argv = self.argv_override or [
            sys.executable,
            *("-m", "kiln_registry.cli.main", "reference-teacher"),
            f"--model-path={request.model_path}",
            f"--served-model-id={request.served_model_id}",
            f"--max-top-k={request.max_top_k}",
            f"--max-model-len={request.max_model_len}",
            f"--port={request.vllm_options.port}",
            "--threads=1",
        ]
        self.log.append("prepare")
        return FakePrepared(spec, self.fingerprint, argv, dirs, self.log)


@dataclass
class Setup:
    config: Path
    snapshots: Path
    caches: Path
    port: int

    def leftovers(self) -> list[str]:
        return sorted(os.listdir(self.snapshots)) + sorted(os.listdir(self.caches))


def write_local_config(
    tmp_path: Path, model: TinyModel, *, profile_port: int, placement: list[str] | None = None
) -> Setup:
    """The profile on ``profile_port``; ``placement`` replaces its ``port`` line (replicas)."""
    snapshots, caches = tmp_path / "snapshots", tmp_path / "caches"
    for path in (snapshots, caches):
        path.mkdir(mode=0o700)
    config = write_config(tmp_path, student=model.path)
    lines = [
        f"[teachers.local.{PROFILE}]",
        f"model_path = {toml_str(model.path)}",
        f"snapshot_root = {toml_str(snapshots)}",
        f"cache_root = {toml_str(caches)}",
        f'served_model_id = "{SERVED}"',
        "max_top_k = 8",
        "max_model_len = 64",
        *(placement if placement is not None else [f"port = {profile_port}"]),
        f"ready_deadline_s = {READY_S}",
    ]
    with config.open("a", encoding="utf-8") as handle:
        handle.write("\n" + "\n".join(lines) + "\n")
    return Setup(config, snapshots, caches, profile_port)


@contextmanager
def registry(setup: Setup, fake: FakePrepare) -> Iterator[httpx.Client]:
    ctx = build_context(prepare(setup.config, host=None, port=None), local_prepare=fake)
    try:
        app = create_app(ctx)
        import uvicorn

        uv = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        with _uvicorn_thread(uv) as port:
            url = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=url, timeout=READY_S + 60, trust_env=False) as http:
                yield http
    finally:
        ctx.close()


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


def spawned_pids(fake: FakePrepare) -> list[int]:
    return [int(entry.split(":")[1]) for entry in fake.log if entry.startswith("spawn:")]


def local_body(alias: str, **extra: Any) -> dict[str, Any]:
    return {"alias": alias, "kind": "local", "launch_profile": PROFILE, **extra}


@pytest.fixture(scope="module")
def identity(tiny_model: TinyModel) -> TeacherIdentity:
    return teacher_identity(tiny_model.path)


@pytest.fixture
def setup(tmp_path: Path, tiny_model: TinyModel) -> Setup:
    return write_local_config(tmp_path, tiny_model, profile_port=free_port())


# -- pure pieces ------------------------------------------------------------------------


def test_profile_becomes_launcher_flags_on_loopback(setup: Setup) -> None:
    from kiln_registry.config.loader import load_config
    from kiln_registry.launcher.policy import parse_launcher_argv, request_from_flags

    profile = load_config(setup.config).teachers.local[PROFILE]
    flags, vllm = launcher_flags(PROFILE, profile)
    request = request_from_flags(flags, vllm, {})
    assert request.served_model_id == SERVED and request.max_top_k == 8
    assert request.vllm_options.host == "127.0.0.1" and request.vllm_options.port == setup.port
    assert request.snapshot_root == str(setup.snapshots) and request.mode == "launch"
    # The same request as the equivalent kiln-teacher command line.
    argv = [f"--{name}={value}" for name, value in flags.items()]
    assert parse_launcher_argv([*argv, "--", *vllm], {}) == request


def test_separated_flags_are_checked_like_the_command_line() -> None:
    from kiln_registry.domain.errors import InputError
    from kiln_registry.launcher.policy import request_from_flags

    base = {"model-path": "/m", "served-model-id": "t", "max-top-k": "8", "max-model-len": "64"}
    cases = [
        ({**base, "model-path": "/m\nx"}, "launcher.control"),
        ({**base, "served-model-id": "_x"}, "launcher.served_model_id"),
        ({**base, "max-top-k": ""}, "launcher.value"),
        ({**base, "no-such-flag": "1"}, "launcher.unknown_flag"),
        ({**base, "dry-run": "yes"}, "launcher.form"),
    ]
    for flags, rule in cases:
        with pytest.raises(InputError) as caught:
            request_from_flags(flags, [], {})
        assert caught.value.rule == rule, flags


def test_launch_environment_drops_credentials_and_kiln_variables() -> None:
    env = {"PATH": "/bin", "TEACHER_KEY": "sk-secret", "KILN_X": "1", "HF_HUB_OFFLINE": "1"}
    assert launch_environment(env, frozenset({"TEACHER_KEY"})) == {
        "PATH": "/bin",
        "HF_HUB_OFFLINE": "1",
    }


# -- through the registry ---------------------------------------------------------------


def test_register_shows_progress_then_publishes_and_delete_stops(
    setup: Setup, identity: TeacherIdentity
) -> None:
    fake = FakePrepare(identity.fingerprint())
    seen: list[dict[str, Any]] = []
    with registry(setup, fake) as http:
        result: dict[str, httpx.Response] = {}
        worker = threading.Thread(
            target=lambda: result.setdefault("r", http.post("/v1/teachers", json=local_body("t1")))
        )
        worker.start()
        while worker.is_alive() and not seen:
            got = http.get("/v1/teachers/t1")
            if got.status_code == 200 and got.json()["status"] == "unavailable":
                seen.append(got.json())
            time.sleep(0.05)
        worker.join(READY_S + 60)
        response = result["r"]
        assert response.status_code == 200, response.text
        entry = response.json()
        assert entry["status"] == "verified" and entry["usable"] is True
        assert entry["identity_revision"] == identity.revision()
        assert entry["spec"]["url"] == f"http://127.0.0.1:{setup.port}/v1"
        assert entry["spec"]["model_id"] == SERVED and entry["spec"]["kind"] == "local"
        assert http.get("/v1/teachers/t1/receipts").json()["receipts"][0]["outcome"] == "passed"
        (pid,) = spawned_pids(fake)
        assert pid_alive(pid) and len(setup.leftovers()) == 2
        assert http.delete("/v1/teachers/t1").status_code == 200
        assert not pid_alive(pid) and setup.leftovers() == []
        assert http.get("/v1/teachers/t1").status_code == 404
    assert seen and seen[0]["usable"] is False and seen[0].get("identity_revision") is None
    assert seen[0]["status_message"].startswith("launching")


def test_restart_marks_unavailable_and_relaunch_reproduces_identity(
    setup: Setup, identity: TeacherIdentity
) -> None:
    fake = FakePrepare(identity.fingerprint())
    with registry(setup, fake) as http:
        assert http.post("/v1/teachers", json=local_body("t2")).status_code == 200
        (first,) = spawned_pids(fake)
    assert not pid_alive(first) and setup.leftovers() == []  # shutdown drained it
    with registry(setup, fake) as http:
        entry = http.get("/v1/teachers/t2").json()
        assert entry["status"] == "unavailable" and entry["usable"] is False
        assert "/v1/teachers/t2/launch" in entry["status_message"]
        relaunched = http.post("/v1/teachers/t2/launch")
        assert relaunched.status_code == 200, relaunched.text
        assert relaunched.json()["status"] == "verified"
        assert relaunched.json()["identity_revision"] == identity.revision()
        again = http.post("/v1/teachers/t2/launch")  # already running: unchanged
        assert again.status_code == 200 and len(spawned_pids(fake)) == 2
    assert setup.leftovers() == []


def test_relaunch_with_another_identity_stays_unavailable(
    setup: Setup, identity: TeacherIdentity, tiny_model_padded: TinyModel
) -> None:
    with registry(setup, FakePrepare(identity.fingerprint())) as http:
        assert http.post("/v1/teachers", json=local_body("t3")).status_code == 200
    other = FakePrepare(teacher_identity(tiny_model_padded.path).fingerprint())
    with registry(setup, other) as http:
        response = http.post("/v1/teachers/t3/launch")
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "teacher_identity_mismatch"
        entry = http.get("/v1/teachers/t3").json()
        assert entry["status"] == "unavailable" and entry["usable"] is False
        assert "teacher_identity_mismatch" in entry["status_message"]
    assert other.log == ["prepare", "close"] and setup.leftovers() == []  # never spawned


def test_failed_launch_leaves_no_trace(setup: Setup, identity: TeacherIdentity) -> None:
    fake = FakePrepare(identity.fingerprint(), argv_override=[sys.executable, "-c", "exit(3)"])
    with registry(setup, fake) as http:
        response = http.post("/v1/teachers", json=local_body("t4"))
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "launcher_failed"
        assert http.get("/v1/teachers/t4").status_code == 404
        assert setup.leftovers() == []
        assert http.post("/v1/teachers/t4/launch").status_code == 404


def test_profile_rules_refuse_before_any_launch(setup: Setup, identity: TeacherIdentity) -> None:
    fake = FakePrepare(identity.fingerprint())
    with registry(setup, fake) as http:
        unknown = http.post("/v1/teachers", json={**local_body("t5"), "launch_profile": "nope"})
        assert unknown.status_code == 400
        assert "teacher.local_profile_unknown" in unknown.json()["error"]["message"]
        # The old form (the profile in model_id) would now mean the student: refused.
        old = {"alias": "t5", "kind": "local", "model_id": PROFILE}
        refused = http.post("/v1/teachers", json=old)
        assert refused.status_code == 400
        assert "teacher.local_profile_field" in refused.json()["error"]["message"]
        assert "launch_profile" in refused.json()["error"]["hint"]
        adapter = http.post("/v1/teachers", json=local_body("t5", adapter=SERVED))
        assert adapter.status_code == 400
        assert "teacher.local_adapter" in adapter.json()["error"]["message"]
        remote = {"alias": "r1", "kind": "fixture", "model_id": "m"}
        assert http.post("/v1/teachers", json=remote).status_code == 200
        not_local = http.post("/v1/teachers/r1/launch")
        assert not_local.status_code == 400
        assert "teacher.launch_not_local" in not_local.json()["error"]["message"]
    assert fake.log == []


def test_second_alias_on_a_busy_profile_is_refused(setup: Setup, identity: TeacherIdentity) -> None:
    fake = FakePrepare(identity.fingerprint())
    with registry(setup, fake) as http:
        assert http.post("/v1/teachers", json=local_body("t6")).status_code == 200
        busy = http.post("/v1/teachers", json=local_body("t7"))
        assert busy.status_code == 409
        assert busy.json()["error"]["code"] == "teacher_launch_conflict"
        assert http.get("/v1/teachers/t7").status_code == 404
    assert len(spawned_pids(fake)) == 1 and setup.leftovers() == []


# -- a real server process and a real signal ------------------------------------------------

SERVE_SCRIPT = """
import sys
from pathlib import Path
from kiln_registry.serve.startup import run_server
from tests.test_local_teachers import FakePrepare
run_server(Path(sys.argv[1]), port=int(sys.argv[2]), local_prepare=FakePrepare(sys.argv[3]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_server_signal_drains_local_teachers(
    setup: Setup, identity: TeacherIdentity, signum: int, tmp_path: Path
) -> None:
    port = free_port()
    argv = [sys.executable, "-c", SERVE_SCRIPT, str(setup.config), str(port)]
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [*argv, identity.fingerprint()], cwd=REPO, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=READY_S + 60, trust_env=False) as http:
            _wait_health(http, proc)
            response = http.post("/v1/teachers", json=local_body("t8"))
            assert response.status_code == 200, response.text
        teacher = _teacher_pid(setup.port)
        assert pid_alive(teacher) and len(setup.leftovers()) == 2
        proc.send_signal(signum)
        assert proc.wait(60) == -signum  # the conventional status, after the drain
        assert not pid_alive(teacher) and setup.leftovers() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


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


def _teacher_pid(port: int) -> int:
    """The pid of the process listening on ``port`` (from /proc/net/tcp and fd links)."""
    inode = _listening_inode(port)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            links = [
                os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")
            ]
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return int(entry)
    raise AssertionError(f"nothing listens on {port}")


def _listening_inode(port: int) -> str:
    with open("/proc/net/tcp", encoding="ascii") as handle:
        for line in handle.readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
                return fields[9]
    raise AssertionError(f"no listening socket on {port}")
