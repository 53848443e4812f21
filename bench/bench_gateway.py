"""Benchmark: scoring throughput through the teacher gateway vs vLLM's socket directly.

A fixed-latency upstream (its own process: an asyncio HTTP/1.1 server on a
Unix socket that answers every request after ``--latency-ms`` with the
captured 64-token, top-32 vLLM body, about 140 KB) stands in for vLLM, which
on 2 CPU cores is far too slow to show the gateway's cost.  The gateway runs
as its own process exactly as the launcher starts it
(``python -m kiln_registry.gateway``, with a key to check).  The same
client (keep-alive connections, one per worker, ``--concurrency`` workers,
the same scoring request with its ``Authorization: Bearer`` key) sends
``--requests`` requests per arm and round to each of

* ``direct``: the upstream's Unix socket;
* ``gateway``: the gateway's TCP port, which forwards to that socket;

in halves, in ABBA order (which arm goes first alternates between rounds),
so a background load that drifts during a round weighs on both arms alike.

Reported: requests per second per round, the per-round ratio
gateway/direct, and their median; the gateway process's CPU time per request
(user and system, from ``/proc``, Linux only) in each gateway arm; the load
average before and after.  Target (issue 20): median >= 0.95.
Run: ``.venv/bin/python bench/bench_gateway.py [--rounds N] [--concurrency C]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BODY_FILE = ROOT / "tests" / "data" / "vllm_responses" / "fp32_pl32_64tok.json"
SERVED = "teacher-tiny"
# The gateway checks a key, as a deployment with --api-key-env does; both arms send it
# (the upstream ignores it), so the requests are the same bytes.
KEY_VARIABLE = "KILN_BENCH_GATEWAY_KEY"
BENCH_KEY = "bench-gateway-key-0123456789abcdef"

UPSTREAM = r"""
import asyncio, sys
path, latency, body_file = sys.argv[1], float(sys.argv[2]), sys.argv[3]
body = open(body_file, "rb").read()
head = (b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
async def handle(reader, writer):
    try:
        while True:
            raw = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in raw.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            await asyncio.sleep(latency)
            writer.write(head + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_unix_server(handle, path)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


def scoring_request(host: bytes) -> bytes:
    body = json.dumps(
        {
            "model": SERVED,
            "prompt": [(7 * i) % 512 for i in range(64)],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 32,
            "n": 1,
            "stream": False,
            "add_special_tokens": False,
        }
    ).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
        b"accept: application/json\r\naccept-encoding: identity\r\nauthorization: Bearer %s\r\n"
        b"content-length: %d\r\n\r\n"
    ) % (host, BENCH_KEY.encode(), len(body))
    return head + body


async def open_connection(target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if target.startswith("/"):
        return await asyncio.open_unix_connection(target, limit=1 << 20)
    host, port = target.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port), limit=1 << 20)


async def worker(target: str, request: bytes, count: int) -> None:
    reader, writer = await open_connection(target)
    try:
        for _ in range(count):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200 "):
                raise RuntimeError(f"unexpected answer {head[:40]!r}")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
    finally:
        writer.close()


async def one_round(target: str, requests: int, concurrency: int) -> tuple[int, float]:
    """Send ``requests`` (rounded down to a multiple of ``concurrency``): (sent, seconds)."""
    request = scoring_request(b"localhost")
    per_worker = requests // concurrency
    start = time.perf_counter()
    await asyncio.gather(*(worker(target, request, per_worker) for _ in range(concurrency)))
    return per_worker * concurrency, time.perf_counter() - start


def process_cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` so far ((0, 0) where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def wait_for(check: object, what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


def start_processes(tmp: Path, latency_ms: float) -> tuple[list[subprocess.Popen[bytes]], str, str]:
    sock = str(tmp / "vllm.sock")
    upstream = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM, sock, str(latency_ms / 1000), str(BODY_FILE)]
    )
    wait_for(lambda: os.path.exists(sock), "the upstream")
    port = 19000 + os.getpid() % 1000
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kiln_registry.gateway",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--upstream-uds={sock}",
            f"--served-model-id={SERVED}",
            "--max-model-len=256",
            "--max-top-k=32",
            f"--api-key-env={KEY_VARIABLE}",
        ],
        env={**os.environ, KEY_VARIABLE: BENCH_KEY},
        stderr=subprocess.PIPE,
    )
    stderr = gateway.stderr
    assert stderr is not None
    wait_for(lambda: stderr.readline().startswith(b"kiln-gateway:"), "the gateway")
    # Anything the gateway says later (it logs no requests) is shown, never left to fill a pipe.
    threading.Thread(
        target=shutil.copyfileobj, args=(stderr, sys.stderr.buffer), daemon=True
    ).start()
    return [gateway, upstream], sock, f"127.0.0.1:{port}"


def run_rounds(
    args: argparse.Namespace, sock: str, gateway: str, gateway_pid: int
) -> list[dict[str, Any]]:
    """Warm both paths, then ``--rounds`` paired rounds.

    A round runs each arm twice on half the requests in ABBA order (the first arm
    alternating between rounds), so a load that drifts during the round weighs on both
    arms alike; an arm's rate is its requests over its seconds."""
    for target in (sock, gateway):
        asyncio.run(one_round(target, args.concurrency * 4, args.concurrency))
    targets = {"direct": sock, "gateway": gateway}
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        first, second = ("direct", "gateway") if index % 2 == 0 else ("gateway", "direct")
        sent = {"direct": 0, "gateway": 0}
        seconds = {"direct": 0.0, "gateway": 0.0}
        cpu = [0.0, 0.0]
        for name in (first, second, second, first):
            start_cpu = process_cpu(gateway_pid)
            arm = one_round(targets[name], args.requests // 2, args.concurrency)
            count, elapsed = asyncio.run(arm)
            sent[name] += count
            seconds[name] += elapsed
            if name == "gateway":
                end_cpu = process_cpu(gateway_pid)
                cpu = [c + b - a for c, a, b in zip(cpu, start_cpu, end_cpu, strict=True)]
        rates = {name: sent[name] / seconds[name] for name in sent}
        result: dict[str, Any] = {k: round(v, 3) for k, v in rates.items()}
        result["ratio"] = round(rates["gateway"] / rates["direct"], 3)
        result["gateway_cpu_ms"] = [round(c / sent["gateway"] * 1000, 4) for c in cpu]
        rounds.append(result)
        print(json.dumps(result), file=sys.stderr)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kgwb-") as raw:
        processes, sock, gateway = start_processes(Path(raw), args.latency_ms)
        try:
            rounds = run_rounds(args, sock, gateway, processes[0].pid)
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
                process.wait(30)
    ratios = [r["ratio"] for r in rounds]
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "latency_ms": args.latency_ms,
        "concurrency": args.concurrency,
        "requests_per_round": args.requests,
        "response_bytes": BODY_FILE.stat().st_size,
        "rounds": rounds,
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": min(ratios),
        "gateway_cpu_ms_per_request_median": {
            "user": statistics.median(r["gateway_cpu_ms"][0] for r in rounds),
            "system": statistics.median(r["gateway_cpu_ms"][1] for r in rounds),
        },
        "load_average_before": load_before,
        "load_average": os.getloadavg(),
        "target": {"ratio_median": ">= 0.95"},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
