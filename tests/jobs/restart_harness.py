"""What the kill-and-restart tests share: `kiln serve` as a subprocess and the job polling.

``serve_config`` writes the kiln.toml both tests run with (concurrency 1, a
result root under ``tmp_path``); ``kiln_serve`` starts the server and waits
for /health (generous on a loaded machine); ``wait_progress`` waits until a
job has done some rows (then the test kills the server), ``wait_finished``
until it succeeded or failed; ``result_and_keys`` downloads its corpus and
the registry's signing keys.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from kiln_registry.jobs.core.signing import PublicKey, parse_keys
from tests.pg_server import database_settings

STARTUP_S = 120.0


def serve_config(tmp_path: Path, port: int, model_path: Path) -> Path:
    config = tmp_path / "kiln.toml"
    database = "".join(f'{k} = "{v}"\n' for k, v in database_settings(tmp_path).items())
    config.write_text(
        f"[server]\nport = {port}\n{database}"
        f'[student]\nmodel_path = "{model_path}"\n'
        f'[jobs]\nconcurrency = 1\nresult_root = "{tmp_path / "results"}"\n'
        # A killed holder's lease runs out quickly (the default is 30 s).
        "lease_heartbeat_s = 0.2\nlease_timeout_s = 1.0\n",
        encoding="utf-8",
    )
    return config


@contextmanager
def kiln_serve(config: Path, log: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """`kiln serve` as a subprocess, up once /health answers."""
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kiln_registry.cli.main", "serve", "--config", str(config)],
            stdout=sink, stderr=sink, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "kiln serve did not start"
            time.sleep(0.05)
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes], wait_s: float = 30.0) -> int:
    """SIGTERM (SIGKILL if it does not end in ``wait_s``); the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return int(proc.returncode)


def job(url: str, job_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json())


def register(url: str, body: dict[str, object]) -> None:
    assert httpx.post(f"{url}/v1/teachers", json=body, timeout=30).status_code == 200


def submit_scoring(url: str, teacher_port: int, sequences: list[list[int]]) -> str:
    """Register the teacher on ``teacher_port`` as ``t`` and submit a K=2 job; its id."""
    teacher = f"http://127.0.0.1:{teacher_port}"
    register(url, {"alias": "t", "kind": "remote", "provider": "vllm",
                   "model_id": "teacher-tiny", "url": teacher})  # fmt: skip
    submitted = httpx.post(f"{url}/v1/jobs", timeout=30, json={
        "kind": "teacher_scoring", "teacher": "t", "top_k": 2, "sequences": sequences,
    })  # fmt: skip
    assert submitted.status_code == 201, submitted.text
    return str(submitted.json()["id"])


def wait_progress(url: str, job_id: str, done: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while int(job(url, job_id)["progress"]["done"]) < done:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def wait_finished(url: str, job_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (current := job(url, job_id))["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, current
        time.sleep(0.05)
    return current


def result_and_keys(url: str, job_id: str) -> tuple[httpx.Response, dict[str, PublicKey]]:
    result = httpx.get(f"{url}/v1/jobs/{job_id}/result", timeout=30)
    keys = parse_keys(httpx.get(f"{url}/v1/keys", timeout=30).json(), "GET /v1/keys")
    return result, keys
