"""Benchmark: ``kiln identity`` hashing versus one single-threaded SHA-256 pass.

Builds a model of random-byte safetensors shards (default 2 GiB in 4 shards)
plus a real tiny config.json and tokenizer.json in a temporary directory,
warms the page cache, then alternates, in the same run:

* baseline: one single-threaded ``hashlib.sha256`` pass (OpenSSL) over the
  same files, 1 MiB reads;
* kiln: ``inspect_model`` (tokenizers view) in a fresh child process, which
  reports its own elapsed time and peak RSS.

On a shared machine other processes steal CPU from either arm, so the
minimum of the repeats is reported beside the median.

The fresh shards are written back (``os.sync``) before any round, so that
dirty-page writeback does not compete with the measured arms.  The page
cache must stay warm: this machine's kernel runs DAMON proactive reclaim
(``pageout`` of file pages idle for about a minute), so each arm's
system-wide ``workingset_refault_file`` count (pages read back after
eviction) is reported; a large count means the arms read from disk.  Each
round also reports ``two_thread_sha256_scaling``: two in-memory SHA-256
passes on two threads against one after the other (no I/O, no kiln code).
It is the ceiling of the kiln arm's speedup on this machine at that moment
(2.0 on two idle cores; less when other processes or the host take a core).  The
kiln arm is repeated on a model with 1/8 of the shard size to show that peak
memory does not grow with shard size.  Prints one JSON document.

    .venv/bin/python bench/bench_identity.py [--mib 2048] [--shards 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CHUNK = 1024 * 1024

CHILD = r"""
import json, resource, sys, time
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.model.inspect import inspect_model
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
result = inspect_model(sys.argv[1], limiter=ReadRateLimiter(None),
                       workers=None if sys.argv[2] == "auto" else int(sys.argv[2]),
                       use_transformers=False)
elapsed = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": elapsed, "rss_before_kib": before, "peak_rss_kib": peak,
                  "base_model_sha256": result.base_model_sha256,
                  "bytes_hashed": result.bytes_hashed}))
"""


def write_model(root: Path, shards: int, shard_mib: int) -> int:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    root.mkdir(parents=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"], show_progress=False)
    tok.train_from_iterator(["the teacher speaks and the student listens"] * 4, trainer=trainer)
    tok.save(str(root / "tokenizer.json"))
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 512}))
    total = 0
    for i in range(shards):
        with open(root / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", "wb") as out:
            for _ in range(shard_mib // 64):
                out.write(os.urandom(64 * CHUNK))
        total += shard_mib * CHUNK
    return total


def refaults() -> int:
    """Pages read back after eviction, system-wide (0 where /proc/vmstat lacks it)."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("workingset_refault_file "):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def thread_scaling(mib: int = 256) -> float:
    """How much faster 2 threads hash 2 in-memory buffers than 1 thread (no I/O; ceiling ~2)."""
    data = os.urandom(mib * CHUNK)

    def one() -> None:
        hashlib.sha256(data).digest()

    start = time.perf_counter()
    one()
    one()
    serial = time.perf_counter() - start
    threads = [threading.Thread(target=one) for _ in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return serial / (time.perf_counter() - start)


def baseline_seconds(root: Path) -> float:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    start = time.perf_counter()
    for path in sorted(root.iterdir()):
        digest = hashlib.sha256()
        with open(path, "rb", buffering=0) as stream:
            while n := stream.readinto(buffer):
                digest.update(view[:n])
    return time.perf_counter() - start


def kiln_child(root: Path, workers: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), workers],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def cli_seconds(root: Path) -> float:
    kiln = Path(sys.executable).parent / "kiln"
    start = time.perf_counter()
    subprocess.run(
        [str(kiln), "identity", str(root), "--tokenizer-view", "tokenizers"],
        capture_output=True,
        timeout=600,
        check=True,
    )
    return time.perf_counter() - start


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measure(root: Path, repeat: int, workers: str) -> dict[str, object]:
    baseline_seconds(root)  # warm the page cache so both arms read from memory
    base, kiln, runs, faults, scaling = [], [], [], [], []
    for _ in range(repeat):
        scaling.append(round(thread_scaling(), 3))
        before = refaults()
        base.append(baseline_seconds(root))
        middle = refaults()
        run = kiln_child(root, workers)
        faults.append((middle - before, refaults() - middle))
        runs.append(run)
        kiln.append(run["seconds"])
    b, k = statistics.median(base), statistics.median(kiln)
    return {
        "baseline_seconds_median": round(b, 3),
        "kiln_seconds_median": round(k, 3),
        "speedup_median": round(b / k, 2),
        "baseline_seconds_min": round(min(base), 3),
        "kiln_seconds_min": round(min(kiln), 3),
        "speedup_min": round(min(base) / min(kiln), 2),
        "kiln_peak_rss_mib": round(max(r["peak_rss_kib"] for r in runs) / 1024, 1),
        "kiln_rss_after_imports_mib": round(max(r["rss_before_kib"] for r in runs) / 1024, 1),
        "bytes_hashed": runs[0]["bytes_hashed"],
        "baseline_s": [round(x, 4) for x in base],
        "kiln_s": [round(x, 4) for x in kiln],
        "refaults_baseline_kiln": faults,
        "two_thread_sha256_scaling": scaling,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=2048, help="total shard MiB (multiple of 64)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", default="auto")
    parser.add_argument("--dir", default=None, help="parent for the temporary model")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kiln-bench-identity-", dir=args.dir))
    try:
        shard_mib = args.mib // args.shards
        write_model(work / "big", args.shards, shard_mib)
        write_model(work / "small", args.shards, max(64, shard_mib // 8))
        os.sync()  # no writeback of the fresh shards during the measured rounds
        big = measure(work / "big", args.repeat, args.workers)
        small = measure(work / "small", args.repeat, args.workers)
        report = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {
                "nproc": os.cpu_count(),
                "cpu": cpu_model(),
                "python": sys.version.split()[0],
            },
            "model": {"total_mib": args.mib, "shards": args.shards, "shard_mib": shard_mib},
            "full": big,
            "small_shards": {"shard_mib": max(64, shard_mib // 8), **small},
            "cli_end_to_end_seconds": round(cli_seconds(work / "big"), 3),
        }
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
