"""The route allowlist: three routes forwarded, everything else a 404 that never reaches vLLM."""

from __future__ import annotations

import http.client
import json

import pytest

from tests.gateway.support import (
    MODELS,
    PL1,
    FakeUpstream,
    RunningGateway,
    body_of,
    completion,
    post,
    raw_exchange,
    status_of,
)

# Routes vLLM 0.32 registers beside the three the gateway serves (some only with options);
# the real-vLLM tier takes the list from the running app instead.
VLLM_ROUTES = [
    ("POST", "/invocations"), ("GET", "/ping"), ("POST", "/ping"), ("POST", "/tokenize"),
    ("POST", "/detokenize"), ("GET", "/metrics"), ("GET", "/version"), ("GET", "/load"),
    ("POST", "/v1/chat/completions"), ("POST", "/v1/embeddings"), ("POST", "/pooling"),
    ("POST", "/classify"), ("POST", "/score"), ("POST", "/v1/score"), ("POST", "/rerank"),
    ("POST", "/v1/rerank"), ("POST", "/v2/rerank"), ("POST", "/v1/responses"),
    ("POST", "/v1/audio/transcriptions"), ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"), ("POST", "/start_profile"), ("POST", "/sleep"),
    ("POST", "/reset_prefix_cache"), ("GET", "/docs"), ("GET", "/openapi.json"),
    ("GET", "/server_info"), ("POST", "/collective_rpc"), ("POST", "/scale_elastic_ep"),
]  # fmt: skip
WRONG_METHODS = [
    ("GET", "/v1/completions"), ("PUT", "/v1/completions"), ("DELETE", "/v1/completions"),
    ("PATCH", "/v1/completions"), ("OPTIONS", "/v1/completions"), ("HEAD", "/health"),
    ("POST", "/health"), ("POST", "/v1/models"), ("TRACE", "/health"), ("CONNECT", "/health"),
]  # fmt: skip
PATH_TRICKS = [
    "//v1/completions", "/v1/completions/", "/v1/completions?x", "/v1/completions?",
    "/v1/%2e%2e/v1/completions", "/v1/completions%2f", "/%761/completions",
    "/v1/./completions", "/v1/../v1/completions", "/V1/completions", "/v1//completions",
    "/v1/completions#x", "/v1/completions;x", "http://gw/v1/completions", "*",
    "/v1/completions%00", "/v1/completions%20", "/./v1/completions", "/health?x",
    "/health/", "//health", "/v1/models/", "/v1/models?x", "/v1/models/teacher-tiny",
]  # fmt: skip


def _request(port: int, method: str, target: str) -> bytes:
    body = completion() if method in ("POST", "PUT", "PATCH", "DELETE") else b""
    head = [f"{method} {target} HTTP/1.1".encode(), b"host: gw", b"connection: close"]
    if body:
        head.append(b"content-length: %d" % len(body))
    return raw_exchange(port, b"\r\n".join(head) + b"\r\n\r\n" + body)


def test_the_three_routes_pass(gateway: RunningGateway, upstream: FakeUpstream) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    conn.request("POST", "/v1/completions", completion(), {"content-type": "application/json"})
    answer = conn.getresponse()
    assert (answer.status, answer.read()) == (200, PL1)  # byte for byte, same connection next
    conn.request("GET", "/v1/models")
    answer = conn.getresponse()
    assert (answer.status, answer.read()) == (200, MODELS)
    conn.request("GET", "/health")
    answer = conn.getresponse()
    assert (answer.status, answer.read()) == (200, b"")
    conn.close()
    assert [(s.method, s.path) for s in upstream.seen] == [
        ("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/health"),
    ]  # fmt: skip
    assert upstream.seen[0].body == completion()  # the request body is forwarded as sent


def test_response_headers_are_upstreams_with_no_additions(gateway: RunningGateway) -> None:
    answer = _request(gateway.port, "POST", "/v1/completions")
    head = answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    names = sorted(line.split(b":", 1)[0].lower() for line in head[1:])
    # uvicorn's own date/server, the app's content-type and length, and the close we asked for.
    assert names == [b"connection", b"content-length", b"content-type", b"date", b"server"]
    assert body_of(answer) == PL1


@pytest.mark.parametrize(("method", "target"), VLLM_ROUTES + WRONG_METHODS)
def test_every_other_route_is_404_and_never_forwarded(
    gateway: RunningGateway, upstream: FakeUpstream, method: str, target: str
) -> None:
    answer = _request(gateway.port, method, target)
    assert status_of(answer) == 404
    error = json.loads(body_of(answer))["error"]
    assert (error["type"], error["code"]) == ("Not Found", 404)
    assert upstream.seen == []


@pytest.mark.parametrize("target", PATH_TRICKS)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_path_tricks_are_404_and_never_forwarded(
    gateway: RunningGateway, upstream: FakeUpstream, method: str, target: str
) -> None:
    answer = _request(gateway.port, method, target)
    assert status_of(answer) == 404
    assert upstream.seen == []


@pytest.mark.parametrize("target", ["/v1/completions\x00", "/v1/comp letions", "/v1/\x7fx"])
def test_control_bytes_in_the_target_are_400(
    gateway: RunningGateway, upstream: FakeUpstream, target: str
) -> None:
    answer = raw_exchange(gateway.port, post(target, completion()))
    assert status_of(answer) == 400
    assert upstream.seen == []
