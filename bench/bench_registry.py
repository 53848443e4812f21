"""Benchmark: registry lookups against a bare FastAPI route, and registration overhead.

Throughput: ``GET /v1/teachers/{alias}`` of a verified alias served by a real
``kiln serve`` process, against a bare FastAPI app whose one route returns a
constant JSON body, run with the same uvicorn settings and the same logging
set-up (``server.configure_logging`` + ``uvicorn.run`` with identical
arguments).  Both are driven from a separate process by a small keep-alive
HTTP/1.1 client (asyncio streams, ``--concurrency`` connections, exactly
``--requests`` requests), alternating bare/registry ``--repeat`` times in the
same run.  Target: registry >= 0.8x bare (median of the per-repeat ratios).
The registry runs with ``[server] auth = "required"`` and every request of
both arms carries the same bearer token (made by ``kiln tokens create``
before the server starts; handed to the driver in its environment), so the
ratio includes the token check (issue 15 asks >= 0.7x with a token).

Registration overhead: ``POST /v1/teachers`` against the reference teacher on
the tiny model, timed by the caller, minus the time the teacher itself spent
on the probe requests (summed by an ASGI middleware inside the teacher).

Run: ``.venv/bin/python bench/bench_registry.py [--requests N] [--repeat R]``.
Subcommands ``bare`` and ``drive`` are the benchmark's own child processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ALIAS = "bench-teacher@vllm"
BARE_BODY = {"spec": {"alias": ALIAS}, "status": "verified", "usable": True}


TOKEN_ENV = "KILN_BENCH_TOKEN"


def run_bare(port: int) -> None:
    """The baseline server: same logging set-up and uvicorn arguments as ``kiln serve``."""
    import uvicorn
    from fastapi import FastAPI

    from kiln_registry.serve.startup import LOG_LEVELS, configure_logging

    app = FastAPI()

    @app.get("/v1/teachers/{alias}")
    async def constant(alias: str) -> dict[str, Any]:
        return BARE_BODY

    configure_logging("text", frozenset(), "warning")
    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None,
                log_level=LOG_LEVELS["warning"], server_header=False,
                timeout_graceful_shutdown=10)  # fmt: skip


async def _worker(host: str, port: int, path: str, budget: list[int]) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    # Both arms send the same bearer token (from the environment, never argv); the
    # registry checks it (auth = "required"), the bare app ignores it.
    token = os.environ.get(TOKEN_ENV, "")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\n".encode()
    done = 0
    try:
        while budget[0] > 0:
            budget[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head[:80].decode("latin-1"))
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))  # fmt: skip
            await reader.readexactly(length)
            done += 1
    finally:
        writer.close()
    return done


async def _drive(url: str, path: str, requests: int, concurrency: int) -> dict[str, float]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    budget = [requests]
    started = time.perf_counter()
    counts = await asyncio.gather(*(_worker(host, int(port), path, budget)
                                    for _ in range(concurrency)))  # fmt: skip
    elapsed = time.perf_counter() - started
    return {"requests": float(sum(counts)), "seconds": elapsed, "rps": sum(counts) / elapsed}


def drive_in_child(
    url: str, path: str, requests: int, concurrency: int, token: str
) -> dict[str, float]:
    argv = [sys.executable, __file__, "drive", "--url", url, "--path", path,
            "--requests", str(requests), "--concurrency", str(concurrency)]  # fmt: skip
    env = {**os.environ, TOKEN_ENV: token}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True, env=env)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def _wait_health(url: str, proc: subprocess.Popen[bytes], path: str = "/health") -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=1, trust_env=False).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def _free_port() -> int:
    from tests.helpers import free_port

    return free_port()


Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]


class TeacherClock:
    """ASGI wrapper summing the teacher's own time per completion request."""

    def __init__(self, app: ASGI) -> None:
        self.app, self.seconds = app, 0.0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http" and scope["path"] == "/v1/completions":
                self.seconds += time.perf_counter() - started


def _start_teacher(workdir: Path) -> tuple[TeacherClock, str, Any]:
    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher
    from kiln_registry.testing.tiny_models import build_tiny_llama
    from tests.helpers import serve_app

    model = build_tiny_llama(workdir / "model")
    teacher, _ = load_reference_teacher(
        model.path, served_model_id="teacher-tiny", max_top_k=8, max_model_len=64
    )
    clock = TeacherClock(create_reference_app(teacher, api_key_env=None))
    served = serve_app(clock)
    return clock, served.__enter__(), (served, model)


def _registration_overhead(
    url: str, teacher: str, clock: TeacherClock, n: int, token: str
) -> dict[str, float]:
    walls, overheads = [], []
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=60, trust_env=False, headers=headers) as http:
        for i in range(n):
            clock.seconds = 0.0
            started = time.perf_counter()
            response = http.post("/v1/teachers", json={
                "alias": f"reg-{i}", "kind": "remote", "provider": "vllm",
                "model_id": "teacher-tiny", "url": teacher})  # fmt: skip
            wall = time.perf_counter() - started
            response.raise_for_status()
            walls.append(wall)
            overheads.append(wall - clock.seconds)
    shares = [o / w for o, w in zip(overheads, walls, strict=True)]
    return {
        "wall_ms": statistics.median(walls) * 1e3,
        "overhead_ms": statistics.median(overheads) * 1e3,
        "overhead_share": statistics.median(shares),
    }


def _create_token(config: Path) -> str:
    """An admin token, made by ``kiln tokens create`` before the server starts."""
    argv = [sys.executable, "-m", "kiln_registry.cli.main", "tokens", "create", "--config",
            str(config), "--name", "bench", "--scope", "admin"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


def _start_registry(workdir: Path, student: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    config = workdir / "kiln.toml"
    config.write_text(f'[server]\ndatabase = "{workdir / "registry.db"}"\nlog_level = "warning"\n'
                      f'auth = "required"\n'
                      f'[student]\nmodel_path = "{student}"\n', encoding="utf-8")  # fmt: skip
    token = _create_token(config)
    port = _free_port()
    argv = [sys.executable, "-m", "kiln_registry.cli.main", "serve", "--config", str(config),
            "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_health(url, proc)
    return proc, url, token


def _start_bare() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, __file__, "bare", "--port", str(port)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    _wait_health(url, proc, f"/v1/teachers/{ALIAS}")
    return proc, url


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-registry-") as tmp:
        workdir = Path(tmp)
        clock, teacher_url, (served, model) = _start_teacher(workdir)
        registry, registry_url, token = _start_registry(workdir, model.path)
        bare, bare_url = _start_bare()
        try:
            overhead = _registration_overhead(
                registry_url, teacher_url, clock, args.registrations, token
            )
            headers = {"authorization": f"Bearer {token}"}
            with httpx.Client(
                base_url=registry_url, timeout=60, trust_env=False, headers=headers
            ) as http:
                body = {"alias": ALIAS, "kind": "remote", "provider": "vllm",
                        "model_id": "teacher-tiny", "url": teacher_url}  # fmt: skip
                http.post("/v1/teachers", json=body).raise_for_status()
            path = f"/v1/teachers/{ALIAS}"
            drive_in_child(bare_url, path, 500, args.concurrency, token)  # warm-up
            drive_in_child(registry_url, path, 500, args.concurrency, token)
            rows = []
            for _ in range(args.repeat):
                b = drive_in_child(bare_url, path, args.requests, args.concurrency, token)
                r = drive_in_child(registry_url, path, args.requests, args.concurrency, token)
                rows.append((b["rps"], r["rps"]))
                print(f"bare {b['rps']:8.0f} req/s   registry {r['rps']:8.0f} req/s"
                      f"   ratio {r['rps'] / b['rps']:.2f}x", flush=True)  # fmt: skip
        finally:
            for proc in (registry, bare):
                proc.terminate()
                proc.wait(30)
            served.__exit__(None, None, None)
    bare_med = statistics.median(b for b, _ in rows)
    reg_med = statistics.median(r for _, r in rows)
    ratio = statistics.median(r / b for b, r in rows)
    print(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "requests": args.requests, "concurrency": args.concurrency, "repeat": args.repeat,
        "bare_rps_median": round(bare_med), "registry_rps_median": round(reg_med),
        "ratio_median": round(ratio, 3), "target_ratio": 0.8,
        "rounds": [{"bare_rps": round(b), "registry_rps": round(r)} for b, r in rows],
        "registration": {k: round(v, 3) for k, v in overhead.items()},
    }, indent=2))  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    bare = sub.add_parser("bare")
    bare.add_argument("--port", type=int, required=True)
    drive = sub.add_parser("drive")
    drive.add_argument("--url", required=True)
    drive.add_argument("--path", required=True)
    drive.add_argument("--requests", type=int, required=True)
    drive.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--registrations", type=int, default=20)
    return parser


if __name__ == "__main__":
    parsed = _parser().parse_args()
    if parsed.mode == "bare":
        run_bare(parsed.port)
    elif parsed.mode == "drive":
        result = asyncio.run(_drive(parsed.url, parsed.path, parsed.requests, parsed.concurrency))
        print(json.dumps(result))
    else:
        main(parsed)
