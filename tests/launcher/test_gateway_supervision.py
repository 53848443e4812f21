"""The gateway as the supervised front of a (fake) vLLM on a private Unix socket.

A driver subprocess supervises ``fake_server.py --uds=...`` (the stand-in
for vLLM: a real HTTP server on a real Unix socket, with two children of its
own) and, once that answers ``/health``, the real gateway built by
``launcher.front.gateway_front``, in the same process group.  Signals are
real; the group is checked in /proc afterwards.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.launcher.front import GATEWAY_KEY_VARIABLE, gateway_front
from kiln_registry.launcher.policy import parse_launcher_argv
from tests.helpers import free_port
from tests.launcher.test_supervisor import FAKE_SERVER, REPO, _alive, _live_group

KEY = "gateway-supervision-key-42"
DRIVER = """
import json, sys
from kiln_registry.domain.errors import KilnError
from kiln_registry.launcher.supervisor import (AttemptsLog, Front, HealthTarget, ProcessGroup,
    SignalGate, SuperviseOptions, supervise)
cfg = json.loads(sys.argv[1])
code = 2
with SignalGate() as gate:
    try:
        group = ProcessGroup(cfg["argv"], cfg["env"])
        front = Front(tuple(cfg["front"]), cfg["front_env"], HealthTarget("127.0.0.1", cfg["port"]))
        code = supervise(group, gate, HealthTarget(uds=cfg["uds"]),
                         attempts=AttemptsLog(cfg["attempts"]), redacted_argv=cfg["argv"],
                         options=SuperviseOptions(cfg["ready_timeout"], cfg["grace"]),
                         front=front)
    except KilnError as exc:
        sys.stderr.write(exc.one_line() + "\\n")
sys.exit(code)
"""


class GatewayRun:
    def __init__(self, tmp: Path, *server_args: str, front: list[str] | None = None,
                 ready_timeout: float = 30.0) -> None:  # fmt: skip
        self.port = free_port()
        self.uds = str(tmp / "vllm.sock")
        self.pid_file = tmp / "pids.json"
        self.record = tmp / "record.jsonl"
        self.attempts = tmp / "attempts.jsonl"
        request = parse_launcher_argv(
            ["--model-path=/m", "--served-model-id=teacher", "--max-top-k=8",
             "--max-model-len=64", "--api-key-env=KILN_SUP_KEY", "--",
             "--host=127.0.0.1", f"--port={self.port}"],
            {},
        )  # fmt: skip
        gateway = gateway_front(request, {"KILN_SUP_KEY": KEY}, uds=self.uds,
                                python=sys.executable, base_alias=None, stop_grace=5.0)  # fmt: skip
        cfg = {
            "argv": [sys.executable, str(FAKE_SERVER), "--port=1", f"--uds={self.uds}",
                     f"--pid-file={self.pid_file}", f"--record={self.record}", *server_args],
            "env": {"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"},
            "front": front or list(gateway.argv),
            "front_env": dict(gateway.env),
            "port": self.port,
            "uds": self.uds,
            "attempts": str(self.attempts),
            "ready_timeout": ready_timeout,
            "grace": 5.0,
        }  # fmt: skip
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(cfg)], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    def server_pids(self) -> list[int]:
        deadline = time.monotonic() + 30
        while not self.pid_file.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        record = json.loads(self.pid_file.read_text())
        return [record["server"], *record["children"]]

    def request(self, method: str, path: str, **headers: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            body = (
                b'{"model":"teacher","prompt":[1,2],"max_tokens":1}' if method == "POST" else None
            )
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def wait_gateway(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                if self.request("GET", "/health")[0] == 200:
                    return
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the gateway did not answer"
            time.sleep(0.05)

    def wait_logged(self) -> None:
        """Wait until the supervisor itself has logged the readiness outcome."""
        deadline = time.monotonic() + 30
        while not (self.attempts.exists() and self.attempts.read_text().endswith("\n")):
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def gateway_pid(self) -> int:
        """The gateway (in detached mode it leads its own session's group)."""
        wanted = ["-m", "kiln_registry.gateway", "--host=127.0.0.1", f"--port={self.port}"]
        (pid,) = [
            int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline(int(p))[1:5] == wanted
        ]
        return pid

    def finish(self) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err.decode()


def _cmdline(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return []


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kgs-"))  # a Unix socket path has at most 107 bytes
    yield path
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


@pytest.fixture
def runs() -> Iterator[list[GatewayRun]]:
    started: list[GatewayRun] = []
    yield started
    for run in started:  # a failed assertion must not leave processes behind
        if run.proc.poll() is None:
            run.proc.kill()
        run.proc.communicate(timeout=30)
        if run.pid_file.exists():
            server = json.loads(run.pid_file.read_text())["server"]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server, signal.SIGKILL)


def _all_gone(pgid: int, pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) or _live_group(pgid):
        assert time.monotonic() < deadline, f"left behind: {_live_group(pgid)}"
        time.sleep(0.05)


def test_the_gateway_fronts_the_socket_and_sigterm_drains_both(
    short_tmp: Path, runs: list[GatewayRun]
) -> None:
    run = GatewayRun(short_tmp)
    runs.append(run)
    pids = run.server_pids()
    run.wait_gateway()
    gateway = run.gateway_pid()
    assert run.request("POST", "/v1/completions")[0] == 401
    status, body = run.request("POST", "/v1/completions", Authorization=f"Bearer {KEY}",
                               **{"Content-Type": "application/json"})  # fmt: skip
    assert (status, body) == (200, b'{"id":"cmpl-fake","object":"text_completion","choices":[]}')
    assert run.request("GET", "/metrics", Authorization=f"Bearer {KEY}")[0] == 404
    assert KEY not in " ".join(_cmdline(gateway))
    assert KEY.encode() not in Path(f"/proc/{pids[0]}/environ").read_bytes()
    assert GATEWAY_KEY_VARIABLE.encode() not in Path(f"/proc/{pids[0]}/environ").read_bytes()
    run.wait_logged()
    run.proc.send_signal(signal.SIGTERM)
    code, err = run.finish()
    assert code == 128 + signal.SIGTERM, err
    assert KEY not in err
    _all_gone(pids[0], [*pids, gateway])
    assert not _live_group(gateway)
    seen = [json.loads(line) for line in run.record.read_text().splitlines()]
    assert {(s["method"], s["path"]) for s in seen} == {
        ("GET", "/health"),
        ("POST", "/v1/completions"),
    }
    assert all("authorization" not in s["headers"] for s in seen)
    assert [json.loads(x)["outcome"] for x in run.attempts.read_text().splitlines()] == ["ready"]


def test_the_gateway_dying_takes_vllm_down(short_tmp: Path, runs: list[GatewayRun]) -> None:
    run = GatewayRun(short_tmp)
    runs.append(run)
    pids = run.server_pids()
    run.wait_gateway()
    gateway = run.gateway_pid()
    os.kill(gateway, signal.SIGKILL)
    code, _ = run.finish()
    assert code == 128 + signal.SIGKILL  # the status of the child that ended first
    _all_gone(pids[0], [*pids, gateway])
    assert not _live_group(gateway)


def test_vllm_dying_takes_the_gateway_down(short_tmp: Path, runs: list[GatewayRun]) -> None:
    run = GatewayRun(short_tmp)
    runs.append(run)
    pids = run.server_pids()
    run.wait_gateway()
    gateway = run.gateway_pid()
    os.kill(pids[0], signal.SIGKILL)  # the server only: its children and the gateway remain
    code, _ = run.finish()
    assert code == 128 + signal.SIGKILL
    _all_gone(pids[0], [*pids, gateway])
    assert not _live_group(gateway)


def test_the_gateway_starts_only_once_vllm_is_ready(
    short_tmp: Path, runs: list[GatewayRun]
) -> None:
    marker = short_tmp / "front-started"
    front = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    run = GatewayRun(short_tmp, "--never-ready", front=front, ready_timeout=2.0)
    runs.append(run)
    pids = run.server_pids()
    code, err = run.finish()
    assert code == 2 and "supervisor.ready_deadline" in err
    assert not marker.exists()
    _all_gone(pids[0], pids)
