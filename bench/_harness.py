"""What the job benchmarks share: the teacher and registry child processes and a job's timing.

``bench_jobs.py`` (teacher scoring) and ``bench_generation.py`` (off-policy
generation) both start the reference teacher (``kiln reference-teacher``)
and a registry (``kiln serve``) as child processes on loopback, register the
teacher, submit jobs and time them from the server's own ``created_at`` and
``finished_at``.  Imported by those scripts (``bench/`` is their
``sys.path[0]``); never by the package or the tests.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

KILN = [sys.executable, "-m", "kiln_registry.cli.main"]
REGISTRY_STARTUP_S = 120.0


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen([*KILN, *args], stdout=subprocess.PIPE, stderr=sink)


def teacher(
    model: Path, tmp: Path, threads: int, model_id: str, max_model_len: int = 64
) -> tuple[subprocess.Popen[bytes], str]:
    """The reference teacher on ``model`` (K <= 8, ``max_model_len`` tokens): the process
    and its URL."""
    proc = start(
        ["reference-teacher", "--model-path", str(model), "--served-model-id", model_id,
         "--max-top-k", "8", "--max-model-len", str(max_model_len), "--port", "0",
         "--threads", str(threads)],
        tmp / "teacher.log",
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, str(json.loads(proc.stdout.readline())["url"])


def registry_config(tmp: Path, port: int, model: Path, concurrency: int) -> Path:
    config = tmp / "kiln.toml"
    config.write_text(
        f'[server]\nport = {port}\ndatabase = "{tmp / "registry.db"}"\n'
        f'[student]\nmodel_path = "{model}"\n'
        f'[jobs]\nconcurrency = {concurrency}\ncorpus_root = "{tmp / "corpora"}"\n',
        encoding="utf-8",
    )
    return config


def registry(config: Path, tmp: Path, url: str) -> subprocess.Popen[bytes]:
    """``kiln serve --config``, once its /health answers."""
    proc = start(["serve", "--config", str(config)], tmp / "serve.log")
    deadline = time.monotonic() + REGISTRY_STARTUP_S
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit((tmp / "serve.log").read_text())
        time.sleep(0.1)


def register(url: str, model_id: str, teacher_url: str) -> None:
    """Registers the teacher under the alias ``ref``."""
    reg = {"alias": "ref", "kind": "remote", "provider": "vllm", "model_id": model_id,
           "url": teacher_url}  # fmt: skip
    assert httpx.post(url + "/v1/teachers", json=reg, timeout=60).status_code == 200


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


@dataclass(frozen=True)
class Served:
    teacher: subprocess.Popen[bytes]
    teacher_url: str
    registry: subprocess.Popen[bytes]
    url: str


@contextmanager
def serving(
    tmp: Path,
    port: int,
    model: Path,
    *,
    concurrency: int,
    threads: int,
    model_id: str,
    max_model_len: int = 64,
) -> Iterator[Served]:
    """The teacher and a registry on ``port`` with the teacher registered as ``ref``."""
    config = registry_config(tmp, port, model, concurrency)
    t_proc, t_url = teacher(model, tmp, threads, model_id, max_model_len)
    url = f"http://127.0.0.1:{port}"
    r_proc = registry(config, tmp, url)
    try:
        register(url, model_id, t_url)
        yield Served(t_proc, t_url, r_proc, url)
    finally:
        stop(r_proc, t_proc)


def stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


# Seconds between status polls.  Timing comes from the server's own timestamps, so the
# interval only decides how soon the bench notices the end; each poll costs the registry
# 2-4 ms of CPU (the whole middleware stack), taken from the job it is timing.
POLL_S = 1.0


def run_job(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """Submit ``body``, poll until it ends (it must succeed); ``seconds`` from its timestamps."""
    # One client for the whole poll: a new client per poll costs CPU the job needs.
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as http:
        job = http.post("/v1/jobs", json=body).json()
        while job["status"] not in ("succeeded", "failed", "cancelled"):
            time.sleep(POLL_S)
            job = http.get(f"/v1/jobs/{job['id']}").json()
    assert job["status"] == "succeeded", job
    stamps = job["timestamps"]
    job["seconds"] = stamp(stamps["finished_at"]) - stamp(stamps["created_at"])
    return dict(job)


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}  # fmt: skip
