"""Profile one cold scoring job in the registry process (cProfile in every thread).

Not a benchmark (``run_all.py`` does not run it): a tool for finding where the
registry's CPU per scored sequence goes.  Starts the reference teacher as
``bench_jobs.py`` does and a registry child whose every thread (the event
loop and the ``asyncio.to_thread`` workers) runs under its own cProfile
timed by that thread's CPU clock (``time.thread_time``), so waits for the GIL,
the disk or the teacher do not count; runs
one cold job over a seeded corpus, stops the registry and prints the merged
profile's top functions (and writes it to ``--out`` for ``pstats``).  cProfile
inflates cheap, call-heavy code; steer by ``bench_jobs.py``'s CPU figure.

    .venv/bin/python bench/profile_jobs.py [--sequences 2000] [--sort tottime] [--top 40]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _harness import KILN, register, registry, registry_config, stop, teacher
from _harness import run_job as run_harness_job
from bench_jobs import MODEL_ID, corpus, cpu_seconds

_PROFILES: list[cProfile.Profile] = []


def _profiled_child(out: str, argv: list[str]) -> None:
    """The registry with a profiler per thread; the merged stats go to ``out`` at exit."""
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)
        _PROFILES.append(profile)
        profile.enable()
        try:
            original_run(self)
        finally:
            profile.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    from kiln_registry.cli.main import run as kiln
    from kiln_registry.serve import startup

    original_resend = startup.ExitSignals.resend

    def resend(self: Any) -> None:
        main.disable()
        stats = pstats.Stats(main)
        for profile in _PROFILES:
            profile.disable()  # no-op unless the thread still runs
            if getattr(profile, "stats", None) is None:
                profile.create_stats()
            stats.add(profile)
        stats.dump_stats(out)
        original_resend(self)

    startup.ExitSignals.resend = resend  # type: ignore[method-assign]
    main = cProfile.Profile(time.thread_time)
    main.enable()
    kiln(argv)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _profiled_child(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", default="jobs.prof")
    args = parser.parse_args()
    from kiln_registry.testing.tiny_models import build_tiny_llama

    out = str(Path(args.out).resolve())
    with tempfile.TemporaryDirectory() as raw:
        tmp = Path(raw)
        model = build_tiny_llama(tmp / "model").path
        (tmp / "corpora").mkdir()
        seqs = corpus(tmp / "corpora" / "cold.jsonl", args.sequences, seed=8)
        port = 19000 + os.getpid() % 1000
        config = registry_config(tmp, port, model, 4)
        t_proc, t_url = teacher(model, tmp, 1, MODEL_ID)
        url = f"http://127.0.0.1:{port}"
        KILN[:] = [sys.executable, str(Path(__file__).resolve()), "--child", out]
        r_proc = registry(config, tmp, url)
        try:
            register(url, MODEL_ID, t_url)
            before = cpu_seconds(r_proc.pid)
            body = {"kind": "teacher_scoring", "teacher": "ref", "top_k": args.k,
                    "corpus": {"path": "cold.jsonl"}}  # fmt: skip
            job = run_harness_job(url, body)
            spent = cpu_seconds(r_proc.pid) - before
        finally:
            stop(r_proc, t_proc)
    tokens = sum(len(s) for s in seqs)
    print(f"cold job {job['seconds']:.1f} s; registry CPU {spent:.2f} s (profiled) for "
          f"{tokens} tokens: {1e6 * spent / tokens:.1f} ms per 1,000 tokens")  # fmt: skip
    pstats.Stats(out).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
