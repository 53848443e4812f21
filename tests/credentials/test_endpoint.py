"""parse_teacher_url: endpoint derivation, origin normalisation and refusals."""

from __future__ import annotations

import pytest

from kiln_registry.credentials import TeacherEndpoint, parse_teacher_url
from kiln_registry.credentials.origin import MAX_URL_LENGTH
from kiln_registry.domain.errors import RegistrationInvalid

DERIVATION = [
    # (url, completions_url)
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1/completions"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1/completions"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/completions"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/completions"),
    ("http://127.0.0.1:8000/v1/completions", "http://127.0.0.1:8000/v1/completions"),
    ("http://127.0.0.1:8000/v1/completions/", "http://127.0.0.1:8000/v1/completions"),
    ("https://t.example.com/proxy", "https://t.example.com/proxy/v1/completions"),
    ("https://t.example.com/proxy/v1", "https://t.example.com/proxy/v1/completions"),
    ("https://t.example.com/a/v1/completions", "https://t.example.com/a/v1/completions"),
    ("https://t.example.com/v2", "https://t.example.com/v2/v1/completions"),
    ("https://t.example.com/xv1", "https://t.example.com/xv1/v1/completions"),
    ("https://t.example.com/v1/chat", "https://t.example.com/v1/chat/v1/completions"),
    ("https://t.example.com/team:a@b", "https://t.example.com/team:a@b/v1/completions"),
]


@pytest.mark.parametrize(("url", "completions"), DERIVATION)
def test_completions_url_derivation(url: str, completions: str) -> None:
    endpoint = parse_teacher_url(url)
    assert endpoint.completions_url == completions
    assert endpoint.url == url


NORMALISED = [
    # (url, scheme, host, port, origin, loopback)
    ("http://127.0.0.1:8000", "http", "127.0.0.1", 8000, "http://127.0.0.1:8000", True),
    ("http://127.9.9.9", "http", "127.9.9.9", 80, "http://127.9.9.9", True),
    ("HTTP://LocalHost:80/", "http", "localhost", 80, "http://localhost", True),
    # Kiln (crates/kiln-train/src/remote_teacher.rs) tests the bracketed host
    # text, so [::1] is not a loopback host for a teacher URL.
    ("https://[::1]:8000", "https", "::1", 8000, "https://[::1]:8000", False),
    ("https://localhost:443", "https", "localhost", 443, "https://localhost", True),
    ("https://T.Example.com:443/v1", "https", "t.example.com", 443, "https://t.example.com", False),
    (
        "https://t.example.com:8443",
        "https",
        "t.example.com",
        8443,
        "https://t.example.com:8443",
        False,
    ),
    ("https://t.example.com:80", "https", "t.example.com", 80, "https://t.example.com:80", False),
    (
        "https://bücher.example",
        "https",
        "xn--bcher-kva.example",
        443,
        "https://xn--bcher-kva.example",
        False,
    ),
    ("https://[2001:DB8:0::1]:9", "https", "2001:db8::1", 9, "https://[2001:db8::1]:9", False),
]


@pytest.mark.parametrize(("url", "scheme", "host", "port", "origin", "loopback"), NORMALISED)
def test_origin_is_normalised(
    url: str, scheme: str, host: str, port: int, origin: str, loopback: bool
) -> None:
    endpoint = parse_teacher_url(url)
    assert (endpoint.scheme, endpoint.host, endpoint.port) == (scheme, host, port)
    assert endpoint.origin == origin
    assert endpoint.is_loopback is loopback
    assert endpoint.completions_url.startswith(origin + "/")


REFUSED = [
    ("http://teacher.example.com", "url.http_not_loopback"),
    ("http://10.0.0.1:8000", "url.http_not_loopback"),
    ("http://0.0.0.0:8000", "url.http_not_loopback"),
    ("http://[::1]:8000", "url.http_not_loopback"),
    ("http://[0:0:0:0:0:0:0:1]", "url.http_not_loopback"),
    ("http://localhost.:8000", "url.trailing_dot"),
    ("ftp://127.0.0.1", "url.scheme"),
    ("ws://127.0.0.1", "url.scheme"),
    ("127.0.0.1:8000", "url.scheme"),
    ("http://user:pw@127.0.0.1:8000", "url.userinfo"),
    ("http://127.0.0.1:8000/v1?x=1", "url.query"),
    ("http://127.0.0.1:8000?", "url.query"),
    ("http://127.0.0.1:8000/v1#frag", "url.fragment"),
    ("http://127.0.0.1:8000\\v1", "url.path"),
    ("http://127.0.0.1:8000//v1", "url.path"),
    ("http://127.0.0.1:8000/v1//", "url.path"),
    ("http://127.0.0.1:8000/a/../v1", "url.path"),
    ("http://127.0.0.1:8000/./v1", "url.path"),
    ("http://127.0.0.1:8000/%761", "url.path"),
    ("http://127.0.0.1:8000/ü", "url.path"),
    ("http://127.0.0.1:8000/a b", "url.characters"),
    ("http://127.0.0.1:8000/\ta", "url.characters"),  # surrounding white space is trimmed
    ("http://127.0.0.1:", "url.port"),
    ("http://127.0.0.1:0", "url.port"),
    ("http://127.0.0.1:080", "url.port"),
    ("http://127.0.0.1:99999", "url.port"),
    ("http://::1:8000", "url.ipv6_brackets"),
    ("http://[::1%25lo]:8000", "url.ipv6_form"),
    ("http://127.1:8000", "url.ipv4_form"),
    ("http://0177.0.0.1", "url.ipv4_form"),
    ("http://", "url.host"),
    ("http://under_score", "url.host"),
    ("https://xn--zz.example", "url.idna"),
    ("http://127.0.0.1/" + "a" * MAX_URL_LENGTH, "url.length"),
]


@pytest.mark.parametrize(("url", "rule"), REFUSED)
def test_bad_teacher_urls_are_refused_naming_the_rule(url: str, rule: str) -> None:
    with pytest.raises(RegistrationInvalid) as caught:
        parse_teacher_url(url)
    assert caught.value.rule == rule
    assert caught.value.status == 400


@pytest.mark.parametrize(
    "url",
    [
        "https://user:s3cr3t-value@t.example.com/v1",
        "https://t.example.com/v1?api_key=s3cr3t-value",
        "https://t.example.com/v1#s3cr3t-value",
    ],
)
def test_refusals_never_echo_credentials_in_the_url(url: str) -> None:
    with pytest.raises(RegistrationInvalid) as caught:
        parse_teacher_url(url)
    assert "s3cr3t" not in caught.value.one_line()


def test_endpoint_is_frozen() -> None:
    endpoint = parse_teacher_url("http://127.0.0.1:8000")
    assert isinstance(endpoint, TeacherEndpoint)
    with pytest.raises(AttributeError):
        endpoint.completions_url = "http://evil.example/v1/completions"  # type: ignore[misc]


def test_a_url_at_the_length_bound_is_accepted() -> None:
    prefix = "http://127.0.0.1/"
    url = prefix + "a" * (MAX_URL_LENGTH - len(prefix))
    assert parse_teacher_url(url).completions_url.endswith("a/v1/completions")
