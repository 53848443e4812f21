"""Benchmark: validating a 1,000,000-candidate max-K prompt-logprobs body.

Builds a vLLM-shaped body (K=32, 30,303 positions, every row K+1 wide, about
78 MB), then in the same run times ``orjson.loads`` of the bytes (the
baseline) against ``parse_completion`` + ``verify_completion`` (the full
strict validation), reports the ratio, the validation's peak traced memory
(tracemalloc, in a second pass so tracing does not distort the timing), and
checks that an oversized body is refused before any parsing.

Targets (docs/development.md): validation <= 0.5x orjson; peak <= body + 64 MB.
Run: ``.venv/bin/python bench/bench_probe.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from array import array

import orjson

from kiln_registry.errors import ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
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


def validate(body: bytes, prompt: list[int], identity: TeacherIdentity) -> int:
    parsed = parse_completion(
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


def best_of(repeat: int, fn: object) -> float:
    assert callable(fn)
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    identity = bench_identity()
    body, prompt = build_body(identity)
    mb = len(body) / 1e6
    candidates = validate(body, prompt, identity)
    print(
        f"body: {mb:.1f} MB, {candidates:,} candidates,"
        f" bound {response_body_limit(len(prompt), K) / 1e6:.1f} MB"
    )
    t_orjson = best_of(args.repeat, lambda: orjson.loads(body))
    t_valid = best_of(args.repeat, lambda: validate(body, prompt, identity))
    print(f"orjson.loads:        {t_orjson * 1000:8.1f} ms")
    print(
        f"parse + verify:      {t_valid * 1000:8.1f} ms"
        f"  ratio {t_valid / t_orjson:.2f}x (target <= 0.5x)"
    )
    gc.collect()
    tracemalloc.start()
    validate(body, prompt, identity)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"validation peak:     {peak / 1e6:8.1f} MB above the body (target <= 64 MB)")
    oversized = b" " * (response_body_limit(3, K) + 1)
    start = time.perf_counter()
    try:
        parse_completion(oversized, expected_prompt_len=3, k=K, vocab_size=VOCAB, max_candidates=99)
    except ProbeFailed as exc:
        took = (time.perf_counter() - start) * 1000
        print(f"oversized body:      refused ({exc.rule}) in {took:.3f} ms, nothing parsed")


if __name__ == "__main__":
    main()
