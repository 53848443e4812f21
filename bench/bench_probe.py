"""Benchmark: validating a 1,000,000-candidate max-K prompt-logprobs body.

Builds a vLLM-shaped body (K=32, 30,303 positions, every row K+1 wide,
realistic 16-17 digit float32 reprs, about 71 MB), then in the same run
times ``orjson.loads`` of the bytes (the baseline) against the full
validation the probe client runs: ``parse_completion_fast`` (the numpy fast
path, ``probe/fastscan.py``) + ``verify_completion``.  Both wall-clock and
process CPU time are reported (best of ``--repeat``); the CPU ratio is the
one to quote on a shared machine.  Peak memory is traced (tracemalloc, which
numpy reports to) in a separate pass, and an oversized body is refused before
any parsing.  ``--strict`` also times the strict parser for comparison.

Targets (issue 3): validation <= 0.5x orjson; peak <= body + 64 MB.
Run: ``.venv/bin/python bench/bench_probe.py [--repeat N] [--strict]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from array import array
from collections.abc import Callable

import orjson

from kiln_registry.errors import ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.fastscan import (
    FastPathDeferred,
    parse_completion_fast,
    scan_completion,
)
from kiln_registry.probe.parse import parse_completion, response_body_limit
from kiln_registry.probe.verify import verify_completion

K = 32
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


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, float]:
    """(best wall-clock seconds, best process CPU seconds) over ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


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


def report(name: str, times: tuple[float, float], base: tuple[float, float]) -> None:
    wall, cpu = times
    print(
        f"{name:<22} wall {wall * 1000:8.1f} ms ({wall / base[0]:.2f}x)"
        f"  cpu {cpu * 1000:8.1f} ms ({cpu / base[1]:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--strict", action="store_true", help="also time the strict parser")
    args = parser.parse_args()
    identity = bench_identity()
    body, prompt = build_body(identity)
    candidates = validate(body, prompt, identity, strict=False)
    print(
        f"body: {len(body) / 1e6:.1f} MB, {candidates:,} candidates,"
        f" bound {response_body_limit(len(prompt), K) / 1e6:.1f} MB,"
        f" fast path taken: {fast_path_taken(body, prompt, identity)}"
    )
    base = best_of(args.repeat, lambda: orjson.loads(body))
    report("orjson.loads", base, base)
    fast = best_of(args.repeat, lambda: validate(body, prompt, identity, strict=False))
    report("fast parse + verify", fast, base)
    print("                       target <= 0.50x")
    if args.strict:
        strict = best_of(1, lambda: validate(body, prompt, identity, strict=True))
        report("strict parse + verify", strict, base)
    gc.collect()
    tracemalloc.start()
    validate(body, prompt, identity, strict=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"validation peak:       {peak / 1e6:8.1f} MB above the body (target <= 64 MB)")
    oversized = b" " * (response_body_limit(3, K) + 1)
    start = time.perf_counter()
    try:
        parse_completion_fast(
            oversized, expected_prompt_len=3, k=K, vocab_size=VOCAB, max_candidates=99
        )
    except ProbeFailed as exc:
        took = (time.perf_counter() - start) * 1000
        print(f"oversized body:        refused ({exc.rule}) in {took:.3f} ms, nothing parsed")


if __name__ == "__main__":
    main()
