"""Benchmark: runtime-content hashing versus a single-threaded read-and-hash.

The runtime-content digest (identity-spec.md section 8) of this interpreter
with torch, transformers and tokenizers, as ``kiln_registry.launcher.runtime``
computes it (bounded inventory, every resolved file hashed once in parallel,
inventory taken again and compared, digest), against one single-threaded
``hashlib.sha256`` pass with 1 MiB reads over exactly the same files.  A
third arm times the hashing stage alone (``hash_files`` over the same files,
the launcher's worker count) to separate it from the two inventories.  All
arms run in this process with the page cache warm (an untimed pass first),
in turn, ``--repeat`` times each.  Target (issue 5): the digest at least 1.6x
faster than the baseline.  Prints one JSON document.

    .venv/bin/python bench/bench_runtime.py [--repeat 5] [--workers N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

from kiln_registry.identity.hashing import ReadRateLimiter, hash_files
from kiln_registry.launcher import runtime

PACKAGES = ("torch", "transformers", "tokenizers")
CHUNK = 1024 * 1024


def same_files() -> list[str]:
    """The resolved files the digest hashes (the launcher's own inventory, taken once)."""
    return sorted(runtime._collect(sys.executable, PACKAGES).sizes)


def hash_pass(paths: list[str]) -> int:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    total = 0
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb", buffering=0) as handle:
            while got := handle.readinto(view):
                digest.update(view[:got])
                total += got
    return total


def kiln_pass(workers: int | None) -> runtime.RuntimeContent:
    return runtime.runtime_content(
        limiter=ReadRateLimiter(None), workers=workers, packages=PACKAGES
    )


def stage_pass(paths: list[str], workers: int | None) -> None:
    hash_files(paths, limiter=ReadRateLimiter(None), workers=workers)


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    paths = same_files()
    total = hash_pass(paths)  # warm the page cache
    content = kiln_pass(args.workers)
    baseline: list[float] = []
    kiln: list[float] = []
    stage: list[float] = []
    for _ in range(args.repeat):
        baseline.append(timed(lambda: hash_pass(paths)))
        kiln.append(timed(lambda: kiln_pass(args.workers)))
        stage.append(timed(lambda: stage_pass(paths, args.workers)))
    med_b, med_k, med_s = (statistics.median(x) for x in (baseline, kiln, stage))
    result = {
        "packages": list(PACKAGES),
        "versions": content.versions,
        "files": content.files,
        "unique_files": len(paths),
        "directories": content.directories,
        "bytes": total,
        "workers": args.workers or os.cpu_count(),
        "machine": {
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        },
        "baseline_s": [round(x, 3) for x in baseline],
        "kiln_s": [round(x, 3) for x in kiln],
        "speedup_median": round(med_b / med_k, 3),
        "speedup_best": round(min(baseline) / min(kiln), 3),
        "hashing_stage_s": [round(x, 3) for x in stage],
        "hashing_stage_speedup_median": round(med_b / med_s, 3),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
