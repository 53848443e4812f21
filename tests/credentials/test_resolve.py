"""resolve_teacher_endpoint: credential-origin binding and loopback-only rules."""

from __future__ import annotations

import pytest

from kiln_registry.config.settings import CredentialConfig
from kiln_registry.credentials import ResolvedTeacher, resolve_teacher_endpoint
from kiln_registry.domain.errors import CredentialError, RegistrationInvalid

VAR = "KILN_TEST_RESOLVE_KEY"
SECRET = "sk-resolve-secret-42"
CREDENTIALS = {
    "primary-vllm": CredentialConfig(origin="https://teacher.example.com:8443", api_key_env=VAR),
    "plain": CredentialConfig(origin="https://plain.example.com", api_key_env=VAR),
}


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, SECRET)


def resolve(url: str, credential_id: str | None, server_host: str = "127.0.0.1") -> ResolvedTeacher:
    return resolve_teacher_endpoint(
        url, credential_id, credentials=CREDENTIALS, server_host=server_host
    )


@pytest.mark.parametrize("server_host", ["127.0.0.1", "[::1]", "::1", "localhost"])
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://localhost:8000/v1",
        "http://127.0.0.2:9",
        "https://127.0.0.1",
    ],
)
def test_credential_free_loopback_teacher_on_loopback_server(url: str, server_host: str) -> None:
    resolved = resolve(url, None, server_host)
    assert resolved.secret is None
    assert resolved.endpoint.is_loopback


@pytest.mark.parametrize(
    "url",
    [
        "https://teacher.example.com:8443",
        "https://10.0.0.5",
        "https://[2001:db8::1]",
        "https://[::1]",
    ],
)
def test_credential_free_teacher_must_be_loopback(url: str) -> None:
    with pytest.raises(RegistrationInvalid) as caught:
        resolve(url, None)
    assert caught.value.rule == "credential.loopback_url_required"
    assert "a credential-free teacher must use a loopback URL" in caught.value.message


@pytest.mark.parametrize(
    "server_host", ["0.0.0.0", "::", "192.168.1.10", "registry.internal", "127.0.0.2"]
)
def test_credential_free_teacher_needs_a_loopback_server(server_host: str) -> None:
    with pytest.raises(RegistrationInvalid) as caught:
        resolve("http://127.0.0.1:8000", None, server_host)
    assert caught.value.rule == "credential.loopback_server_required"
    assert caught.value.message == (
        f"the server is bound to {server_host}; credential-free teachers need a server"
        " bound to 127.0.0.1, localhost or ::1 (the hosts Kiln counts as loopback)"
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://teacher.example.com:8443",
        "https://teacher.example.com:8443/",
        "https://Teacher.Example.COM:8443/v1",
        "HTTPS://teacher.example.com:8443/v1/completions",
    ],
)
def test_credential_binds_the_exact_origin(url: str) -> None:
    resolved = resolve(url, "primary-vllm", server_host="0.0.0.0")
    assert resolved.endpoint.origin == "https://teacher.example.com:8443"
    assert resolved.endpoint.completions_url == "https://teacher.example.com:8443/v1/completions"
    assert resolved.secret is not None
    assert resolved.secret.env_name == VAR
    assert resolved.secret.read() == SECRET
    assert SECRET not in repr(resolved)


def test_default_port_matches_an_origin_without_port() -> None:
    resolved = resolve("https://plain.example.com:443/v1", "plain")
    assert resolved.endpoint.origin == "https://plain.example.com"


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://teacher.example.com", "https://teacher.example.com"),
        ("https://teacher.example.com:8444", "https://teacher.example.com:8444"),
        ("https://other.example.com:8443", "https://other.example.com:8443"),
        ("https://sub.teacher.example.com:8443", "https://sub.teacher.example.com:8443"),
        ("http://127.0.0.1:8443", "http://127.0.0.1:8443"),
    ],
)
def test_origin_mismatch_is_refused(url: str, origin: str) -> None:
    with pytest.raises(CredentialError) as caught:
        resolve(url, "primary-vllm")
    assert caught.value.rule == "credential.origin_mismatch"
    assert caught.value.message == (
        "credential 'primary-vllm' is for origin https://teacher.example.com:8443 "
        f"but the URL's origin is {origin}"
    )


def test_unknown_credential_id_is_refused() -> None:
    with pytest.raises(CredentialError) as caught:
        resolve("https://teacher.example.com:8443", "nope")
    assert caught.value.rule == "credential.unknown"
    assert "'nope'" in caught.value.message
    assert "plain, primary-vllm" in caught.value.message


def test_a_long_unknown_id_is_shown_truncated() -> None:
    with pytest.raises(CredentialError) as caught:
        resolve("https://teacher.example.com:8443", "x" * 5000)
    assert len(caught.value.message) < 300


@pytest.mark.parametrize("value", [None, "", "   "])
def test_the_secret_variable_is_checked_again_when_resolving(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(VAR)
    else:
        monkeypatch.setenv(VAR, value)
    with pytest.raises(CredentialError) as caught:
        resolve("https://teacher.example.com:8443", "primary-vllm")
    assert caught.value.rule in ("secret.missing", "secret.blank")
    assert VAR in caught.value.message


def test_an_explicit_environment_is_used_for_the_check() -> None:
    with pytest.raises(CredentialError):
        resolve_teacher_endpoint(
            "https://teacher.example.com:8443",
            "primary-vllm",
            credentials=CREDENTIALS,
            server_host="127.0.0.1",
            environ={},
        )


def test_bad_urls_are_registration_errors_even_with_a_credential() -> None:
    with pytest.raises(RegistrationInvalid) as caught:
        resolve("https://teacher.example.com:8443/v1?key=1", "primary-vllm")
    assert caught.value.rule == "url.query"
