"""Every refused field and bound of ``kiln teacher-endpoint``, before the teacher is asked.

One endpoint process (``--max-prompts 4 --max-n 2 --max-body-mib 1``) in front of the
reference teacher serves the whole module.  Each refusal is a vLLM-shaped error
(``{"error": {"message", "type", "param", "code"}}`` plus the endpoint's ``rule``), and
the teacher never sees the request: the endpoint's count of relayed requests does not
move.  The pure admission rules are also checked directly for the whole allowlist.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kiln_registry.endpoint.admission import Limits, Pin, admit
from kiln_registry.endpoint.errors import EndpointRefusal
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import remote, run_registry, write_config
from tests.endpoint.support import EndpointProcess, tokens

ALIAS = "refusals@vllm"
PIN = Pin("teacher-tiny", vocab_size=512, max_top_k=8, max_model_len=64, max_candidates=100)
REFUSED_FIELDS = ("logit_bias", "allowed_token_ids", "bad_words", "logits_processors",
                  "structured_outputs", "guided_json", "guided_regex", "response_format",
                  "vllm_xargs", "kv_transfer_params", "lora_request", "truncate_prompt_tokens",
                  "priority", "mm_processor_kwargs", "no_such_field")  # fmt: skip


@pytest.fixture(scope="module")
def endpoint(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel, teacher_url: str
) -> Iterator[EndpointProcess]:
    directory = tmp_path_factory.mktemp("refusals")
    with run_registry(write_config(directory, student=tiny_model.path)) as registry:
        with registry.client() as http:
            assert http.post("/v1/teachers", json=remote(ALIAS, teacher_url)).status_code == 200
        extra = ("--max-prompts", "4", "--max-n", "2", "--max-body-mib", "1")
        with EndpointProcess(ALIAS, registry.url, directory / "endpoint.log", *extra) as proc:
            yield proc.wait_ready()


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "teacher-tiny", "prompt": tokens(10), "max_tokens": 1,
            "prompt_logprobs": 2, **extra}  # fmt: skip


def _error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["code"] == status
    return error


@pytest.mark.parametrize("field", REFUSED_FIELDS)
def test_fields_outside_the_allowlist_are_refused(field: str) -> None:
    with pytest.raises(EndpointRefusal) as caught:
        admit(_encoded(_body(**{field: {}})), PIN, Limits())
    assert caught.value.status == 400 and caught.value.param == field
    assert caught.value.rule == "endpoint.field_refused"


def _encoded(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("extra", "rule"),
    [
        ({"prompt_logprobs": 9}, "endpoint.max_top_k"),
        ({"prompt_logprobs": -1}, "endpoint.max_top_k"),
        ({"logprobs": 9}, "endpoint.max_top_k"),
        ({"prompt": tokens(65)}, "endpoint.max_model_len"),
        ({"prompt": tokens(60), "max_tokens": 5}, "endpoint.max_model_len"),
        ({"prompt": [1, 2, 512]}, "endpoint.token_id"),
        ({"prompt": [1, True]}, "endpoint.token_id"),
        ({"prompt": [1, -1]}, "endpoint.token_id"),
        ({"prompt": [1, 2.0]}, "endpoint.token_id"),
        ({"prompt": [1, None]}, "endpoint.token_id"),
        ({"prompt": [1, "2"]}, "endpoint.token_id"),
        ({"prompt": [[1, 2], [3, 2**70]]}, "endpoint.token_id"),
        ({"prompt": tokens(40), "prompt_logprobs": 8}, "endpoint.candidate_budget"),
        ({"prompt": []}, "endpoint.prompt"),
        ({"n": 0}, "endpoint.n"),
        ({"best_of": 3}, "endpoint.best_of"),
        ({"stream": True}, "endpoint.stream"),
        ({"echo": True}, "endpoint.echo"),
        ({"temperature": -1}, "endpoint.temperature"),
        ({"top_p": 0}, "endpoint.top_p"),
        ({"seed": "x"}, "endpoint.seed"),
        ({"stop": [1]}, "endpoint.stop"),
    ],
)
def test_bounds_of_the_pin_are_refused(extra: dict[str, Any], rule: str) -> None:
    with pytest.raises(EndpointRefusal) as caught:
        admit(_encoded(_body(**extra)), PIN, Limits())
    assert (caught.value.status, caught.value.rule) == (400, rule)


def test_refusals_over_http_never_reach_the_teacher(
    endpoint: EndpointProcess, teacher_url: str
) -> None:
    with endpoint.client() as http:
        before = _upstream_count(http)
        for field in ("logit_bias", "allowed_token_ids", "vllm_xargs", "lora_request", "zzz"):
            error = _error(http.post("/v1/completions", json=_body(**{field: None})))
            assert (error["param"], error["rule"]) == (field, "endpoint.field_refused")
            assert error["type"] == "BadRequestError"
        assert _error(http.post("/v1/completions", json=_body(prompt_logprobs=9)))["rule"] == (
            "endpoint.max_top_k"
        )
        assert _error(http.post("/v1/completions", json=_body(prompt=tokens(65))))["rule"] == (
            "endpoint.max_model_len"
        )
        five = [tokens(3)] * 5
        assert _error(http.post("/v1/completions", json=_body(prompt=five)))["rule"] == (
            "endpoint.prompts_per_request"
        )
        assert _error(http.post("/v1/completions", json=_body(n=3)))["rule"] == "endpoint.n"
        big = b'{"model": "teacher-tiny", "prompt": "' + b"x" * (1 << 20) + b'"}'
        assert _error(http.post("/v1/completions", content=big))["rule"] == "endpoint.body_size"
        dup = b'{"model": "teacher-tiny", "model": "teacher-tiny", "prompt": [1]}'
        assert _error(http.post("/v1/completions", content=dup))["rule"] == "endpoint.json"
        other = _error(http.post("/v1/completions", json=_body(model="other-model")), 404)
        assert other["type"] == "NotFoundError" and "other-model" in other["message"]
        assert http.get("/v1/nothing").status_code == 404
        assert _upstream_count(http) == before  # nothing reached the teacher
        ok = http.post("/v1/completions", json=_body(prompt=[tokens(3)] * 4, n=2))
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 8
        metrics = http.get("/metrics").text
        assert 'kiln_endpoint_refusals_total{rule="endpoint.field_refused"} 5.0' in metrics


def _upstream_count(http: httpx.Client) -> str:
    """How many requests the endpoint relayed to the teacher so far."""
    lines = http.get("/metrics").text.splitlines()
    return next(line for line in lines if line.startswith("kiln_endpoint_upstream_seconds_count"))


def test_a_teacher_refusal_is_passed_on_in_vllm_shape(endpoint: EndpointProcess) -> None:
    with endpoint.client() as http:
        # The reference teacher refuses top_k (an allowed sampling field) with its own 400.
        error = _error(http.post("/v1/completions", json=_body(top_k=5)))
        assert error["rule"] == "endpoint.teacher_status"
        assert error["type"] == "BadRequestError"
        assert len(error["message"]) <= 420
