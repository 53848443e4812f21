"""Remote registration rules as Kiln's server applies them (teacher URL, bind host).

Facts from ericflo/kiln:

* ``crates/kiln-train/src/remote_teacher.rs`` ``normalize_vllm_completions_url``
  parses ``reqwest::Url::parse(url.trim())``: white space around a teacher URL
  (Rust's ``str::trim``, Unicode White_Space) is not part of it; its test
  ``remote_registration_requires_explicit_supported_provider_and_valid_url``
  (``crates/kiln-server/src/api/teachers.rs``) accepts
  ``http://127.0.0.1:8000`` and ``http://127.0.0.1:8080`` and refuses ``""``,
  ``"not a URL"`` and a URL with a query.
* ``crates/kiln-server/src/api/teachers.rs`` ``validate_remote_registration_exposure``
  refuses a credential-free remote teacher unless
  ``crate::api::terminal::bind_host_is_loopback()``, which is exactly
  ``matches!(host, "127.0.0.1" | "localhost" | "::1" | "[::1]")``
  (``crates/kiln-server/src/api/terminal.rs``); its test
  ``credentialless_loopback_teacher_is_rejected_when_kiln_is_network_bound``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kiln_registry.credentials.origin import kiln_loopback_bind_host, parse_teacher_url
from kiln_registry.credentials.resolve import resolve_teacher_endpoint
from kiln_registry.domain.errors import RegistrationInvalid
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of, remote, run_registry, write_config
from tests.helpers import serve_reference_teacher

SERVED = "teacher-tiny"


@pytest.mark.parametrize(
    "padded",
    [" {}", "{} ", "\t{}\n", "\r\n{}\x0b\x0c", "\u00a0{}\u3000", "\u2028{}\u2029\u202f\u205f"],
)
def test_white_space_around_a_teacher_url_is_trimmed(padded: str) -> None:
    for url in ("http://127.0.0.1:8000", "http://127.0.0.1:8080"):
        endpoint = parse_teacher_url(padded.format(url))
        assert endpoint.url == url and endpoint.completions_url == url + "/v1/completions"


@pytest.mark.parametrize(
    "url", ["", "   ", "not a URL", "http://vllm.local?mode=test", "http://127.0.0.1:8000/a b"]
)
def test_urls_kiln_refuses_are_refused(url: str) -> None:
    with pytest.raises(RegistrationInvalid):
        parse_teacher_url(url)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("127.0.0.2", False),  # loopback to the OS, not in Kiln's list
        ("LOCALHOST", False),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
    ],
)
def test_credential_free_teachers_follow_kilns_bind_host_list(host: str, loopback: bool) -> None:
    assert kiln_loopback_bind_host(host) is loopback

    def resolve() -> object:
        return resolve_teacher_endpoint(
            "http://127.0.0.1:8000", None, credentials={}, server_host=host
        )

    if loopback:
        resolve()
        return
    with pytest.raises(RegistrationInvalid) as info:
        resolve()
    assert info.value.rule == "credential.loopback_server_required"


@pytest.fixture(scope="module")
def teacher_url(tiny_model: TinyModel) -> Iterator[str]:
    with serve_reference_teacher(tiny_model.path, SERVED) as url:
        yield url


@pytest.fixture(scope="module")
def registry(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[RegistryServer]:
    config = write_config(tmp_path_factory.mktemp("registration"), student=tiny_model.path)
    with run_registry(config) as server:
        yield server


def test_a_padded_url_registers_as_the_trimmed_url(
    registry: RegistryServer, teacher_url: str
) -> None:
    with registry.client() as http:
        created = http.post("/v1/teachers", json=remote("padded", f" \t{teacher_url}\n "))
        assert created.status_code == 200, created.text
        assert created.json()["spec"]["url"] == teacher_url
        assert created.json()["status"] == "verified"
        blank = http.post("/v1/teachers", json=remote("blank", " \u3000 "))
        assert blank.status_code == 400
        assert error_of(blank)["code"] == "teacher_registration_invalid"
