"""``kiln teacher-endpoint`` in front of ``kiln-teacher``'s gateway, which takes one prompt
per request: a batch through the endpoint is split into one request per prompt and the
answers joined in vLLM's shape, equal to what the teacher itself answers to the batch.

The gateway (``kiln_registry.gateway``, in a thread) fronts the reference teacher served
by uvicorn on a Unix socket, as it fronts vLLM in ``kiln-teacher``; all on loopback.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from kiln_registry.gateway.config import GatewayConfig
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.model import ReferenceTeacher
from tests.api.support import RegistryServer
from tests.endpoint.conftest import ALIAS, register
from tests.endpoint.support import EndpointProcess, tokens
from tests.gateway.support import running_gateway

pytestmark = pytest.mark.filterwarnings(
    "ignore:TRL currently supports vLLM versions:UserWarning",
    "ignore::DeprecationWarning",
)


@contextmanager
def gateway_url(teacher: ReferenceTeacher) -> Iterator[str]:
    """The gateway on 127.0.0.1 before the reference teacher on a private Unix socket."""
    directory = Path(tempfile.mkdtemp(prefix="kep-"))
    path = str(directory / "teacher.sock")
    app = create_reference_app(teacher, api_key_env=None)
    server = uvicorn.Server(uvicorn.Config(app, uds=path, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    config = GatewayConfig(host="127.0.0.1", port=0, upstream_uds=path,
                           served_model_id="teacher-tiny", max_model_len=64, max_top_k=8,
                           upstream_timeout=60.0)  # fmt: skip
    try:
        with running_gateway(config) as gateway:
            yield f"http://127.0.0.1:{gateway.port}"
    finally:
        server.should_exit = True
        thread.join(10)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_batch_through_the_endpoint_reaches_the_gateway_one_prompt_at_a_time(
    registry: RegistryServer,
    reference: tuple[ReferenceTeacher, TeacherIdentity],
    teacher_url: str,
    tmp_path: Path,
) -> None:
    from trl.generation.vllm_client import VLLMClient

    prompts = [tokens(8), tokens(15, start=3), tokens(4, start=9)]
    body = {"model": "teacher-tiny", "prompt": prompts, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 8}  # fmt: skip
    with gateway_url(reference[0]) as gateway:
        refused = httpx.post(gateway + "/v1/completions", json=body, trust_env=False, timeout=60)
        assert refused.status_code == 400  # the gateway takes one prompt per request
        register(registry, ALIAS, [gateway])
        with EndpointProcess(ALIAS, registry.url, tmp_path / "endpoint.log") as endpoint:
            endpoint.wait_ready()
            joined = httpx.post(endpoint.url + "/v1/completions", json=body, trust_env=False,
                                timeout=60).json()  # fmt: skip
            direct = httpx.post(teacher_url + "/v1/completions", json=body, trust_env=False,
                                timeout=60).json()  # fmt: skip
            assert joined["choices"] == direct["choices"]  # indexes, text, rows: vLLM's shape
            assert joined["usage"] == direct["usage"]  # summed over the prompts
            assert joined.keys() == direct.keys()
            sequences, lengths = [tokens(20), tokens(33, start=5)], [5, 10]
            through = VLLMClient(base_url=endpoint.url).get_sequence_logprobs(
                sequences, lengths, top_logprobs=8, temperature=1.0
            )
            expected = VLLMClient(base_url=teacher_url).get_sequence_logprobs(
                sequences, lengths, top_logprobs=8, temperature=1.0
            )
            assert through == expected
