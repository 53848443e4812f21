"""Credentials: the gateway checks the bearer key and forwards no client credential."""

from __future__ import annotations

import pytest

from kiln_registry.domain.errors import InputError
from kiln_registry.gateway.config import parse_gateway_argv
from tests.gateway.conftest import GatewayFactory
from tests.gateway.support import (
    FakeUpstream,
    RunningGateway,
    body_of,
    completion,
    post,
    raw_exchange,
    status_of,
)

KEY = b"s3cret-gateway-key"
CREDENTIALS = [
    b"authorization: Bearer " + KEY,
    b"cookie: session=abc",
    b"proxy-authorization: Basic eDp5",
    b"x-api-key: abc",
    b"x-forwarded-for: 10.0.0.1",
    b"x-request-id: chosen-by-client",
    b"forwarded: for=10.0.0.1",
    b"keep-alive: timeout=5",
    b"te: trailers",
    b"upgrade: h2c",
]
ALLOWED_UPSTREAM = {b"host", b"accept-encoding", b"content-type", b"content-length", b"accept"}


def _post(port: int, *extra: bytes) -> bytes:
    return raw_exchange(port, post("/v1/completions", completion(), *extra))


@pytest.mark.parametrize(
    "auth",
    [
        [],
        [b"authorization: Bearer wrong"],
        [b"authorization: Basic " + KEY],
        [b"authorization: Bearer " + KEY + b"x"],
        [b"authorization: Bearer " + KEY, b"authorization: Bearer " + KEY],
        [b"authorization: Bearer"],
        [b"authorization: " + KEY],
    ],
)
def test_a_missing_or_wrong_key_is_401_in_vllms_shape(
    make_gateway: GatewayFactory, upstream: FakeUpstream, auth: list[bytes]
) -> None:
    with make_gateway(api_key=KEY) as gateway:
        answer = _post(gateway.port, *auth)
        models = raw_exchange(gateway.port, b"GET /v1/models HTTP/1.1\r\nhost: g\r\n\r\n")
    assert (status_of(answer), body_of(answer)) == (401, b'{"error":"Unauthorized"}')
    assert status_of(models) == 401
    assert KEY not in answer
    assert upstream.seen == []


def test_the_right_key_passes_and_is_never_forwarded(
    make_gateway: GatewayFactory, upstream: FakeUpstream
) -> None:
    with make_gateway(api_key=KEY) as gateway:
        assert status_of(_post(gateway.port, *CREDENTIALS)) == 200
        assert status_of(_post(gateway.port, b"authorization: bearer " + KEY)) == 200
        health = raw_exchange(
            gateway.port, b"GET /health HTTP/1.1\r\nhost: g\r\nconnection: close\r\n\r\n"
        )
    assert status_of(health) == 200  # /health needs no key, as in vLLM
    assert len(upstream.seen) == 3
    for seen in upstream.seen:
        assert {name for name, _ in seen.headers} <= ALLOWED_UPSTREAM
        assert all(KEY not in value for _, value in seen.headers)


def test_without_a_key_client_credentials_are_still_stripped(
    gateway: RunningGateway, upstream: FakeUpstream
) -> None:
    assert status_of(_post(gateway.port, *CREDENTIALS)) == 200
    (seen,) = upstream.seen
    assert {name for name, _ in seen.headers} <= ALLOWED_UPSTREAM
    assert dict(seen.headers)[b"host"] == b"localhost"


def test_the_key_comes_from_the_named_variable_and_stays_out_of_repr() -> None:
    argv = ["--host=127.0.0.1", "--port=0", "--upstream-uds=/tmp/x.sock",
            "--served-model-id=t", "--max-model-len=8", "--max-top-k=2",
            "--api-key-env=KILN_GW_KEY"]  # fmt: skip
    config = parse_gateway_argv(argv, {"KILN_GW_KEY": KEY.decode()})
    assert config.api_key == KEY
    assert KEY.decode() not in repr(config)
    for env in ({}, {"KILN_GW_KEY": ""}, {"KILN_GW_KEY": "has space"}):
        with pytest.raises(InputError) as caught:
            parse_gateway_argv(argv, env)
        assert caught.value.rule == "gateway.api_key"
        assert "space" not in str(caught.value)


@pytest.mark.parametrize(
    "bad",
    [
        ["--port=0"],
        ["--port=08"],
        ["--colour=red"],
        ["--port", "8000"],
        ["--max-top-k=-1"],
        ["--upstream-uds=relative.sock"],
        ["--served-model-id=../x"],
        ["--port=1", "--port=2"],
        ["--api-key=abc"],
    ],
)
def test_gateway_flags_fail_closed(bad: list[str]) -> None:
    base = {"--host": "--host=h", "--upstream-uds": "--upstream-uds=/s", "--port": "--port=1",
            "--served-model-id": "--served-model-id=t", "--max-model-len": "--max-model-len=8",
            "--max-top-k": "--max-top-k=2"}  # fmt: skip
    names = {token.split("=", 1)[0] for token in bad}
    argv = [token for name, token in base.items() if name not in names] + bad
    if bad == ["--port=0"]:
        argv.remove("--host=h")  # a required flag missing
    with pytest.raises(InputError) as caught:
        parse_gateway_argv(argv, {})
    assert caught.value.rule == "gateway.flag"
    assert "abc" not in str(caught.value)
