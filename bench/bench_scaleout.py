"""Benchmark: the registry on PostgreSQL against SQLite, and jobs scaled out over replicas.

``lookup``: ``GET /v1/teachers/{alias}`` of a verified alias, served by a real
``kiln serve`` on a SQLite file against one on a PostgreSQL database (a
throw-away server started here, ``tests/pg_server.py``: initdb as an
unprivileged user, loopback, fsync on), both with ``auth = "required"`` and
the same bearer token, driven by ``bench_registry``'s keep-alive client in a
child process, alternating SQLite/PostgreSQL ``--repeat`` times in the same
run.  Target: PostgreSQL >= 0.5x SQLite (median of the per-repeat ratios).

``jobs``: the same corpus work with one teacher replica and one ``kiln
worker`` against two replicas and two workers (see ``scaleout_jobs``).
Target: >= 1.8x throughput.

Run: ``.venv/bin/python bench/bench_scaleout.py [lookup|jobs|all] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench_registry as reg  # noqa: E402  (bench/ is sys.path[0])

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", choices=("lookup", "jobs", "all"), default="all")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    return parser


def main() -> None:
    args = _parser().parse_args()
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    if args.part in ("lookup", "all"):
        result["lookup"] = lookup(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
