"""Benchmark: the registry on PostgreSQL against SQLite, and jobs scaled out over replicas.

``lookup``: ``GET /v1/teachers/{alias}`` of a verified alias, served by a real
``kiln serve`` on a SQLite file against one on a PostgreSQL database (a
throw-away server started here, ``tests/pg_server.py``: initdb as an
unprivileged user, loopback, fsync on), both with ``auth = "required"`` and
the same bearer token, driven by ``bench_registry``'s keep-alive client in a
child process, alternating SQLite/PostgreSQL ``--repeat`` times in the same
run.  Target: PostgreSQL >= 0.5x SQLite (median of the per-repeat ratios).

``jobs``: the same corpus work (``--jobs`` scoring jobs over one corpus of
``--sequences`` sequences, score cache off) run by one teacher replica and
one ``kiln worker`` against two replicas (one alias, ``urls``) and two
workers, all on one PostgreSQL database behind a worker-less ``kiln serve``.
Each teacher replica is the reference teacher in its own process behind a
stand-in for a GPU: at most ``--capacity`` requests at once, each held for a
fixed ``--service-ms`` on top of the tiny model's own time, so the figure
measures the system (claims, leases, spreading) rather than this machine's
two cores.  The host lists two devices, so two workers on it never wait for
a device lease.  Throughput is sequences per second from the first claim
(``claimed_at``: worker start-up excluded) to the last ``finished_at`` (the
server's own timestamps); the arms alternate ``--rounds`` times, each on a fresh
database.  Target: >= 1.8x (median of the per-round ratios).

Run: ``.venv/bin/python bench/bench_scaleout.py [lookup|jobs|all] [--repeat R]``.
The subcommand ``teacher`` is the benchmark's own child process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench_registry as reg  # noqa: E402  (bench/ is sys.path[0])
from _harness import stamp  # noqa: E402

from tests.pg_server import PostgresServer  # noqa: E402


@contextmanager
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer.start()
    os.environ[server.password_env] = server.password
    try:
        yield server
    finally:
        server.stop()


def _config(workdir: Path, student: Path, database: dict[str, str]) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    lines = ["[server]", *(f'{key} = "{value}"' for key, value in database.items()),
             'log_level = "warning"', 'auth = "required"', "",
             "[student]", f'model_path = "{student}"', ""]  # fmt: skip
    config = workdir / "kiln.toml"
    config.write_text("\n".join(lines), encoding="utf-8")
    return config


def _serve(config: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    token = reg._create_token(config)
    port = reg._free_port()
    argv = [sys.executable, "-m", "kiln_registry.cli.main", "serve", "--config", str(config),
            "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    reg._wait_health(url, proc)
    return proc, url, token


def _register(url: str, token: str, teacher_url: str) -> None:
    body = {"alias": reg.ALIAS, "kind": "remote", "provider": "vllm",
            "model_id": "teacher-tiny", "url": teacher_url}  # fmt: skip
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=60, trust_env=False, headers=headers) as http:
        http.post("/v1/teachers", json=body).raise_for_status()


def lookup(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as tmp, postgres() as pg:
        workdir = Path(tmp)
        _clock, teacher_url, (served, model) = reg._start_teacher(workdir)
        lite_cfg = _config(workdir / "sqlite", model.path,
                           {"database": str(workdir / "sqlite" / "registry.db")})  # fmt: skip
        pg_cfg = _config(workdir / "pg", model.path,
                         {"database": pg.new_database("bench"),
                          "database_password_env": pg.password_env,
                          "state_dir": str(workdir / "pg")})  # fmt: skip
        servers = [_serve(lite_cfg), _serve(pg_cfg)]
        rows: list[tuple[float, float]] = []
        try:
            for _proc, url, token in servers:
                _register(url, token, teacher_url)
            path = f"/v1/teachers/{reg.ALIAS}"
            for _proc, url, token in servers:  # warm-up
                reg.drive_in_child(url, path, 500, args.concurrency, token)
            (_, lite_url, lite_token), (_, pg_url, pg_token) = servers
            for _ in range(args.repeat):
                lite = reg.drive_in_child(lite_url, path, args.requests, args.concurrency,
                                          lite_token)  # fmt: skip
                post = reg.drive_in_child(pg_url, path, args.requests, args.concurrency, pg_token)
                rows.append((lite["rps"], post["rps"]))
                print(f"sqlite {lite['rps']:8.0f} req/s   postgres {post['rps']:8.0f} req/s"
                      f"   ratio {post['rps'] / lite['rps']:.2f}x", flush=True)  # fmt: skip
        finally:
            for proc, _url, _token in servers:
                proc.terminate()
                proc.wait(30)
            served.__exit__(None, None, None)
    return {
        "requests": args.requests, "concurrency": args.concurrency, "repeat": args.repeat,
        "sqlite_rps_median": round(statistics.median(s for s, _ in rows)),
        "postgres_rps_median": round(statistics.median(p for _, p in rows)),
        "ratio_median": round(statistics.median(p / s for s, p in rows), 3),
        "target_ratio": 0.5,
        "rounds": [{"sqlite_rps": round(s), "postgres_rps": round(p)} for s, p in rows],
    }  # fmt: skip


class GpuStandIn:
    """ASGI wrapper: ``capacity`` completions at once, each held ``service_s`` longer."""

    def __init__(self, app: Any, capacity: int, service_s: float) -> None:
        self.app, self.capacity, self.service_s = app, capacity, service_s
        self.slots: asyncio.Semaphore | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            await self.app(scope, receive, send)
            return
        self.slots = self.slots or asyncio.Semaphore(self.capacity)
        async with self.slots:
            await asyncio.sleep(self.service_s)
            await self.app(scope, receive, send)


def run_teacher(args: argparse.Namespace) -> None:
    """Child process: the reference teacher behind ``GpuStandIn`` on ``--port``."""
    import torch
    import uvicorn

    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher

    torch.set_num_threads(1)
    teacher, _ = load_reference_teacher(
        Path(args.model), served_model_id="teacher-tiny", max_top_k=8, max_model_len=64
    )
    app = GpuStandIn(create_reference_app(teacher, api_key_env=None), args.capacity,
                     args.service_ms / 1000)  # fmt: skip
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


def _write_corpus(path: Path, count: int) -> None:
    rng = random.Random(17)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            ids = [rng.randrange(512) for _ in range(rng.randint(8, 48))]
            out.write(json.dumps({"id": f"s{i}", "token_ids": ids}) + "\n")


def _jobs_config(root: Path, url: str, pg: PostgresServer, student: Path,
                 args: argparse.Namespace) -> Path:  # fmt: skip
    lines = ["[server]", f'database = "{url}"', f'database_password_env = "{pg.password_env}"',
             f'state_dir = "{root}"', 'log_level = "warning"', "",
             "[student]", f'model_path = "{student}"', "",
             "[jobs]", "workers = 1", f"concurrency = {args.job_concurrency}", "cache = false",
             "embedded_workers = false", f'corpus_root = "{root / "corpora"}"',
             'devices = ["cuda:0", "cuda:1"]',  # two device leases on this host: never waited on
             "lease_heartbeat_s = 1.0", "lease_timeout_s = 5.0", ""]  # fmt: skip
    config = root / "kiln.toml"
    config.write_text("\n".join(lines), encoding="utf-8")
    return config


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(argv, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)


def _one_arm(workdir: Path, pg: PostgresServer, model: Path, teachers: list[str], workers: int,
             args: argparse.Namespace) -> float:  # fmt: skip
    """Sequences per second for ``--jobs`` jobs on ``len(teachers)`` replicas, ``workers``."""
    root = workdir / f"arm-{len(teachers)}x{workers}-{time.monotonic_ns()}"
    _write_corpus(root / "corpora" / "corpus.jsonl", args.sequences)
    config = _jobs_config(root, pg.new_database("scaleout"), pg, model, args)
    port = reg._free_port()
    kiln = [sys.executable, "-m", "kiln_registry.cli.main"]
    procs = [_spawn([*kiln, "serve", "--config", str(config), "--port", str(port)],
                    root / "serve.log")]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        reg._wait_health(url, procs[0])
        procs += [_spawn([*kiln, "worker", "--config", str(config)], root / f"worker{i}.log")
                  for i in range(workers)]  # fmt: skip
        where: dict[str, Any] = {"urls": teachers} if len(teachers) > 1 else {"url": teachers[0]}
        body = {"alias": "ref", "kind": "remote", "provider": "vllm",
                "model_id": "teacher-tiny", **where}  # fmt: skip
        with httpx.Client(base_url=url, timeout=120, trust_env=False) as http:
            http.post("/v1/teachers", json=body).raise_for_status()
            job = {"kind": "teacher_scoring", "teacher": "ref", "top_k": 8,
                   "corpus": {"path": "corpus.jsonl"}}  # fmt: skip
            ids = [http.post("/v1/jobs", json=job).json()["id"] for _ in range(args.jobs)]
            done = [_finished(http, job_id) for job_id in ids]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)
    # From the first claim: a worker process's start-up (imports) is not throughput.
    start = min(stamp(j["timestamps"]["claimed_at"]) for j in done)
    end = max(stamp(j["timestamps"]["finished_at"]) for j in done)
    if args.verbose:
        for j in done:
            t = {k: stamp(v) - start for k, v in j["timestamps"].items() if v}
            print(f"  {len(teachers)}x{workers} {j['id'][:8]} " + " ".join(
                f"{k.removesuffix('_at')}={v:.2f}" for k, v in sorted(t.items(), key=lambda x: x[1])
            ), flush=True)  # fmt: skip
    return float(args.jobs * args.sequences) / (end - start)


def _finished(http: httpx.Client, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        job: dict[str, Any] = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            if job["status"] != "succeeded":
                raise SystemExit(f"job {job_id} ended {job['status']}: {job}")
            return job
        time.sleep(0.2)
    raise SystemExit(f"job {job_id} did not finish")


def jobs(args: argparse.Namespace) -> dict[str, Any]:
    from kiln_registry.testing.tiny_models import build_tiny_llama

    with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as tmp, postgres() as pg:
        workdir = Path(tmp)
        model = build_tiny_llama(workdir / "model").path
        ports = [reg._free_port() for _ in range(2)]
        teachers = [_spawn([sys.executable, __file__, "teacher", "--port", str(p), "--model",
                            str(model), "--capacity", str(args.capacity), "--service-ms",
                            str(args.service_ms)], workdir / f"teacher{p}.log")
                    for p in ports]  # fmt: skip
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        rows: list[tuple[float, float]] = []
        try:
            for proc, url in zip(teachers, urls, strict=True):
                reg._wait_health(url, proc, "/v1/models")
            for _ in range(args.rounds):
                one = _one_arm(workdir, pg, model, urls[:1], 1, args)
                two = _one_arm(workdir, pg, model, urls, 2, args)
                rows.append((one, two))
                print(f"1x1 {one:7.1f} seq/s   2x2 {two:7.1f} seq/s   ratio {two / one:.2f}x",
                      flush=True)  # fmt: skip
        finally:
            for proc in teachers:
                proc.terminate()
                proc.wait(30)
    return {
        "jobs": args.jobs, "sequences": args.sequences, "capacity": args.capacity,
        "service_ms": args.service_ms, "job_concurrency": args.job_concurrency,
        "rounds": [{"one_by_one_seq_s": round(a, 2), "two_by_two_seq_s": round(b, 2)}
                   for a, b in rows],
        "ratio_median": round(statistics.median(b / a for a, b in rows), 3),
        "target_ratio": 1.8,
    }  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", choices=("lookup", "jobs", "all", "teacher"),
                        default="all")  # fmt: skip
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--sequences", type=int, default=120)
    parser.add_argument("--capacity", type=int, default=2)
    parser.add_argument("--service-ms", type=float, default=100.0)
    parser.add_argument("--job-concurrency", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="")
    parser.add_argument("--verbose", action="store_true", help="print each job's phase times")
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.part == "teacher":
        run_teacher(args)
        return
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    if args.part in ("lookup", "all"):
        result["lookup"] = lookup(args)
    if args.part in ("jobs", "all"):
        result["jobs"] = jobs(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
