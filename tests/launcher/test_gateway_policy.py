"""The launcher's gateway options: what goes to vLLM, what to the gateway, what is refused."""

from __future__ import annotations

import pytest

from kiln_registry.domain.errors import InputError, PolicyError
from kiln_registry.launcher.front import (
    GATEWAY_KEY_VARIABLE,
    boundary_document,
    gateway_front,
    vllm_transport,
)
from kiln_registry.launcher.policy import LauncherRequest, parse_launcher_argv

KEY = "k3y-never-in-argv"
BASE = ["--model-path=/m", "--served-model-id=teacher", "--max-top-k=8", "--max-model-len=64"]


def _request(*flags: str, extras: tuple[str, ...] = ()) -> LauncherRequest:
    return parse_launcher_argv([*BASE, *flags, "--", *extras], {})


def test_the_gateway_is_on_by_default() -> None:
    assert _request().gateway is True
    assert _request("--gateway=on").gateway is True
    assert _request("--gateway=off").gateway is False
    with pytest.raises(InputError) as caught:
        _request("--gateway=maybe")
    assert caught.value.rule == "launcher.value"


@pytest.mark.parametrize(
    ("extra", "rule"),
    [
        ("--uds=/tmp/mine.sock", "policy.gateway_owned"),
        ("--ssl-certfile=/etc/cert.pem", "policy.gateway_unsupported"),
        ("--ssl-keyfile=/etc/key.pem", "policy.gateway_unsupported"),
        ("--root-path=/teacher", "policy.gateway_unsupported"),
        ('--allowed-origins=["https://a.example"]', "policy.gateway_unsupported"),
        ("--allow-credentials", "policy.gateway_unsupported"),
        ("--enable-request-id-headers", "policy.gateway_unsupported"),
    ],
)
def test_options_the_gateway_owns_or_lacks_are_refused(extra: str, rule: str) -> None:
    with pytest.raises(PolicyError) as caught:
        _request(extras=(extra,))
    assert caught.value.rule == rule
    assert _request("--gateway=off", extras=(extra,)).gateway is False  # direct mode: as before


@pytest.mark.parametrize(
    ("flags", "extras", "rule"),
    [
        (["--gateway=off", "--api-key-env=KILN_K"], (), "launcher.gateway_off_key"),
        (["--api-key-env=KILN_K"], (f"--api-key={KEY}",), "launcher.api_key_twice"),
        (["--api-key-env=TEACHER_KEY"], (), "launcher.value"),
        (["--api-key-env=kiln_k"], (), "launcher.value"),
    ],
)
def test_key_flags_fail_closed(flags: list[str], extras: tuple[str, ...], rule: str) -> None:
    with pytest.raises(InputError) as caught:
        _request(*flags, extras=extras)
    assert caught.value.rule == rule
    assert KEY not in str(caught.value)


def test_vllm_gets_the_socket_and_no_address_or_key() -> None:
    extras = ("--host=0.0.0.0", "--port=9000", f"--api-key={KEY}", "--disable-log-stats",
              "--uvicorn-log-level=warning", "--dtype=float32")  # fmt: skip
    on = _request(extras=extras)
    assert vllm_transport(on, "/tmp/kiln-1-x/vllm.sock") == (
        "--uvicorn-log-level=warning", "--uds=/tmp/kiln-1-x/vllm.sock",
    )  # fmt: skip
    off = _request("--gateway=off", extras=extras)
    assert vllm_transport(off, None) == off.vllm_options.transport


def test_the_gateway_command_names_the_variable_never_the_key() -> None:
    request = _request("--api-key-env=KILN_TEACHER_KEY", extras=("--port=9001",))
    front = gateway_front(
        request, {"KILN_TEACHER_KEY": KEY}, uds="/tmp/k/vllm.sock", python="/py",
        base_alias="kiln-base-0123456789abcdef", stop_grace=15.0,
    )  # fmt: skip
    assert front.argv == (
        "/py", "-m", "kiln_registry.gateway", "--host=127.0.0.1", "--port=9001",
        "--upstream-uds=/tmp/k/vllm.sock", "--served-model-id=teacher", "--max-model-len=64",
        "--max-top-k=8", "--drain-seconds=14", "--base-alias=kiln-base-0123456789abcdef",
        f"--api-key-env={GATEWAY_KEY_VARIABLE}",
    )  # fmt: skip
    assert front.env[GATEWAY_KEY_VARIABLE] == KEY
    assert set(front.env) == {"PATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH", GATEWAY_KEY_VARIABLE}
    assert KEY not in repr(front)
    assert (front.target.host, front.target.port) == ("127.0.0.1", 9001)


def test_a_key_from_api_key_goes_to_the_gateways_environment() -> None:
    front = gateway_front(_request(extras=(f"--api-key={KEY}",)), {}, uds="/s", python="/py",
                          base_alias=None, stop_grace=2.0)  # fmt: skip
    assert front.env[GATEWAY_KEY_VARIABLE] == KEY
    assert not any(KEY in token for token in front.argv)
    assert "--drain-seconds=1" in front.argv
    without = gateway_front(_request(), {}, uds="/s", python="/py", base_alias=None,
                            stop_grace=2.0)  # fmt: skip
    assert GATEWAY_KEY_VARIABLE not in without.env
    assert not any(token.startswith("--api-key-env") for token in without.argv)


@pytest.mark.parametrize("env", [{}, {"KILN_K": ""}, {"KILN_K": "two words"}])
def test_an_unusable_key_variable_is_refused_without_echo(env: dict[str, str]) -> None:
    with pytest.raises(InputError) as caught:
        gateway_front(_request("--api-key-env=KILN_K"), env, uds="/s", python="/py",
                      base_alias=None, stop_grace=2.0)  # fmt: skip
    assert caught.value.rule in ("launcher.api_key_env", "launcher.api_key")
    assert "words" not in str(caught.value)


def test_the_boundary_is_described() -> None:
    assert boundary_document(_request("--gateway=off"))["mode"] == "vllm"
    on = boundary_document(_request("--api-key-env=KILN_K", extras=("--host=::1",)))
    assert on["mode"] == "gateway"
    assert on["listen"] == "http://[::1]:8000"
    assert on["api_key"] == "checked by the gateway (from KILN_K)"
    assert boundary_document(_request())["api_key"] == "none"


def test_the_gateway_listens_on_loopback_unless_told_otherwise() -> None:
    keyed = _request("--api-key-env=KILN_K")
    front = gateway_front(keyed, {"KILN_K": KEY}, uds="/s", python="/py", base_alias=None,
                          stop_grace=2.0)  # fmt: skip
    assert "--host=127.0.0.1" in front.argv
    assert "warning" not in boundary_document(keyed)
    wide = _request("--api-key-env=KILN_K", extras=("--host=0.0.0.0",))
    front = gateway_front(wide, {"KILN_K": KEY}, uds="/s", python="/py", base_alias=None,
                          stop_grace=2.0)  # fmt: skip
    assert "--host=0.0.0.0" in front.argv
    assert "plain HTTP" in str(boundary_document(wide)["warning"])
    open_wide = boundary_document(_request(extras=("--host=192.0.2.7",)))
    assert "without an API key" in str(open_wide["warning"])
