"""Benchmark: lookup throughput during a registration flood and a job flood (issue 27).

A real ``kiln serve`` process (``auth = "required"``, SQLite) with the
reference teacher on the tiny model registered as ``ref``.  Lookups are
``GET /v1/teachers/ref`` with a ``read`` token, driven by ``bench_registry``'s
keep-alive client in its own process (``--concurrency`` connections, exactly
``--requests`` requests).  Each round measures, back to back:

* quiet: lookups alone;
* registration flood: a ``flood`` child process with ``--flooders``
  concurrent loops, one ``register`` token, each posting new registrations
  of the reference teacher as fast as answers come (a refusal is retried at
  once, ignoring ``Retry-After``), while the lookups run;
* job flood: the same with a ``jobs`` token posting scoring jobs (64
  sequences of 32 tokens, top-K 4) that the registry's workers run against
  the teacher; afterwards every unfinished job is cancelled and the queue
  drained before the next round.

Figures: flooded lookup rate / quiet lookup rate, per round, for each flood.
Target (issue 27): >= 0.5x.  The flooding client, the teacher and the
registry share the machine's cores, as they did in the issue's measurement.

Run: ``.venv/bin/python bench/bench_flood.py [--requests N] [--repeat R]``.
The subcommand ``flood`` is the benchmark's own child process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from bench_registry import _free_port, _start_teacher, _wait_health, drive_in_child

REPO = Path(__file__).resolve().parents[1]
TOKEN_ENV = "KILN_BENCH_FLOOD_TOKEN"
KILN = [sys.executable, "-m", "kiln_registry.cli.main"]
JOB = {"kind": "teacher_scoring", "teacher": "ref", "top_k": 4,
       "sequences": [[1 + (i + j) % 60 for j in range(32)] for i in range(64)]}  # fmt: skip
SETTLE_S = 3.0  # the flood (and its first burst) is running before the lookups start


async def _flood_loop(http: httpx.AsyncClient, kind: str, teacher: str, counter: list[int]) -> None:
    for n in itertools.count():
        if kind == "register":
            body: dict[str, Any] = {"alias": f"flood-{os.getpid()}-{id(counter)}-{n}",
                                    "kind": "remote", "provider": "vllm",
                                    "model_id": "teacher-tiny", "url": teacher}  # fmt: skip
            await http.post("/v1/teachers", json=body)
        else:
            await http.post("/v1/jobs", json=JOB)
        counter[0] += 1


async def _flood(url: str, kind: str, teacher: str, flooders: int) -> None:
    headers = {"authorization": f"Bearer {os.environ[TOKEN_ENV]}"}
    counters = [[0] for _ in range(flooders)]
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120,
                                 trust_env=False) as http:  # fmt: skip
        await asyncio.gather(*(_flood_loop(http, kind, teacher, c) for c in counters))


def _start_flood(
    url: str, kind: str, teacher: str, token: str, flooders: int
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, __file__, "flood", "--url", url, "--kind", kind, "--teacher", teacher,
            "--flooders", str(flooders)]  # fmt: skip
    env = {**os.environ, TOKEN_ENV: token}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(SETTLE_S)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def _token(config: Path, name: str, scope: str) -> str:
    argv = [*KILN, "tokens", "create", "--config", str(config), "--name", name, "--scope", scope]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip()  # fmt: skip


def _drain_jobs(url: str, admin: str) -> None:
    """Cancel every unfinished job and wait until none runs (bounded)."""
    headers = {"authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60, trust_env=False) as http:
        for _ in range(120):
            open_jobs = []
            cursor = None
            for _page in range(100):
                params: dict[str, Any] = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
                page = http.get("/v1/jobs", params=params).json()
                open_jobs += [j["id"] for j in page["jobs"]
                              if j["status"] in ("queued", "running")]  # fmt: skip
                cursor = page.get("next_cursor")
                if not cursor:
                    break
            if not open_jobs:
                return
            for job_id in open_jobs:
                http.post(f"/v1/jobs/{job_id}/cancel")
            time.sleep(0.5)
    raise RuntimeError("the job queue did not drain")


def _start(workdir: Path, student: Path) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    config = workdir / "kiln.toml"
    config.write_text(f'[server]\ndatabase = "{workdir / "registry.db"}"\nlog_level = "warning"\n'
                      f'auth = "required"\n[student]\nmodel_path = "{student}"\n',
                      encoding="utf-8")  # fmt: skip
    tokens = {scope: _token(config, f"bench-{scope}", scope)
              for scope in ("read", "register", "jobs", "admin")}  # fmt: skip
    port = _free_port()
    argv = [*KILN, "serve", "--config", str(config), "--port", str(port)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_health(url, proc)
    return proc, url, tokens


def _round(
    url: str, teacher: str, tokens: dict[str, str], args: argparse.Namespace
) -> dict[str, float]:
    path = "/v1/teachers/ref"
    quiet = drive_in_child(url, path, args.requests, args.concurrency, tokens["read"])
    row = {"quiet_rps": quiet["rps"]}
    for kind in ("register", "jobs"):
        flood = _start_flood(url, kind, teacher, tokens[kind], args.flooders)
        try:
            row[f"{kind}_flood_rps"] = drive_in_child(
                url, path, args.requests, args.concurrency, tokens["read"]
            )["rps"]
        finally:
            _stop(flood)
        if kind == "jobs":
            _drain_jobs(url, tokens["admin"])
    print(f"quiet {row['quiet_rps']:7.0f}/s  registration flood {row['register_flood_rps']:7.0f}/s"
          f"  job flood {row['jobs_flood_rps']:7.0f}/s", file=sys.stderr, flush=True)  # fmt: skip
    return row


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        workdir = Path(tmp)
        _clock, teacher_url, (served, model) = _start_teacher(workdir)
        registry, url, tokens = _start(workdir, model.path)
        try:
            headers = {"authorization": f"Bearer {tokens['register']}"}
            body = {"alias": "ref", "kind": "remote", "provider": "vllm",
                    "model_id": "teacher-tiny", "url": teacher_url}  # fmt: skip
            httpx.post(url + "/v1/teachers", json=body, headers=headers,
                       timeout=60, trust_env=False).raise_for_status()  # fmt: skip
            drive_in_child(url, "/v1/teachers/ref", 500, args.concurrency, tokens["read"])  # warm
            rows = [_round(url, teacher_url, tokens, args) for _ in range(args.repeat)]
        finally:
            registry.terminate()
            registry.wait(30)
            served.__exit__(None, None, None)
    ratios = {kind: [r[f"{kind}_flood_rps"] / r["quiet_rps"] for r in rows]
              for kind in ("register", "jobs")}  # fmt: skip
    print(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "requests": args.requests, "concurrency": args.concurrency, "repeat": args.repeat,
        "flooders": args.flooders, "target_ratio": 0.5,
        "register_ratio_median": round(statistics.median(ratios["register"]), 3),
        "jobs_ratio_median": round(statistics.median(ratios["jobs"]), 3),
        "rounds": [{k: round(v) for k, v in r.items()} for r in rows],
    }, indent=2))  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    flood = sub.add_parser("flood")
    flood.add_argument("--url", required=True)
    flood.add_argument("--kind", choices=("register", "jobs"), required=True)
    flood.add_argument("--teacher", required=True)
    flood.add_argument("--flooders", type=int, required=True)
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--flooders", type=int, default=8)
    return parser


if __name__ == "__main__":
    parsed = _parser().parse_args()
    if parsed.mode == "flood":
        asyncio.run(_flood(parsed.url, parsed.kind, parsed.teacher, parsed.flooders))
    else:
        main(parsed)
