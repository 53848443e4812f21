"""SecretHandle and start-up checks: fail closed, never reveal a value."""

from __future__ import annotations

import os
import pickle
import traceback

import pytest

from kiln_registry.credentials import SecretHandle, check_environment_variable
from kiln_registry.credentials.secrets import MAX_SECRET_LENGTH, secret_problem
from kiln_registry.domain.errors import CredentialError

VAR = "KILN_TEST_TEACHER_KEY"
SECRET = "sk-test-0123456789abcdef"


@pytest.fixture
def handle(monkeypatch: pytest.MonkeyPatch) -> SecretHandle:
    monkeypatch.delenv(VAR, raising=False)
    return SecretHandle(credential_id="primary-vllm", env_name=VAR)


def _all_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + repr(exc.args)


def test_read_returns_the_value_at_call_time(
    handle: SecretHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VAR, SECRET)
    assert handle.read() == SECRET
    monkeypatch.setenv(VAR, SECRET + "-rotated")
    assert handle.read() == SECRET + "-rotated"


def test_missing_variable_fails_closed_naming_it(handle: SecretHandle) -> None:
    with pytest.raises(CredentialError) as caught:
        handle.read()
    assert caught.value.rule == "secret.missing"
    assert VAR in caught.value.message
    assert "primary-vllm" in caught.value.message


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("", "secret.blank"),
        ("   ", "secret.blank"),
        ("\t\n ", "secret.blank"),
        (" sk-padded", "secret.header_unsafe"),
        ("sk-padded ", "secret.header_unsafe"),
        ("sk-line\nbreak", "secret.header_unsafe"),
        ("sk-\x7fdel", "secret.header_unsafe"),
        ("sk-clé", "secret.header_unsafe"),
        ("x" * (MAX_SECRET_LENGTH + 1), "secret.too_long"),
    ],
)
def test_unusable_values_fail_closed_without_the_value(
    handle: SecretHandle, monkeypatch: pytest.MonkeyPatch, value: str, rule: str
) -> None:
    monkeypatch.setenv(VAR, value)
    with pytest.raises(CredentialError) as caught:
        handle.read()
    assert caught.value.rule == rule
    assert VAR in caught.value.message
    if value.strip():
        assert value.strip() not in _all_text(caught.value)


def test_undecodable_bytes_fail_closed(
    handle: SecretHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    # os.environb writes raw bytes; os.environ then holds lone surrogates.
    monkeypatch.setitem(os.environb, VAR.encode(), b"sk-\xff\xfe-rawbytes")
    assert "\udcff" in os.environ[VAR]
    with pytest.raises(CredentialError) as caught:
        handle.read()
    assert caught.value.rule == "secret.not_unicode"
    assert "rawbytes" not in _all_text(caught.value)
    with pytest.raises(CredentialError):
        check_environment_variable(VAR)


def test_a_space_inside_the_value_is_allowed(
    handle: SecretHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VAR, "two words")
    assert handle.read() == "two words"


def test_repr_str_and_pickle_never_hold_the_value(
    handle: SecretHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VAR, SECRET)
    handle.read()
    for text in (repr(handle), str(handle), f"{handle}", repr([handle])):
        assert SECRET not in text
        assert VAR in text
    assert SECRET.encode() not in pickle.dumps(handle)
    assert not hasattr(handle, "value")
    assert repr(handle) == f"SecretHandle(credential_id='primary-vllm', env_name='{VAR}')"


def test_handle_is_frozen_and_has_no_value_slot(handle: SecretHandle) -> None:
    with pytest.raises(AttributeError):
        handle.env_name = "OTHER"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        handle.value = SECRET  # type: ignore[attr-defined]


def test_check_fails_like_read(handle: SecretHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CredentialError) as caught:
        handle.check()
    assert caught.value.rule == "secret.missing"
    assert "primary-vllm" in caught.value.message
    monkeypatch.setenv(VAR, SECRET)
    handle.check()


def test_an_explicit_environment_mapping_is_honoured(handle: SecretHandle) -> None:
    assert handle.read({VAR: SECRET}) == SECRET
    with pytest.raises(CredentialError):
        handle.read({})


@pytest.mark.parametrize(
    "name", ["", "1ABC", "A-B", "A B", "sk-live-0123", "Ä", "A" * 129, "A=B", "A\x00"]
)
def test_invalid_variable_names_are_refused_without_echo(name: str) -> None:
    with pytest.raises(CredentialError) as caught:
        check_environment_variable(name, {})
    assert caught.value.rule == "secret.env_name"
    if name:
        assert name not in caught.value.message
    with pytest.raises(CredentialError):
        SecretHandle(credential_id="x", env_name=name)


@pytest.mark.parametrize("name", ["A", "_", "a_b", "KILN_VLLM_API_KEY", "A" * 128])
def test_valid_variable_names_are_checked_for_a_value(name: str) -> None:
    check_environment_variable(name, {name: SECRET})
    with pytest.raises(CredentialError) as caught:
        check_environment_variable(name, {})
    assert caught.value.rule == "secret.missing"
    assert name in caught.value.message


def test_secret_problem_describes_without_the_value() -> None:
    assert secret_problem(SECRET) is None
    problem = secret_problem(" " + SECRET)
    assert problem is not None
    assert SECRET not in problem[1]
