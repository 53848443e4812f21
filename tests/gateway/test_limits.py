"""Request limits, the adapter rule and the response bound, each refused in vLLM's shape."""

from __future__ import annotations

import json
import threading
import time

import pytest

from kiln_registry.gateway import admission
from kiln_registry.probe import parse as probe_parse
from kiln_registry.probe import transport as probe_transport
from tests.gateway.conftest import GatewayFactory
from tests.gateway.support import (
    BASE_ALIAS,
    SERVED,
    FakeUpstream,
    RunningGateway,
    body_of,
    completion,
    post,
    raw_exchange,
    status_of,
    stream_event,
)


def _send(port: int, body: bytes) -> tuple[int, bytes]:
    answer = raw_exchange(port, post("/v1/completions", body))
    return status_of(answer), body_of(answer)


def _error(body: bytes) -> dict[str, object]:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}  # vLLM 0.32's shape
    assert isinstance(error, dict)
    return error


BAD_BODIES = [
    (completion(prompt=list(range(257))), "input_tokens"),
    (completion(prompt=[]), "prompt"),
    (completion(prompt=[[1, 2], [3]]), "prompt"),
    (completion(prompt=[1, True]), "prompt"),
    (completion(prompt=[1, -1]), "prompt"),
    (completion(prompt=[1, 2.0]), "prompt"),
    (completion(prompt_logprobs=33), "prompt_logprobs"),
    (completion(prompt_logprobs=-1), "prompt_logprobs"),
    (completion(prompt_logprobs=True), "prompt_logprobs"),
    (completion(logprobs=33), "logprobs"),
    (completion(n=2), "n"),
    (completion(n=True), "n"),
    (completion(best_of=2), "best_of"),
    (completion(max_tokens=-1), "max_tokens"),
    (completion(stream="yes"), "stream"),
    (completion(model=None), "model"),
    (b'{"model": "teacher-tiny", "model": "teacher-tiny", "prompt": [1]}', "body"),
    (b'{"model": "teacher-tiny", "prompt": [1], "temperature": NaN}', "body"),
    (b'["teacher-tiny"]', "body"),
    (b'{"model": "teacher-tiny", "prompt": [1]', "body"),
    (b'{"model": "teacher-tiny", "prompt": "\xff"}', "body"),
    (b"[" * 100_000, "body"),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_completion_bodies_are_400_and_never_forwarded(
    gateway: RunningGateway, upstream: FakeUpstream, body: bytes, param: str
) -> None:
    status, answer = _send(gateway.port, body)
    error = _error(answer)
    assert (status, error["type"], error["code"], error["param"]) == (
        400, "BadRequestError", 400, param,
    )  # fmt: skip
    assert upstream.seen == []


def test_limits_at_their_edges_pass(gateway: RunningGateway, upstream: FakeUpstream) -> None:
    for body in (
        completion(prompt=list(range(256)), prompt_logprobs=32, logprobs=32),
        completion(prompt="a string prompt", prompt_logprobs=None, n=1, best_of=None),
        completion(prompt_logprobs=0, max_tokens=0, stream=False),
    ):
        assert _send(gateway.port, body)[0] == 200
    assert len(upstream.seen) == 3


def test_a_model_other_than_the_served_id_is_404(
    gateway: RunningGateway, upstream: FakeUpstream
) -> None:
    status, answer = _send(gateway.port, completion(model="nope"))
    error = _error(answer)
    assert (status, error["type"], error["param"]) == (404, "NotFoundError", "model")
    assert error["message"] == f"The model `nope` does not exist. Valid aliases: {SERVED}."
    status, answer = _send(gateway.port, completion(model="x\u202ey"))
    assert status == 404 and "\u202e" not in answer.decode()
    assert upstream.seen == []


def test_the_adapters_base_alias_is_refused(
    make_gateway: GatewayFactory, upstream: FakeUpstream
) -> None:
    with make_gateway(base_alias=BASE_ALIAS) as gateway:
        status, answer = _send(gateway.port, completion(model=BASE_ALIAS))
        missing = _send(gateway.port, b'{"prompt": [1, 2], "max_tokens": 1}')[0]
        served = _send(gateway.port, completion())[0]
    error = _error(answer)
    assert (status, error["type"]) == (404, "NotFoundError")
    assert "internal base alias" in str(error["message"])
    assert missing == 400  # without a model vLLM would pick the base: refused
    assert served == 200
    assert len(upstream.seen) == 1


def test_an_oversized_body_is_413_before_it_is_read(
    make_gateway: GatewayFactory, upstream: FakeUpstream
) -> None:
    with make_gateway(max_body_bytes=1000) as gateway:
        head = b"POST /v1/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 1001\r\n\r\n"
        answer = raw_exchange(gateway.port, head)  # no body sent: the gateway must not wait
        assert status_of(answer) == 413
        assert b"connection: close" in answer
        huge = completion(prompt=list(range(200)), pad="x" * 1000)
        assert status_of(raw_exchange(gateway.port, post("/v1/completions", huge))) == 413
    assert upstream.seen == []


def test_an_answer_over_its_bound_is_502(gateway: RunningGateway) -> None:
    status, answer = _send(gateway.port, completion(kiln_test="huge"))
    assert (status, _error(answer)["code"]) == (502, 502)


def test_a_stream_passes_chunk_for_chunk(gateway: RunningGateway) -> None:
    answer = raw_exchange(gateway.port, post("/v1/completions", completion(kiln_test="stream")))
    head, body = answer.split(b"\r\n\r\n", 1)
    assert b"transfer-encoding: chunked" in head
    events = [stream_event(i) for i in range(5)] + [b"data: [DONE]\n\n"]
    assert body == b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


def test_a_stream_past_its_bound_is_cut_without_a_last_chunk(gateway: RunningGateway) -> None:
    answer = raw_exchange(
        gateway.port, post("/v1/completions", completion(kiln_test="stream_huge"))
    )
    assert status_of(answer) == 200
    assert not answer.endswith(b"0\r\n\r\n")
    assert len(answer) < 1_100_000  # about the 1 MiB bound, not the 2 MB stream


def test_requests_past_the_concurrency_limit_are_503(
    make_gateway: GatewayFactory, upstream: FakeUpstream
) -> None:
    with make_gateway(max_concurrent=1) as gateway:
        results: list[int] = []
        slow = threading.Thread(
            target=lambda: results.append(_send(gateway.port, completion(kiln_test="slow"))[0])
        )
        slow.start()
        while not upstream.seen:  # the slow request is in flight at the upstream
            time.sleep(0.01)
        status, answer = _send(gateway.port, completion())
        slow.join(30)
    assert (status, _error(answer)["code"]) == (503, 503)
    assert results == [200]


@pytest.mark.parametrize(("prompt_len", "k"), [(1, 0), (64, 32), (4096, 20), (10**6, 64)])
def test_the_bounds_equal_the_probe_clients(prompt_len: int, k: int) -> None:
    assert admission.response_body_limit(prompt_len, k) == probe_parse.response_body_limit(
        prompt_len, k
    )
    for status in (200, 400, 500):
        assert admission.response_cap(status, 5 << 20) == probe_transport.body_cap(status, 5 << 20)
