"""Processes of the real-vLLM tier: ``kiln-teacher`` launches, stock vLLM, ``kiln serve``.

Every child gets an explicit, minimal environment (never the test process's):
``PATH``, ``HOME``, offline Hugging Face, no usage statistics, a 1 GiB CPU KV
cache.  Each runs in its own session so a test can signal it alone.  Deadlines
are generous because CI machines have two cores and vLLM takes 20 s to minutes
to start there.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from kiln_registry.launcher.runtime_memo import MEMO_NAME
from kiln_registry.launcher.supervisor import group_members
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
READY_S = 900.0  # launcher runtime hashing + vLLM start on two busy cores
STOP_S = 120.0
SERVED = "teacher-tiny"
MAX_TOP_K = 8
MAX_MODEL_LEN = 64


def child_environment() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }


def kiln_teacher() -> list[str]:
    """The ``kiln-teacher`` script of this interpreter's environment."""
    script = Path(sys.executable).parent / "kiln-teacher"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kiln_registry.launcher"]


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def wait_health(url: str, proc: subprocess.Popen[bytes], deadline_s: float, log: Path) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before /health: {tail(log)}")
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url}/health not ready in {deadline_s:g} s: {tail(log)}")


def tail(log: Path, size: int = 4000) -> str:
    data = log.read_bytes() if log.exists() else b""
    return data[-size:].decode("utf-8", "replace")


def stop(proc: subprocess.Popen[bytes], signum: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(signum)
    try:
        return proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


@dataclass
class Launched:
    """A running ``kiln-teacher`` and its announcement line."""

    proc: subprocess.Popen[bytes]
    announcement: dict[str, Any]
    snapshots: Path
    caches: Path
    log: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def vllm_pids(self) -> list[int]:
        """Every pid the launcher's attempts log names (the vLLM group leaders)."""
        path = self.caches / "attempts.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        return sorted({int(json.loads(line)["pid"]) for line in lines if json.loads(line)["pid"]})

    def leftovers(self) -> list[str]:
        """Snapshots, caches and live processes of the vLLM groups still present."""
        found = [p.name for p in self.snapshots.iterdir()]
        kept = ("attempts.jsonl", MEMO_NAME)  # the attempts log and the runtime memo stay
        found += [p.name for p in self.caches.iterdir() if p.name not in kept]
        leaders = [self.proc.pid, *self.vllm_pids()]  # the launcher's group and vLLM's
        found += [f"pid {pid}" for leader in leaders for pid in group_members(leader)]
        return found


def _read_line(stream: IO[bytes], timeout: float) -> bytes:
    box: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: box.put(stream.readline()), daemon=True).start()
    try:
        return box.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no announcement line in {timeout:g} s") from None


def start_launch(
    workdir: Path, model: Path, *, served: str = SERVED, adapter: Path | None = None,
    max_model_len: int = MAX_MODEL_LEN, max_top_k: int = MAX_TOP_K,
) -> Launched:  # fmt: skip
    """Start ``kiln-teacher`` on the tiny model (eager, float32); returns at once."""
    snapshots, caches = private_dir(workdir / "snapshots"), private_dir(workdir / "caches")
    port, log = free_port(), workdir / "kiln-teacher.log"
    argv = [
        *kiln_teacher(),
        f"--model-path={model}",
        f"--snapshot-root={snapshots}",
        f"--cache-root={caches}",
        f"--served-model-id={served}",
        f"--max-top-k={max_top_k}",
        f"--max-model-len={max_model_len}",
    ]
    if adapter is not None:
        argv.append(f"--adapter-path={adapter}")
    argv += ["--", "--host=127.0.0.1", f"--port={port}", "--enforce-eager", "--dtype=float32"]
    env = {**child_environment(), "KILN_TEACHER_READY_TIMEOUT_SECONDS": str(int(READY_S))}
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=sink, start_new_session=True
        )
    return Launched(proc, {}, snapshots, caches, log, port)


def launch(
    workdir: Path, model: Path, *, served: str = SERVED, adapter: Path | None = None,
    max_model_len: int = MAX_MODEL_LEN, max_top_k: int = MAX_TOP_K,
) -> Launched:  # fmt: skip
    """``start_launch``, then the announcement line, then /health 200."""
    launched = start_launch(workdir, model, served=served, adapter=adapter,
                            max_model_len=max_model_len, max_top_k=max_top_k)  # fmt: skip
    proc, log = launched.proc, launched.log
    try:
        assert proc.stdout is not None
        line = _read_line(proc.stdout, READY_S)
        if not line:
            raise AssertionError(f"kiln-teacher exited {proc.wait(30)}: {tail(log)}")
        launched.announcement = json.loads(line)
        wait_health(launched.url, proc, READY_S, log)
    except BaseException:
        if proc.poll() is None:
            stop(proc)
        elif proc.stdout is not None:
            proc.stdout.close()
        raise
    return launched


@dataclass
class Registry:
    """A real ``kiln serve`` subprocess."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    local_roots: tuple[Path, Path] = field(default=(Path("."), Path(".")))

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=READY_S + 60, trust_env=False)


def start_registry(config: Path, log: Path) -> Registry:
    port = free_port()
    argv = [sys.executable, "-m", "kiln_registry.cli.main", "serve", "--config", str(config)]
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [*argv, "--port", str(port)],
            cwd=REPO,
            env=child_environment(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    wait_health(url, proc, 120, log)
    return Registry(proc, url, log)


def start_stock_vllm(model: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """vLLM without the launcher: its default ``vllm-*`` fingerprint, no identity."""
    port = free_port()
    argv = [
        sys.executable,
        *("-m", "vllm.entrypoints.openai.api_server"),
        f"--model={model}",
        "--served-model-name=stock",
        f"--max-model-len={MAX_MODEL_LEN}",
        f"--max-logprobs={MAX_TOP_K}",
        "--enforce-eager",
        "--dtype=float32",
        "--host=127.0.0.1",
        f"--port={port}",
    ]
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            argv,
            cwd="/",
            env=child_environment(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc, READY_S, log)
    except BaseException:
        stop(proc)
        raise
    return proc, url
