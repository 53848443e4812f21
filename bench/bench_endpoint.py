"""Benchmark: TRL-shaped scoring through ``kiln teacher-endpoint`` vs the teacher directly.

The stand-in teacher (its own process: an asyncio HTTP/1.1 server on loopback) answers
every request with the body the reference teacher gave to it once, after a fixed
``--service-ms`` for scoring requests (the identity probes are answered at once).  The
answers are real: they are computed at start by the reference teacher on the tiny model
(``max_top_k`` 20, ``max_model_len`` 512, the model's limit), so the registry and the
endpoint prove the stand-in's identity exactly as they would a vLLM's.  The registry is
``kiln serve``; the endpoint is ``kiln teacher-endpoint`` as a user runs it.

Each request is TRL's ``get_sequence_logprobs`` shape: a batch of 8 token-id sequences
of 511 tokens (512 with the one generated token: the tiny model's context),
``prompt_logprobs`` 20, ``max_tokens`` 1, ``temperature`` 1.0.  ``--concurrency`` clients
(keep-alive) send ``--requests`` requests per arm and round to

* ``direct``: the stand-in teacher;
* ``endpoint``: the endpoint, which checks every answer (fingerprint, choices, every
  row) before relaying it;

in ABBA order.  Reported per round: requests per second of each arm and their ratio
(target >= 0.95), the median latency of each arm and the added median latency, the
endpoint process's CPU time (user + system, from ``/proc``) per 1,000 scored tokens, and
the stand-in's CPU per request in each arm (a few ms: it only sleeps and writes canned
bytes, so it is not what bounds either arm).  The endpoint sends each prompt of the batch
as its own request (``endpoint.batch``); the stand-in answers those too.
Run: ``.venv/bin/python bench/bench_endpoint.py [--rounds N] [--service-ms MS]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _harness import KILN, machine, register, registry, registry_config, stop

SERVED = "teacher-tiny"
BATCH, LENGTH, TOP_K = 8, 511, 20

STAND_IN = r"""
import asyncio, json, sys
answers = {k: (v[0], bytes.fromhex(v[1])) for k, v in json.load(open(sys.argv[1])).items()}
service = float(sys.argv[2]) / 1000.0
def key(body):
    return json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"))
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            status, answer = answers.get(key(body), (404, b'{"error":"unknown request"}'))
            if len(body) > 1000:
                await asyncio.sleep(service)
            writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % (status, len(answer)) + answer)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=1 << 24)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def bench_body() -> dict[str, Any]:
    prompts = [[(7 * i + 13 * j) % 500 + 1 for j in range(LENGTH)] for i in range(BATCH)]
    return {"model": SERVED, "prompt": prompts, "max_tokens": 1, "temperature": 1.0,
            "prompt_logprobs": TOP_K}  # fmt: skip


def canned_answers(tmp: Path) -> tuple[Path, Path]:
    """The tiny model, and the reference teacher's answers to the probes and the bench body."""
    from kiln_registry.probe.client import PROBE_PROMPT, completion_request
    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher
    from kiln_registry.testing.tiny_models import build_tiny_llama

    model = build_tiny_llama(tmp / "model").path
    teacher, _ = load_reference_teacher(
        model, served_model_id=SERVED, max_top_k=TOP_K, max_model_len=LENGTH + 1
    )
    bodies = [completion_request(SERVED, PROBE_PROMPT, k) for k in (1, TOP_K, TOP_K + 1)]
    bodies.append(bench_body())
    # The endpoint sends each prompt of a batch as its own request (endpoint.batch).
    bodies += [{**bench_body(), "prompt": prompt} for prompt in bench_body()["prompt"]]

    async def ask() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=create_reference_app(teacher, api_key_env=None))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            answers = {}
            for body in bodies:
                got = await http.post("/v1/completions", json=body, timeout=600)
                key = json.dumps(body, sort_keys=True, separators=(",", ":"))
                answers[key] = (got.status_code, got.content.hex())
            return answers

    path = tmp / "answers.json"
    path.write_text(json.dumps(asyncio.run(ask())), encoding="utf-8")
    return model, path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def arm(url: str, body: bytes, requests: int, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    queue = list(range(requests))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:

        async def worker() -> None:
            while queue:
                queue.pop()
                started = time.perf_counter()
                got = await http.post("/v1/completions", content=body,
                                      headers={"content-type": "application/json"})  # fmt: skip
                assert got.status_code == 200, got.text[:300]
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {"rps": requests / seconds, "median_ms": statistics.median(latencies) * 1000}


def endpoint_process(url: str, tmp: Path) -> tuple[subprocess.Popen[str], str]:
    argv = [*KILN, "teacher-endpoint", "ref", "--server", url, "--listen", "127.0.0.1:0",
            "--log-level", "warning"]  # fmt: skip
    with (tmp / "endpoint.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("base_url: "):
            return proc, line.split(": ", 1)[1].strip()
    raise SystemExit((tmp / "endpoint.log").read_text())


def rounds(
    args: argparse.Namespace, direct: str, endpoint: str, pid: int, stand_in: int
) -> list[dict[str, Any]]:
    body = json.dumps(bench_body(), separators=(",", ":")).encode()
    asyncio.run(arm(endpoint, body, 2, 1))  # warm both paths once
    asyncio.run(arm(direct, body, 2, 1))
    out = []
    for index in range(args.rounds):
        order = ("direct", "endpoint") if index % 2 == 0 else ("endpoint", "direct")
        result: dict[str, Any] = {}
        for name in order:
            before, stand_in_before = cpu_seconds(pid), cpu_seconds(stand_in)
            url = direct if name == "direct" else endpoint
            result[name] = asyncio.run(arm(url, body, args.requests, args.concurrency))
            # The stand-in's CPU per request, the same for both arms: it must not be the bound.
            stand_in_s = (cpu_seconds(stand_in) - stand_in_before) / args.requests
            result[name]["stand_in_cpu_ms_per_request"] = stand_in_s * 1e3
            if name == "endpoint":
                tokens = args.requests * BATCH * LENGTH
                result["endpoint_cpu_s_per_1k_tokens"] = (cpu_seconds(pid) - before) / tokens * 1e3
        result["ratio"] = result["endpoint"]["rps"] / result["direct"]["rps"]
        result["added_median_ms"] = result["endpoint"]["median_ms"] - result["direct"]["median_ms"]
        out.append(result)
        print(json.dumps(result), file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--service-ms", type=float, default=500.0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-endpoint-") as name:
        tmp = Path(name)
        model, answers = canned_answers(tmp)
        stand_in = subprocess.Popen(
            [sys.executable, "-c", STAND_IN, str(answers), str(args.service_ms)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert stand_in.stdout is not None
        direct = f"http://127.0.0.1:{stand_in.stdout.readline().strip()}"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        reg = registry(registry_config(tmp, port, model, 1), tmp, url)
        try:
            register(url, SERVED, direct)
            endpoint, base = endpoint_process(url, tmp)
            try:
                measured = rounds(args, direct, base, endpoint.pid, stand_in.pid)
            finally:
                endpoint.terminate()
                endpoint.wait(30)
        finally:
            stop(reg)
            stand_in.terminate()
            stand_in.wait(30)
    report = {
        "benchmark": "endpoint",
        "shape": {"batch": BATCH, "tokens": LENGTH, "prompt_logprobs": TOP_K},
        "service_ms": args.service_ms,
        "concurrency": args.concurrency,
        "rounds": measured,
        "median_ratio": statistics.median(r["ratio"] for r in measured),
        "median_added_ms": statistics.median(r["added_median_ms"] for r in measured),
        "median_cpu_s_per_1k_tokens": statistics.median(
            r["endpoint_cpu_s_per_1k_tokens"] for r in measured
        ),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "machine": machine(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
