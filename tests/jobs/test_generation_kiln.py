"""Generation corpora Kiln's off-policy preparation accepts: real jobs on the reference teacher.

Two student chat templates (ChatML, and Llama-3 framing whose assistant block
ends with ``eos_token``, which Kiln renders empty), ``top_k`` 1, 8 and the
teacher's maximum (16); every example must pass ``tests.kiln_conformance.
kiln_rules`` (Kiln's masking, teacher-token count and id checks, top-K row
rules).  One prompt's answer is rewritten by a proxy to ids that split "é"
across two byte tokens and spell "zy" and "ka" in single letters: a random
tiny model cannot be made to generate that for real (the one stub here), and
Kiln's tokenization of the text differs from those sampled ids.  The scoring
pass after it is the real teacher's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response

from kiln_registry.jobs.core.signing import parse_keys
from kiln_registry.jobs.generation.sources import render, student_tokenizer
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.testing.tiny_models import TinyModel
from kiln_registry.wire.jobs import KILN_SMALL_K_NOTE
from tests.helpers import serve_app
from tests.jobs.generation_harness import CHAT_MODEL_ID, MESSAGES, chat_teacher, submit_generation
from tests.jobs.harness import make_config, running_registry
from tests.kiln_conformance import kiln_rules
from tests.kiln_conformance.test_off_policy_preparation import TEMPLATES

MAX_TOP_K = 16
MB_MESSAGES = [{"role": "user", "content": "say zy é ka"}]
SPLIT = ("z", "y", "Ġ", "Ã", "©", "Ġ", "k", "a")  # "zy é ka", "é" as two byte tokens


def _rewritten(tokenizer: Any, request: dict[str, Any], answer: dict[str, Any],
               pieces: tuple[str, ...]) -> dict[str, Any]:  # fmt: skip
    """``answer`` with its completion replaced by ``pieces`` and consistent logprobs."""
    ids = [int(tokenizer.convert_tokens_to_ids(p)) for p in pieces]
    choice = answer["choices"][0]
    choice.update(token_ids=ids, finish_reason="stop", text=tokenizer.decode(ids))
    answer["usage"]["completion_tokens"] = len(ids)
    k = request.get("logprobs")
    if k:
        rows = []
        for t in ids:
            others = [o for o in range(10, 10 + k) if o != t][: k - 1]
            row = {f"token_id:{t}": -0.5}
            row.update({f"token_id:{o}": -1.0 - j / 64 for j, o in enumerate(others)})
            rows.append(row)
        choice["logprobs"] = {
            "tokens": [f"token_id:{t}" for t in ids],
            "token_logprobs": [-0.5] * len(ids),
            "top_logprobs": rows,
        }
    return answer


@contextmanager
def _proxy(upstream: str, rewrite: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
           ) -> Iterator[str]:  # fmt: skip
    """Forwards to ``upstream``; generation answers (``return_token_ids``) go through rewrite."""
    app = FastAPI(openapi_url=None)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        async with httpx.AsyncClient(base_url=upstream, timeout=60.0, trust_env=False) as http:
            answer = await http.request(request.method, "/" + path, content=body,
                                        headers={"content-type": "application/json"})  # fmt: skip
        content = answer.content
        sent = json.loads(body) if body else {}
        if sent.get("return_token_ids") and answer.status_code == 200:
            content = json.dumps(rewrite(sent, json.loads(content))).encode()
        return Response(content=content, status_code=answer.status_code,
                        media_type="application/json")  # fmt: skip

    with serve_app(app) as url:
        yield url


@dataclass
class Served:
    name: str
    student: Path
    url: str
    vocab: int
    tokenizer: Any
    pieces: tuple[str, ...]  # what the multi-byte prompt's answer becomes


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[Served]:
    name = str(request.param)
    student = tmp_path_factory.mktemp(name) / "model"
    shutil.copytree(tiny_model.path, student)
    config = json.loads((student / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATES[name]
    (student / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = student_tokenizer(student)
    mb_prompt = render(tokenizer, MB_MESSAGES, "test")

    def rewrite(sent: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if sent["prompt"] != mb_prompt:
            return answer
        return _rewritten(tokenizer, sent, answer, SPLIT)

    with (
        chat_teacher(student, max_model_len=256, max_top_k=MAX_TOP_K) as teacher,
        _proxy(teacher.url, rewrite) as url,
    ):
        yield Served(name, student, url, teacher.identity.vocab_size, tokenizer, SPLIT)


def _encoder(tokenizer: Any) -> kiln_rules.Encoder:
    def encode(text: str) -> tuple[list[int], list[tuple[int, int]]]:
        got = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        return list(got.ids), list(got.offsets)

    return encode


def _check_teacher_rows(model: Any, example: dict[str, Any], top_k: int) -> None:
    """Each teacher token holds Transformers' own scores of Kiln's sequence at logits row
    ``position - 1``: the token's logprob and the top-K, best first."""
    import torch

    meta = example["metadata"]
    seq, positions = meta["kiln_token_ids"], meta["kiln_action_positions"]
    with torch.no_grad():
        rows = torch.log_softmax(model(torch.tensor([seq])).logits[0].double(), dim=-1)
    for at, token in zip(positions, example["teacher_tokens"], strict=True):
        row = rows[at - 1]
        assert abs(float(row[seq[at]]) - token["logprob"]) < 1e-4
        best = torch.topk(row, top_k)
        assert [e["token_id"] for e in token["top_logprobs"]] == best.indices.tolist()
        got = [e["logprob"] for e in token["top_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, best.values.tolist(), strict=True)) < 1e-4


def test_generation_corpora_pass_kilns_off_policy_preparation(
    tmp_path: Path, served: Served
) -> None:
    config = make_config(tmp_path, served.student, concurrency=2)
    prompts = [{"id": f"p{i}", "messages": m} for i, m in enumerate(MESSAGES)]
    prompts.append({"id": "mb", "messages": MB_MESSAGES})
    template, encode = TEMPLATES[served.name], _encoder(served.tokenizer)
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(served.student, local_files_only=True)
    with running_registry(config) as reg:
        reg.register("ref@kiln", served.url, CHAT_MODEL_ID)
        keys = parse_keys(reg.http.get("/v1/keys").json(), "GET /v1/keys")
        for top_k in (1, 8, MAX_TOP_K):
            sent = submit_generation(reg.http, "ref@kiln", prompts=prompts, max_tokens=12,
                                     top_k=top_k)  # fmt: skip
            assert sent.status_code == 201, sent.text
            job = reg.wait(sent.json()["id"], timeout=120.0)
            assert job["status"] == "succeeded", job["error"]
            note = KILN_SMALL_K_NOTE if top_k < 16 else None
            assert job["generation"].get("kiln_note") == note
            assert config.jobs.result_root is not None
            path = config.jobs.result_root / f"{job['id']}.jsonl"
            assert verify_corpus(path, keys).sequences == len(prompts)
            examples = [json.loads(line) for line in path.read_text().splitlines()[1:]]
            fixture: dict[Any, Any] = {}
            for example in examples:
                positions = kiln_rules.prepare_example(
                    example, template, encode, top_k, served.vocab, fixture
                )
                assert positions == example["metadata"]["kiln_action_positions"]
                if top_k == MAX_TOP_K:
                    _check_teacher_rows(model, example, top_k)
            mb = examples[-1]
            assert mb["teacher_response"] == "zy é ka"
            sampled = mb["metadata"]["completion_token_ids"]
            assert [t["token_id"] for t in mb["teacher_tokens"]] != sampled


# ChatML only: its end markers make Kiln's sequence longer than the prompt and response sent.
@pytest.mark.parametrize("served", ["chatml"], indirect=True)
def test_a_conversation_too_long_to_score_as_kiln_tokenizes_it_fails_the_job(
    tmp_path: Path, served: Served
) -> None:
    room = 256 - 12  # the teacher's max_model_len less max_tokens: the longest prompt taken
    words = 1
    while len(render(served.tokenizer, _long(words + 1), "test")) <= room:
        words += 1
    config = make_config(tmp_path, served.student)
    with running_registry(config) as reg:
        reg.register("ref@kiln", served.url, CHAT_MODEL_ID)
        sent = submit_generation(reg.http, "ref@kiln", max_tokens=12, top_k=1,
                                 prompts=[{"id": "long", "messages": _long(words)}])  # fmt: skip
        assert sent.status_code == 201, sent.text
        job = reg.wait(sent.json()["id"], timeout=60.0)
    assert job["status"] == "failed", job
    assert job["error"]["rule"] == "generation.kiln_sequence"
    assert "'long'" in job["error"]["message"] and job["result"] is None
    assert config.jobs.result_root is not None
    assert not any(config.jobs.result_root.glob("*.jsonl"))


def _long(words: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": " ".join(["kave"] * words)}]
