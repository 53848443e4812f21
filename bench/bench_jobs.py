"""Benchmark: the job queue against the reference teacher on the tiny model.

Starts the reference teacher (``kiln reference-teacher``, tiny Llama, K <= 8,
64 tokens) and a registry (``kiln serve``) as child processes on loopback,
registers the teacher, writes a corpus of 2,000 sequences (8..48 tokens,
seeded), then in the same run measures:

* the teacher's own capacity: the job's exact requests (each sequence plus
  its causal final-row probe token, ``prompt_logprobs = K``) sent directly
  with httpx at ``[jobs] concurrency`` in flight, bodies read in full; run
  before and after the cold job, the faster run is the baseline;
* the cold job: submit -> succeeded, from the server's own ``created_at`` and
  ``finished_at`` (probes, scoring, verification, cache writes and the
  published corpus included);
* the cached re-run of the same corpus (every sequence a cache hit).

Targets: cached >= 50x faster than cold; cold throughput >= 0.9x the
teacher's capacity.  Prints one JSON document.

    .venv/bin/python bench/bench_jobs.py [--sequences 2000] [--concurrency 4] [--k 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

KILN = [sys.executable, "-m", "kiln_registry.cli.main"]
MODEL_ID = "tiny-ref"


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen([*KILN, *args], stdout=subprocess.PIPE, stderr=sink)


def teacher(model: Path, tmp: Path, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    proc = start(
        [
            "reference-teacher",
            "--model-path",
            str(model),
            "--served-model-id",
            MODEL_ID,
            "--max-top-k",
            "8",
            "--max-model-len",
            "64",
            "--port",
            "0",
            "--threads",
            str(threads),
        ],
        tmp / "teacher.log",
    )
    assert proc.stdout is not None
    line = json.loads(proc.stdout.readline())
    return proc, str(line["url"])


def registry(config: Path, tmp: Path, url: str) -> subprocess.Popen[bytes]:
    proc = start(["serve", "--config", str(config)], tmp / "serve.log")
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit((tmp / "serve.log").read_text())
        time.sleep(0.1)


def corpus(path: Path, count: int) -> list[list[int]]:
    rng = random.Random(8)
    seqs = [[rng.randrange(512) for _ in range(rng.randint(8, 48))] for _ in range(count)]
    with path.open("w", encoding="utf-8") as out:
        for i, seq in enumerate(seqs):
            out.write(json.dumps({"id": f"s{i}", "token_ids": seq}) + "\n")
    return seqs


async def direct(url: str, seqs: list[list[int]], k: int, concurrency: int) -> float:
    """Seconds for the job's exact requests sent straight to the teacher."""
    gate = asyncio.Semaphore(concurrency)

    async def one(http: httpx.AsyncClient, seq: list[int]) -> None:
        body = {
            "model": MODEL_ID,
            "prompt": [*seq, seq[-1]],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": k,
            "n": 1,
            "stream": False,
            "add_special_tokens": False,
        }
        async with gate:
            response = await http.post(url + "/v1/completions", json=body)
            assert response.status_code == 200 and response.content

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    async with httpx.AsyncClient(timeout=60, trust_env=False, limits=limits) as http:
        start_s = time.perf_counter()
        await asyncio.gather(*(one(http, s) for s in seqs))
        return time.perf_counter() - start_s


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a child process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(pids: dict[str, int], work: Any) -> tuple[Any, dict[str, float]]:
    """Run ``work()``; return its value and the CPU seconds each process spent meanwhile."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    value = work()
    return value, {name: round(cpu_seconds(pid) - before[name], 2) for name, pid in pids.items()}


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def run_job(url: str, k: int) -> dict[str, Any]:
    body = {
        "kind": "teacher_scoring",
        "teacher": "ref",
        "top_k": k,
        "corpus": {"path": "bench.jsonl"},
    }
    # One client for the whole poll: a new client per poll costs CPU the job needs.
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as http:
        job = http.post("/v1/jobs", json=body).json()
        while job["status"] not in ("succeeded", "failed", "cancelled"):
            time.sleep(0.2)  # timing comes from the server's own timestamps
            job = http.get(f"/v1/jobs/{job['id']}").json()
    assert job["status"] == "succeeded", job
    stamps = job["timestamps"]
    job["seconds"] = _stamp(stamps["finished_at"]) - _stamp(stamps["created_at"])
    return dict(job)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--teacher-threads", type=int, default=1)
    args = parser.parse_args()
    from kiln_registry.testing.tiny_models import build_tiny_llama

    with tempfile.TemporaryDirectory() as raw:
        tmp = Path(raw)
        model = build_tiny_llama(tmp / "model").path
        (tmp / "corpora").mkdir()
        seqs = corpus(tmp / "corpora" / "bench.jsonl", args.sequences)
        port = 18000 + os.getpid() % 1000
        config = tmp / "kiln.toml"
        config.write_text(
            f'[server]\nport = {port}\ndatabase = "{tmp / "registry.db"}"\n'
            f'[student]\nmodel_path = "{model}"\n'
            f'[jobs]\nconcurrency = {args.concurrency}\ncorpus_root = "{tmp / "corpora"}"\n',
            encoding="utf-8",
        )
        t_proc, t_url = teacher(model, tmp, args.teacher_threads)
        url = f"http://127.0.0.1:{port}"
        r_proc = registry(config, tmp, url)
        try:
            reg = {
                "alias": "ref",
                "kind": "remote",
                "provider": "vllm",
                "model_id": MODEL_ID,
                "url": t_url,
            }
            assert httpx.post(url + "/v1/teachers", json=reg, timeout=60).status_code == 200
            pids = {"teacher": t_proc.pid, "registry": r_proc.pid, "bench": os.getpid()}
            asyncio.run(direct(t_url, seqs[:200], args.k, args.concurrency))  # warm-up

            def send() -> float:
                return asyncio.run(direct(t_url, seqs, args.k, args.concurrency))

            direct_1, cpu_direct = measured(pids, send)
            cold, cpu_cold = measured(pids, lambda: run_job(url, args.k))
            direct_2, _ = measured(pids, send)
            cached = run_job(url, args.k)
        finally:
            for proc in (r_proc, t_proc):
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
    baseline = min(direct_1, direct_2)
    n = args.sequences
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "sequences": n,
        "k": args.k,
        "concurrency": args.concurrency,
        "teacher_direct_seconds": [round(direct_1, 3), round(direct_2, 3)],
        "teacher_capacity_seq_per_s": round(n / baseline, 1),
        "cold_job_seconds": round(cold["seconds"], 3),
        "cold_job_seq_per_s": round(n / cold["seconds"], 1),
        "cold_vs_capacity": round(baseline / cold["seconds"], 3),
        "cached_job_seconds": round(cached["seconds"], 3),
        "cached_speedup": round(cold["seconds"] / cached["seconds"], 1),
        "cold_progress": cold["progress"],
        "cached_progress": cached["progress"],
        "result_bytes": cold["result"]["bytes"],
        "cpu_seconds_direct": cpu_direct,
        "cpu_seconds_cold_job": cpu_cold,
        "load_average": os.getloadavg(),
        "targets": {"cached_speedup": ">= 50", "cold_vs_capacity": ">= 0.9"},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
