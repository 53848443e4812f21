"""``kiln teacher-endpoint`` in front of a real ``kiln-teacher`` (vLLM CPU build).

TRL's own ``VLLMClient.get_sequence_logprobs`` with a batch of sequences through the
endpoint returns exactly what TRL makes of the teacher's direct answers to each sequence:
the launcher's gateway takes one flat prompt per request (TRL's client, which always
sends a list of sequences, cannot score there directly), so the endpoint splits the
batch and joins the answers.  Uses the session's one ``kiln-teacher`` launch and registry.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.endpoint.support import EndpointProcess
from tests.vllm.support import SERVED, Launched, Registry

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.filterwarnings(
        "ignore:TRL currently supports vLLM versions:UserWarning", "ignore::DeprecationWarning"
    ),
]
ALIAS = "vllm-endpoint-tiny"


def test_trl_batch_through_the_endpoint_equals_the_teacher_directly(
    launched: Launched, registry: Registry, tmp_path: Path
) -> None:
    from trl.generation.vllm_client import VLLMClient

    body = {"alias": ALIAS, "kind": "remote", "provider": "vllm", "url": launched.url + "/v1",
            "model_id": SERVED}  # fmt: skip
    with registry.client() as http:
        created = http.post("/v1/teachers", json=body)
        assert created.status_code == 200, created.text
    sequences = [[(3 + 5 * i) % 50 + 1 for i in range(20)], [(7 * i) % 40 + 2 for i in range(31)]]
    lengths = [6, 11]
    log = tmp_path / "endpoint.log"
    with EndpointProcess(ALIAS, registry.url, log, "--probe-timeout-s", "120") as endpoint:
        endpoint.wait_ready()
        through = VLLMClient(base_url=endpoint.url).get_sequence_logprobs(
            sequences, lengths, top_logprobs=8, temperature=1.0
        )
    # The gateway takes one flat prompt per request, so TRL's own client cannot score
    # there directly (it always sends a list of sequences); TRL's own formatting of the
    # teacher's direct answers, one sequence per request, is the reference.
    direct = VLLMClient(base_url=launched.url)
    expected = [
        direct._format_sequence_logprobs(_direct_choice(launched, seq), seq, n, 8)
        for seq, n in zip(sequences, lengths, strict=True)
    ]
    for key, value in through.items():
        assert value == [part[key] for part in expected], key


def _direct_choice(launched: Launched, sequence: list[int]) -> dict[str, object]:
    body = {"model": SERVED, "prompt": sequence, "max_tokens": 1, "temperature": 1.0,
            "prompt_logprobs": 8}  # fmt: skip
    answer = httpx.post(launched.url + "/v1/completions", json=body, timeout=600,
                        trust_env=False)  # fmt: skip
    assert answer.status_code == 200, answer.text
    choice: dict[str, object] = answer.json()["choices"][0]
    return choice
