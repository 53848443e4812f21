"""Benchmark: validating a 1,000,000-candidate max-K prompt-logprobs body.

Builds a vLLM-shaped body (K=32, 30,303 positions, every row K+1 wide,
realistic 16-17 digit float32 reprs, about 71 MB), then in the same run
times ``orjson.loads`` of the bytes (the baseline) against the full
validation the probe client runs: ``parse_completion_fast`` (the numpy fast
path, ``probe/candidate_scan.py``) + ``verify_completion``.  Rounds are paired
(baseline, then validation, ``--repeat`` times); both wall-clock and process
CPU time are reported (best of the rounds, and the median of the per-round
CPU ratios); the CPU ratio is the one to quote on a shared machine.  Peak
memory is traced (tracemalloc, which numpy reports to) in a separate pass,
and an oversized body is refused before any parsing.  ``--phases`` times each
phase of the validation (CPU, best round); ``--strict`` also times the strict
parser; ``--json`` ends the output with a JSON report (per-round CPU seconds,
peak, phases) for ``bench/run_all.py``.

Targets (issues 3 and 21): validation <= 0.5x orjson; peak <= body + 64 MB.
Run: ``.venv/bin/python bench/bench_probe.py [--repeat N] [--phases] [--strict] [--json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable

import orjson

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe import candidate_scan, verify
from kiln_registry.probe.candidate_scan import (
    FastPathDeferred,
    parse_completion_fast,
    scan_completion,
)
from kiln_registry.probe.parse import parse_completion, response_body_limit
from kiln_registry.probe.verify import verify_completion

K = 32
Rounds = list[tuple[float, float, float, float]]
POSITIONS = 30_304  # 30,303 rows of K+1 = 1,000,000 - 1 candidates
VOCAB = 151_936


def bench_identity() -> TeacherIdentity:
    return TeacherIdentity(
        served_model_id="teacher-large",
        base_model_sha256="a" * 64,
        tokenizer_vocab_sha256="b" * 64,
        tokenizer_config_sha256="c" * 64,
        adapter=None,
        vocab_size=VOCAB,
        max_top_k=K,
        max_model_len=32_768,
        max_prompt_logprob_candidates=1_000_000,
        implementation="vllm:0.32.0",
        inference_config_sha256="f" * 64,
    )


def build_body(identity: TeacherIdentity) -> tuple[bytes, list[int]]:
    prompt = [(7919 * i) % 100_000 + 1000 for i in range(POSITIONS)]
    # float32-exact values with vLLM-like 17-digit reprs; row mass stays < 1
    top = [array("f", [-4.001 - 0.0625 * r])[0] for r in range(K)]
    actual = array("f", [-12.3456])[0]
    parts = ['{"id":"cmpl-bench","object":"text_completion","created":1795957691,']
    parts.append('"model":"teacher-large","choices":[{"index":0,"text":"","logprobs":null,')
    parts.append('"finish_reason":"length","stop_reason":null,"token_ids":null,')
    parts.append('"prompt_logprobs":[null')
    for pos in range(1, POSITIONS):
        rank = 4000 + pos % 97
        cells = [f'"{prompt[pos]}":{{"logprob":{actual!r},"rank":{rank},"decoded_token":"xyz"}}']
        cells += [
            f'"{r + 1 + pos % 5}":{{"logprob":{top[r]!r},"rank":{r + 1},"decoded_token":" token"}}'
            for r in range(K)
        ]
        parts.append(",{" + ",".join(cells) + "}")
    parts.append('],"prompt_token_ids":null}],"service_tier":null,')
    parts.append(json.dumps({"system_fingerprint": identity.fingerprint()})[1:-1])
    parts.append(f',"usage":{{"prompt_tokens":{POSITIONS},"total_tokens":{POSITIONS + 1}}}}}')
    return "".join(parts).encode(), prompt


def validate(body: bytes, prompt: list[int], identity: TeacherIdentity, *, strict: bool) -> int:
    parse = parse_completion if strict else parse_completion_fast
    parsed = parse(
        body,
        expected_prompt_len=len(prompt),
        k=K,
        vocab_size=identity.vocab_size,
        max_candidates=identity.max_prompt_logprob_candidates,
    )
    check = verify_completion(
        parsed,
        request_model="teacher-large",
        prompt=prompt,
        k=K,
        identity=identity,
        pinned=identity,
        student=None,
    )
    return check.candidate_count


def paired_rounds(repeat: int, base: Callable[[], object], fn: Callable[[], object]) -> Rounds:
    """Per round: (baseline wall, baseline CPU, validation wall, validation CPU) seconds."""
    rounds: Rounds = []
    for _ in range(repeat):
        times: list[float] = []
        for call in (base, fn):
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            times += [time.perf_counter() - wall, time.process_time() - cpu]
        rounds.append((times[0], times[1], times[2], times[3]))
    return rounds


PHASES: tuple[tuple[object, str, str], ...] = (
    (candidate_scan, "_quotes", "scan: unescaped quote positions"),
    (candidate_scan, "_gaps", "scan: candidate and row links"),
    (candidate_scan, "_windows", "scan: fixed template windows"),
    (candidate_scan, "_check_text", "scan: strings, escapes, UTF-8"),
    (candidate_scan, "small_ints", "scan: token ids and ranks"),
    (candidate_scan, "exact_logprobs", "scan: logprobs (exact)"),
    (candidate_scan, "_scan_chunk", "scan: all chunks"),
    (candidate_scan, "_columns", "scan: row offsets, widths, duplicates"),
    (candidate_scan, "strict_loads", "scan: envelope (strict JSON)"),
    (sys.modules[__name__], "parse_completion_fast", "parse total"),
    (verify, "verify_rows", "verify: rows"),
    (sys.modules[__name__], "verify_completion", "verify total"),
)


def phase_times(repeat: int, fn: Callable[[], object]) -> dict[str, float]:
    """CPU seconds per phase in the fastest of ``repeat`` validations (functions wrapped)."""
    spent: dict[str, float] = {}
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in PHASES]

    def timed(inner: Callable[..., object], label: str) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            start = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - start

        return call

    best: tuple[float, dict[str, float]] | None = None
    try:
        for (mod, name, label), (_, _, inner) in zip(PHASES, saved, strict=True):
            setattr(mod, name, timed(inner, label))
        for _ in range(repeat):
            spent.clear()
            gc.collect()
            start = time.process_time()
            fn()
            total = time.process_time() - start
            if best is None or total < best[0]:
                best = (total, {"validation total": total, **spent})
    finally:
        for mod, name, inner in saved:
            setattr(mod, name, inner)
    assert best is not None
    return best[1]


def fast_path_taken(body: bytes, prompt: list[int], identity: TeacherIdentity) -> bool:
    try:
        scan_completion(
            body,
            expected_prompt_len=len(prompt),
            k=K,
            vocab_size=identity.vocab_size,
            max_candidates=identity.max_prompt_logprob_candidates,
        )
    except FastPathDeferred:
        return False
    return True


def report(name: str, wall: float, cpu: float, base: tuple[float, float]) -> None:
    print(
        f"{name:<22} wall {wall * 1000:8.1f} ms ({wall / base[0]:.2f}x)"
        f"  cpu {cpu * 1000:8.1f} ms ({cpu / base[1]:.2f}x)"
    )


def peak_mb(body: bytes, prompt: list[int], identity: TeacherIdentity) -> float:
    gc.collect()
    tracemalloc.start()
    validate(body, prompt, identity, strict=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--strict", action="store_true", help="also time the strict parser")
    parser.add_argument("--phases", action="store_true", help="time each validation phase")
    parser.add_argument("--json", action="store_true", help="end with a JSON report")
    args = parser.parse_args()
    identity = bench_identity()
    body, prompt = build_body(identity)
    candidates = validate(body, prompt, identity, strict=False)
    print(
        f"body: {len(body) / 1e6:.1f} MB, {candidates:,} candidates,"
        f" bound {response_body_limit(len(prompt), K) / 1e6:.1f} MB,"
        f" fast path taken: {fast_path_taken(body, prompt, identity)}"
    )
    rounds = paired_rounds(
        args.repeat,
        lambda: orjson.loads(body),
        lambda: validate(body, prompt, identity, strict=False),
    )
    base = (min(r[0] for r in rounds), min(r[1] for r in rounds))
    report("orjson.loads", base[0], base[1], base)
    report("fast parse + verify", min(r[2] for r in rounds), min(r[3] for r in rounds), base)
    ratios = [r[3] / r[1] for r in rounds]
    print(f"                       median of per-round CPU ratios {statistics.median(ratios):.2f}x")
    print("                       target <= 0.50x")
    phases: dict[str, float] = {}
    if args.phases:
        phases = phase_times(args.repeat, lambda: validate(body, prompt, identity, strict=False))
        for label, seconds in phases.items():
            print(f"  {label:<38} {seconds * 1000:8.1f} ms  {seconds / base[1]:.3f}x")
    if args.strict:
        walls, cpus = paired_rounds(
            1, lambda: None, lambda: validate(body, prompt, identity, strict=True)
        )[0][2:]
        report("strict parse + verify", walls, cpus, base)
    peak = peak_mb(body, prompt, identity)
    print(f"validation peak:       {peak:8.1f} MB above the body (target <= 64 MB)")
    oversized = b" " * (response_body_limit(3, K) + 1)
    start = time.perf_counter()
    try:
        parse_completion_fast(
            oversized, expected_prompt_len=3, k=K, vocab_size=VOCAB, max_candidates=99
        )
    except ProbeFailed as exc:
        took = (time.perf_counter() - start) * 1000
        print(f"oversized body:        refused ({exc.rule}) in {took:.3f} ms, nothing parsed")
    if args.json:
        result = {
            "orjson_cpu_s": [r[1] for r in rounds],
            "kiln_cpu_s": [r[3] for r in rounds],
            "orjson_wall_s": [r[0] for r in rounds],
            "kiln_wall_s": [r[2] for r in rounds],
            "peak_mb_above_body": peak,
            "phases_cpu_s": phases,
            "body_mb": len(body) / 1e6,
            "candidates": candidates,
        }
        print("\n" + json.dumps(result))


if __name__ == "__main__":
    main()
