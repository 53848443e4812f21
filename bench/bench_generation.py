"""Benchmark: off-policy generation through the job queue against the teacher's own throughput.

Starts the reference teacher (``kiln reference-teacher``) on the tiny model
with a chat template and a registry (``kiln serve``) whose student is that
model, as child processes on loopback, registers the teacher, then for each
of ``--rounds`` rounds with its own seeded prompts measures, in the same run:

* the teacher's own throughput: that round's exact requests (the
  chat-rendered prompt ids, ``max_tokens``, greedy, ``logprobs = K`` with
  ``return_token_ids``, then with ``K > 0`` the prompt-logprobs request over
  the conversation as Kiln's preparation tokenizes it) sent straight to it
  with httpx at ``[jobs] concurrency`` in flight, bodies read in full;
* the cold generation job over the same prompts (a corpus file): submit ->
  succeeded from the server's ``created_at``/``finished_at`` (both probes,
  generation, verification, cache writes and the signed corpus included).

The arms alternate which goes first; the figure is the median of the
per-round ratios (teacher seconds / job seconds).  Target: >= 0.9x.
Prints one JSON document.

    .venv/bin/python bench/bench_generation.py [--prompts 200] [--concurrency 4] [--k 4]
        [--max-tokens 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _harness import machine, serving
from _harness import run_job as run_harness_job

MODEL_ID = "tiny-chat"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = ["the", "teacher", "says", "hello", "a", "cat", "doan", "zy", "quto", "ka", "indo"]


def chat_model(tmp: Path) -> Path:
    from kiln_registry.testing.tiny_models import build_tiny_llama

    source = build_tiny_llama(tmp / "plain").path
    dest = tmp / "model"
    shutil.copytree(source, dest)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    (dest / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return dest


def prompts(path: Path, count: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    out = [[{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(2, 6)))}]
           for _ in range(count)]  # fmt: skip
    with path.open("w", encoding="utf-8") as handle:
        for i, messages in enumerate(out):
            handle.write(json.dumps({"id": f"p{i}", "messages": messages}) + "\n")
    return out


async def direct(url: str, batch: list[Any], args: argparse.Namespace, tokenizer: Any) -> float:
    """Seconds for the job's exact requests sent straight to the teacher: each generation,
    then (``k > 0``) the prompt-logprobs request over the conversation as Kiln tokenizes it."""
    from kiln_registry.jobs.generation.kiln import KilnRenderer
    from kiln_registry.jobs.generation.sources import GenerationSettings
    from kiln_registry.jobs.generation.wire import generation_request
    from kiln_registry.probe.client import completion_request

    settings = GenerationSettings(max_tokens=args.max_tokens, top_k=args.k)
    renderer = KilnRenderer.for_tokenizer(tokenizer)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(http: httpx.AsyncClient, item: tuple[list[int], Any]) -> None:
        prompt, messages = item
        async with gate:
            body = generation_request(MODEL_ID, prompt, settings)
            response = await http.post(url + "/v1/completions", json=body)
            assert response.status_code == 200 and response.content, response.text
            if args.k == 0:
                return
            ids = response.json()["choices"][0]["token_ids"]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            seq = renderer.sequence(messages, text, "bench").token_ids
            body = completion_request(MODEL_ID, [*seq, seq[-1]], args.k)
            response = await http.post(url + "/v1/completions", json=body)
            assert response.status_code == 200 and response.content, response.text

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    async with httpx.AsyncClient(timeout=120, trust_env=False, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(one(http, item) for item in batch))
        return time.perf_counter() - started


def run_job(url: str, args: argparse.Namespace, name: str) -> dict[str, Any]:
    body = {"kind": "off_policy_generation", "teacher": "ref", "corpus": {"path": name},
            "max_tokens": args.max_tokens, "top_k": args.k}  # fmt: skip
    return run_harness_job(url, body)


def rounds(
    args: argparse.Namespace, t_url: str, url: str, batches: list[Any], tokenizer: Any
) -> list[Any]:
    out = []
    for index, ids in enumerate(batches):
        name = f"round{index}.jsonl"
        if index % 2 == 0:
            direct_s = asyncio.run(direct(t_url, ids, args, tokenizer))
            job = run_job(url, args, name)
        else:
            job = run_job(url, args, name)
            direct_s = asyncio.run(direct(t_url, ids, args, tokenizer))
        cached = run_job(url, args, name)  # greedy: every prompt a cache hit
        out.append({
            "direct_seconds": round(direct_s, 3), "cold_job_seconds": round(job["seconds"], 3),
            "job_vs_teacher": round(direct_s / job["seconds"], 3),
            "cached_job_seconds": round(cached["seconds"], 3), "progress": job["progress"],
            "result_bytes": job["result"]["bytes"],
        })  # fmt: skip
        print(json.dumps(out[-1]), file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--teacher-threads", type=int, default=1)
    args = parser.parse_args()
    from kiln_registry.jobs.generation.sources import render, student_tokenizer

    with tempfile.TemporaryDirectory() as raw:
        tmp = Path(raw)
        model = chat_model(tmp)
        tokenizer = student_tokenizer(model)
        (tmp / "corpora").mkdir()
        batches = [
            [(render(tokenizer, m, "bench"), m) for m in
             prompts(tmp / "corpora" / f"round{i}.jsonl", args.prompts, seed=19 + i)]
            for i in range(args.rounds)
        ]  # fmt: skip
        port = 19000 + os.getpid() % 1000
        # 128 tokens: since the corpus check counts the conversation as Kiln tokenizes it
        # (prompt, re-tokenized completion, the probe token and the generation slot), a
        # round-1 prompt with its 16 generated tokens needs 63 of a 64-token context, and
        # the job refuses the corpus (generation.kiln_sequence).
        with serving(tmp, port, model, concurrency=args.concurrency,
                     threads=args.teacher_threads, model_id=MODEL_ID,
                     max_model_len=128) as served:  # fmt: skip
            asyncio.run(direct(served.teacher_url, batches[0][:40], args, tokenizer))  # warm-up
            measured = rounds(args, served.teacher_url, served.url, batches, tokenizer)
    ratios = [r["job_vs_teacher"] for r in measured]
    report = {
        "machine": machine(),
        "settings": vars(args),
        "rounds": measured,
        "job_vs_teacher_median": statistics.median(ratios),
        "target": ">= 0.9",
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
