"""The process-group supervisor, driving tests/launcher/fake_server.py for real.

Each test runs a small launcher-like driver (``DRIVER``) as a real
subprocess; the driver supervises the fake server, which starts two children
of its own.  Signals are real; the group is checked in /proc afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.domain.errors import LauncherError
from kiln_registry.launcher.supervisor import (
    MAX_ATTEMPTS_LOG_BYTES,
    AttemptsLog,
    HealthTarget,
    ProcessGroup,
    check_port_free,
    exit_status,
    health_ok,
)
from tests.helpers import free_port

FAKE_SERVER = Path(__file__).with_name("fake_server.py")
REPO = Path(__file__).resolve().parents[2]
DRIVER = """
import json, sys
from kiln_registry.domain.errors import KilnError
from kiln_registry.launcher.supervisor import (
    AttemptsLog, HealthTarget, ProcessGroup, SignalGate, SuperviseOptions, supervise)
cfg = json.loads(sys.argv[1])
code = 2
with SignalGate() as gate:
    try:
        group = ProcessGroup(cfg["argv"], cfg["env"], mode=cfg["mode"])
        code = supervise(group, gate, HealthTarget("127.0.0.1", cfg["port"]),
                         attempts=AttemptsLog(cfg["attempts"]), redacted_argv=cfg["argv"],
                         options=SuperviseOptions(cfg["ready_timeout"], cfg["grace"]))
    except KilnError as exc:
        sys.stderr.write(exc.one_line() + "\\n")
sys.exit(code)
"""
WRAPPER = "import os, sys; os.setpgid(0, 0); os.execv(sys.argv[1], sys.argv[1:])"


def _live_group(pgid: int) -> list[int]:
    """Non-zombie processes of group ``pgid``, read from /proc independently."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            data = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return state[state.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


class Run:
    def __init__(
        self,
        tmp_path: Path,
        *server_args: str,
        mode: str = "detached",
        ready_timeout: float = 20.0,
        grace: float = 2.0,
        wrap: bool = False,
    ) -> None:
        self.port = free_port()
        self.pid_file = tmp_path / "pids.json"
        self.attempts = tmp_path / "attempts.jsonl"
        argv = [sys.executable, str(FAKE_SERVER), f"--port={self.port}",
                f"--pid-file={self.pid_file}", *server_args]  # fmt: skip
        cfg = {
            "argv": argv,
            "env": {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"},
            "mode": mode,
            "port": self.port,
            "attempts": str(self.attempts),
            "ready_timeout": ready_timeout,
            "grace": grace,
        }
        command = [sys.executable, "-c", DRIVER, json.dumps(cfg)]
        if wrap:
            command = [sys.executable, "-c", WRAPPER, *command]
        self.proc = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def pids(self, timeout: float = 20.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while not self.pid_file.exists():
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "fake server did not start"
            time.sleep(0.05)
        record: dict[str, object] = json.loads(self.pid_file.read_text())
        return record

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while not health_ok(HealthTarget("127.0.0.1", self.port), timeout=0.5):
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def wait_logged(self) -> None:
        """Wait until the supervisor has logged the readiness outcome."""
        deadline = time.monotonic() + 20
        while not (self.attempts.exists() and self.attempts.read_text().endswith("\n")):
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def finish(self) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err.decode()

    def outcomes(self) -> list[str]:
        lines = self.attempts.read_text().splitlines()
        return [json.loads(line)["outcome"] for line in lines]


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:  # a failed assertion must not leave processes behind
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(10)
        if run.pid_file.exists():
            record = json.loads(run.pid_file.read_text())
            for pid in [record["server"], *record["children"]]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _assert_all_gone(record: dict[str, object], pgid: int) -> None:
    deadline = time.monotonic() + 5
    pids = [record["server"], *record["children"]]  # type: ignore[list-item]
    while any(_alive(int(p)) for p in pids) or _live_group(pgid):
        assert time.monotonic() < deadline, f"left behind: {_live_group(pgid)}"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_the_group(tmp_path: Path, runs: list[Run], sig: signal.Signals) -> None:
    run = Run(tmp_path)
    runs.append(run)
    record = run.pids()
    run.wait_ready()
    assert len(_live_group(int(record["server"]))) == 3  # type: ignore[arg-type]
    run.wait_logged()
    run.proc.send_signal(sig)
    status, _ = run.finish()
    assert status == 128 + sig
    _assert_all_gone(record, int(record["server"]))  # type: ignore[arg-type]
    assert run.outcomes() == ["ready"]


def test_early_exit_returns_child_status(tmp_path: Path, runs: list[Run]) -> None:
    run = Run(tmp_path, "--never-ready", "--exit-after=0.5", "--exit-code=3")
    runs.append(run)
    record = run.pids()
    status, _ = run.finish()
    assert status == 3
    _assert_all_gone(record, int(record["server"]))  # type: ignore[arg-type]
    assert run.outcomes() == ["exited:3"]


def test_failure_before_listening(tmp_path: Path, runs: list[Run]) -> None:
    run = Run(tmp_path, "--fail-before-listen=7")
    runs.append(run)
    status, _ = run.finish()
    assert status == 7
    assert run.outcomes() == ["exited:7"]


def test_readiness_deadline_drains_and_fails(tmp_path: Path, runs: list[Run]) -> None:
    run = Run(tmp_path, "--never-ready", ready_timeout=1.0)
    runs.append(run)
    record = run.pids()
    status, err = run.finish()
    assert status == 2
    assert "supervisor.ready_deadline" in err
    _assert_all_gone(record, int(record["server"]))  # type: ignore[arg-type]
    assert run.outcomes() == ["deadline"]


def test_drain_escalates_to_sigkill(tmp_path: Path, runs: list[Run]) -> None:
    run = Run(tmp_path, "--children-ignore-term", grace=0.5)
    runs.append(run)
    record = run.pids()
    run.wait_ready()
    run.wait_logged()
    run.proc.send_signal(signal.SIGTERM)
    status, _ = run.finish()
    assert status == 128 + signal.SIGTERM
    _assert_all_gone(record, int(record["server"]))  # type: ignore[arg-type]


def test_inherited_mode_refused_without_own_group(tmp_path: Path, runs: list[Run]) -> None:
    run = Run(tmp_path, mode="inherited")
    runs.append(run)
    status, err = run.finish()
    assert status == 2
    assert "launcher.inherited_not_leader" in err
    assert not run.pid_file.exists()


def test_inherited_mode_in_an_isolated_group(tmp_path: Path, runs: list[Run]) -> None:
    run = Run(tmp_path, mode="inherited", wrap=True)
    runs.append(run)
    record = run.pids()
    launcher = run.proc.pid  # the wrapper exec'd the driver: same pid, own group
    assert os.getpgid(int(record["server"])) == launcher  # type: ignore[arg-type]
    run.wait_ready()
    run.wait_logged()
    run.proc.send_signal(signal.SIGTERM)
    status, _ = run.finish()
    assert status == 128 + signal.SIGTERM
    _assert_all_gone(record, launcher)
    assert run.outcomes() == ["ready"]


def test_inherited_mode_refused_when_group_is_shared(tmp_path: Path) -> None:
    # A peer (the sleeping child below) shares the new group: not isolated.
    code = (
        "import os, subprocess, sys, time\n"
        "os.setpgid(0, 0)\n"
        "peer = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "from kiln_registry.domain.errors import PolicyError\n"
        "from kiln_registry.launcher.supervisor import check_inherited_group\n"
        "try:\n    check_inherited_group()\nexcept PolicyError as e:\n    print(e.rule)\n"
        "peer.kill()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert out.stdout.strip() == "launcher.inherited_not_isolated"


def test_spawn_failure_is_a_launcher_error(tmp_path: Path) -> None:
    with pytest.raises(LauncherError) as info:
        ProcessGroup([str(tmp_path / "missing")], {"PATH": "/usr/bin"})
    assert info.value.rule == "supervisor.spawn"


def test_port_in_use_is_refused() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LauncherError) as info:
            check_port_free(HealthTarget("127.0.0.1", port), "127.0.0.1")
        assert info.value.rule == "launcher.port_in_use"
    check_port_free(HealthTarget("127.0.0.1", port), "127.0.0.1")


def test_uds_target_that_exists_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    path.write_text("")
    with pytest.raises(LauncherError):
        check_port_free(HealthTarget(uds=str(path)), None)


def test_exit_status_mapping() -> None:
    assert exit_status(0) == 0
    assert exit_status(3) == 3
    assert exit_status(-signal.SIGKILL) == 137


def test_attempts_log_is_rotated_once_it_is_large(tmp_path: Path) -> None:
    path = tmp_path / "attempts.jsonl"
    old = b'{"old":true}\n' * (MAX_ATTEMPTS_LOG_BYTES // 13 + 1)
    path.write_bytes(old)
    (tmp_path / "attempts.jsonl.1").write_bytes(b"oldest\n")
    log = AttemptsLog(str(path))
    log.record(pid=7, argv=["vllm", "serve"], outcome="ready")
    assert (tmp_path / "attempts.jsonl.1").read_bytes() == old
    (line,) = path.read_text().splitlines()
    assert json.loads(line)["outcome"] == "ready"
    log.record(pid=8, argv=["vllm"], outcome="exited")
    assert len(path.read_text().splitlines()) == 2  # small again: appended in place


def test_attempts_log_refuses_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "attempts.jsonl").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LauncherError) as err:
        AttemptsLog(str(tmp_path / "attempts.jsonl")).record(pid=1, argv=[], outcome="x")
    assert err.value.rule == "supervisor.attempts_log"
