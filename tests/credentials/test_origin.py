"""canonical_origin: exact canonical origins only (Kiln's rules), each refusal named."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln_registry.credentials import canonical_origin, is_loopback_host
from kiln_registry.domain.errors import ConfigError

CANONICAL = [
    "https://teacher.example.com",
    "https://teacher.example.com:8443",
    "https://a",
    "https://localhost:1",
    "https://127.0.0.1",
    "https://10.0.0.1:65535",
    "https://[::1]",
    "https://[::1]:8443",
    "https://[2001:db8::1]",
    "https://[2001:db8:0:1:1:1:1:1]",
    "https://[2001:0:0:1::1]",
    "https://[::ffff:102:304]",
    "https://[::]",
    "https://xn--bcher-kva.example",
    "https://a-b.c-d.example:80",
    "https://" + "a" * 63 + ".example",
    # Kiln allows plain http for loopback origins (crates/kiln-server/src/config.rs,
    # TeacherCredentialConfig: "HTTPS is required unless the host is loopback").
    "http://127.0.0.1:8000",
    "http://127.0.0.1",
    "http://127.9.9.9:1",
    "http://localhost:8000",
]


@pytest.mark.parametrize("origin", CANONICAL)
def test_canonical_origins_are_returned_unchanged(origin: str) -> None:
    assert canonical_origin(origin) == origin


REFUSED = [
    # (origin, rule, suggestion or None)
    ("http://teacher.example.com", "origin.not_https", None),
    ("http://10.0.0.1:8000", "origin.not_https", None),
    ("http://[::1]:8000", "origin.not_https", None),
    ("http://127.0.0.1:80", "origin.default_port", "http://127.0.0.1"),
    ("http://127.0.0.1:8000/", "origin.path", "http://127.0.0.1:8000"),
    ("HTTP://127.0.0.1:8000", "origin.uppercase", "http://127.0.0.1:8000"),
    ("http://LOCALHOST:8000", "origin.uppercase", "http://localhost:8000"),
    ("ftp://teacher.example.com", "origin.not_https", None),
    ("teacher.example.com", "origin.scheme", None),
    ("https:teacher.example.com", "origin.scheme", None),
    ("//teacher.example.com", "origin.scheme", None),
    ("HTTPS://teacher.example.com", "origin.uppercase", "https://teacher.example.com"),
    ("https://Teacher.Example.com", "origin.uppercase", "https://teacher.example.com"),
    ("https://[::ABCD]", "origin.uppercase", "https://[::abcd]"),
    ("https://teacher.example.com:443", "origin.default_port", "https://teacher.example.com"),
    ("https://teacher.example.com/", "origin.path", "https://teacher.example.com"),
    ("https://teacher.example.com:8443/", "origin.path", "https://teacher.example.com:8443"),
    ("https://teacher.example.com/v1", "origin.path", "https://teacher.example.com"),
    ("https://teacher.example.com\\", "origin.path", None),
    ("https://teacher.example.com?", "origin.query", None),
    ("https://teacher.example.com/?a=b", "origin.query", None),
    ("https://teacher.example.com#", "origin.fragment", None),
    ("https://teacher.example.com#x", "origin.fragment", None),
    ("https://user@teacher.example.com", "origin.userinfo", None),
    ("https://user:pw@teacher.example.com", "origin.userinfo", None),
    ("https://teacher.example.com.", "origin.trailing_dot", None),
    ("https://teacher.example.com.:8443", "origin.trailing_dot", None),
    ("https://bücher.example", "origin.idna", "https://xn--bcher-kva.example"),
    ("https://BÜCHER.example", "origin.idna", "https://xn--bcher-kva.example"),
    ("https://xn--zz.example", "origin.idna", None),
    ("https://xn--a.example", "origin.idna", None),
    ("https://::1", "origin.ipv6_brackets", None),
    ("https://2001:db8::1", "origin.ipv6_brackets", None),
    ("https://[::1", "origin.ipv6_brackets", None),
    ("https://::1]", "origin.ipv6_brackets", None),
    ("https://[0:0:0:0:0:0:0:1]", "origin.ipv6_form", "https://[::1]"),
    ("https://[2001:db8:0:0:0:0:0:1]", "origin.ipv6_form", "https://[2001:db8::1]"),
    ("https://[2001:0db8::1]", "origin.ipv6_form", "https://[2001:db8::1]"),
    ("https://[2001:db8:0:1:1:1:1:1::]", "origin.ipv6_form", None),
    ("https://[::ffff:1.2.3.4]", "origin.ipv6_form", "https://[::ffff:102:304]"),
    ("https://[fe80::1%25eth0]", "origin.ipv6_form", None),
    ("https://[not-ipv6]", "origin.ipv6_form", None),
    ("https://[::1]x", "origin.host", None),
    ("https://127.1", "origin.ipv4_form", None),
    ("https://0x7f.0.0.1", "origin.ipv4_form", None),
    ("https://127.000.0.1", "origin.ipv4_form", None),
    ("https://1.2.3.256", "origin.ipv4_form", None),
    ("https://example.123", "origin.ipv4_form", None),
    ("https://", "origin.host", None),
    ("https://:8443", "origin.host", None),
    ("https://a_b.example", "origin.host", None),
    ("https://-a.example", "origin.host", None),
    ("https://a..example", "origin.host", None),
    ("https://" + "a" * 64 + ".example", "origin.host", None),
    ("https://teacher.example.com:", "origin.port", None),
    ("https://teacher.example.com:0", "origin.port", None),
    ("https://teacher.example.com:08443", "origin.port", None),
    ("https://teacher.example.com:65536", "origin.port", None),
    ("https://teacher.example.com:+1", "origin.port", None),
    ("https://teacher.example.com:８４４３", "origin.port", None),
    (" https://teacher.example.com", "origin.characters", None),
    ("https://teacher.example.com\n", "origin.characters", None),
    ("https://tea cher.example.com", "origin.characters", None),
    ("https://" + "a." * 200 + "example", "origin.length", None),
]


@pytest.mark.parametrize(("origin", "rule", "suggestion"), REFUSED)
def test_non_canonical_origins_are_refused_naming_the_rule(
    origin: str, rule: str, suggestion: str | None
) -> None:
    with pytest.raises(ConfigError) as caught:
        canonical_origin(origin)
    assert caught.value.rule == rule
    if suggestion is not None:
        assert repr(suggestion) in caught.value.message


def test_refusals_never_echo_userinfo() -> None:
    with pytest.raises(ConfigError) as caught:
        canonical_origin("https://user:hunter2-secret@teacher.example.com")
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in caught.value.one_line()


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.255.0.9", True),
        ("::1", True),
        ("[::1]", True),
        ("0:0:0:0:0:0:0:1", True),
        ("LOCALHOST", False),
        ("localhost.", False),
        ("localhost.example", False),
        ("128.0.0.1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("::ffff:127.0.0.1", False),
        ("::1%lo", False),
        ("127.1", False),
        ("", False),
        ("teacher.example.com", False),
    ],
)
def test_is_loopback_host_is_exact(host: str, expected: bool) -> None:
    assert is_loopback_host(host) is expected


@given(st.ip_addresses(v=6))
def test_every_ipv6_address_has_exactly_one_accepted_spelling(
    address: ipaddress.IPv6Address,
) -> None:
    exploded = f"https://[{address.exploded}]"
    try:
        canonical = canonical_origin(exploded)
    except ConfigError as exc:
        assert exc.rule == "origin.ipv6_form"
        match = re.search(r"write '([^']+)'", exc.message)
        assert match is not None
        canonical = match.group(1)
    assert canonical_origin(canonical) == canonical
    assert ipaddress.IPv6Address(canonical[len("https://[") : -1]) == address
    if address.ipv4_mapped is None:
        # Python's compressed form is RFC 5952's except for mapped IPv4.
        assert canonical == f"https://[{address.compressed}]"
