"""``kiln teacher-endpoint`` in front of the reference teacher, driven by real clients.

TRL's own ``VLLMClient.get_sequence_logprobs`` (unmodified) and the ``openai`` package's
``completions.create(..., extra_body={"prompt_logprobs": k})`` get through the endpoint
exactly what they get from the teacher directly; batched prompts answer as single ones;
``/v1/models`` reports the pin's ``max_model_len``; ``/metrics`` counts the scored
tokens; TRL's ``ServerDistillationTrainer`` runs two steps on CPU with the endpoint as its
teacher server.  The endpoint is the real CLI in a subprocess; everything is on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer
from tests.endpoint.conftest import ALIAS, register
from tests.endpoint.support import EndpointProcess, tokens

pytestmark = pytest.mark.filterwarnings(
    "ignore:TRL currently supports vLLM versions:UserWarning",
    "ignore::DeprecationWarning",
)


def _score(url: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=body, timeout=60, trust_env=False)


def test_trl_and_openai_clients_see_the_teacher_unchanged(
    registry: RegistryServer, teacher_url: str, tmp_path: Path
) -> None:
    from openai import OpenAI
    from trl.generation.vllm_client import VLLMClient

    register(registry, ALIAS, [teacher_url])
    with EndpointProcess(ALIAS, registry.url, tmp_path / "endpoint.log") as endpoint:
        endpoint.wait_ready()
        assert endpoint.model == "teacher-tiny"
        sequences = [tokens(20), tokens(33, start=5), tokens(9, start=11)]
        lengths = [5, 10, 3]
        through = VLLMClient(base_url=endpoint.url).get_sequence_logprobs(
            sequences, lengths, top_logprobs=8, temperature=1.0
        )
        direct = VLLMClient(base_url=teacher_url).get_sequence_logprobs(
            sequences, lengths, top_logprobs=8, temperature=1.0
        )
        assert through == direct
        assert len(through["logprobs"][1]) == 33 - 10

        models = httpx.get(endpoint.url + "/v1/models", trust_env=False).json()
        assert [m["id"] for m in models["data"]] == ["teacher-tiny"]
        assert models["data"][0]["max_model_len"] == 64

        client = OpenAI(base_url=endpoint.url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(
            model="teacher-tiny",
            prompt=tokens(12),
            max_tokens=1,
            temperature=0.0,
            extra_body={"prompt_logprobs": 4},
        )
        rows = answer.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
        assert rows[0] is None and len(rows) == 12
        assert all(1 <= len(row) <= 5 for row in rows[1:])
        expected = _score(teacher_url, _body(tokens(12), 4)).json()
        assert rows == expected["choices"][0]["prompt_logprobs"]

        metrics = httpx.get(endpoint.url + "/metrics", trust_env=False).text
        assert "kiln_endpoint_prompt_tokens_scored_total 74.0" in metrics  # 20+33+9+12


def _body(prompt: object, k: int, **extra: object) -> dict[str, object]:
    return {"model": "teacher-tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": k, **extra}  # fmt: skip


def test_batched_prompts_answer_as_single_ones(
    registry: RegistryServer, teacher_url: str, tmp_path: Path
) -> None:
    register(registry, ALIAS, [teacher_url])
    prompts = [tokens(8), tokens(15, start=3), tokens(4, start=9)]
    with EndpointProcess(ALIAS, registry.url, tmp_path / "endpoint.log") as endpoint:
        endpoint.wait_ready()
        batched = _score(endpoint.url, _body(prompts, 8)).json()
        assert [c["index"] for c in batched["choices"]] == [0, 1, 2]
        for prompt, choice in zip(prompts, batched["choices"], strict=True):
            single = _score(endpoint.url, _body(prompt, 8)).json()["choices"][0]
            assert choice["prompt_logprobs"] == single["prompt_logprobs"]
        generated = _score(endpoint.url, _body(tokens(6), 2, max_tokens=3, logprobs=2, n=2))
        assert generated.status_code == 200, generated.text
        assert len(generated.json()["choices"]) == 2


@pytest.mark.filterwarnings(
    # TRL's trainer and Transformers warn about their own defaults (padding side, ...).
    "ignore::UserWarning",
    "ignore::FutureWarning",
)
def test_trl_server_distillation_trainer_runs_through_the_endpoint(
    registry: RegistryServer, teacher_url: str, tmp_path: Path, tiny_model: TinyModel
) -> None:
    """TRL's own ServerDistillationTrainer, a few steps on CPU, scores through the endpoint."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.server_distillation import (
        ServerDistillationConfig,
        ServerDistillationTrainer,
    )

    register(registry, ALIAS, [teacher_url])
    with EndpointProcess(ALIAS, registry.url, tmp_path / "endpoint.log") as endpoint:
        endpoint.wait_ready()
        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model.path))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        args = ServerDistillationConfig(
            output_dir=str(tmp_path / "out"), teacher_model_server_url=endpoint.url,
            max_steps=2, per_device_train_batch_size=2, max_completion_length=8,
            loss_top_k=1, use_cpu=True, report_to=[], save_strategy="no", seed=0,
        )  # fmt: skip
        trainer = ServerDistillationTrainer(
            model=AutoModelForCausalLM.from_pretrained(str(tiny_model.path)),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["the cat", "a dog ran", "one", "red"]}),
            processing_class=tokenizer,
        )
        result = trainer.train()
        assert result.global_step == 2
        metrics = httpx.get(endpoint.url + "/metrics", trust_env=False).text
        scored = next(
            line for line in metrics.splitlines()
            if line.startswith("kiln_endpoint_prompt_tokens_scored_total")
        )  # fmt: skip
        assert float(scored.split()[-1]) > 0
