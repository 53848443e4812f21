"""Canonical teacher origins and teacher endpoint URLs (Kiln's rules).

Owns two parsers.  ``canonical_origin`` checks that a configured credential
origin is *already* in its one canonical spelling (``scheme://host[:port]``,
lowercase, IDNA A-labels, no default port, no path, compressed bracketed
IPv6) and refuses it otherwise, naming the rule.  ``parse_teacher_url``
parses a registration URL leniently about case and default ports, strictly
about everything else, and derives the ``/v1/completions`` endpoint from it.

Both follow Kiln (``crates/kiln-server/src/config.rs``
``TeacherCredentialConfig``, ``crates/kiln-train/src/remote_teacher.rs``
``normalize_vllm_completions_url``): ``https`` anywhere, plain ``http``
only to a Kiln loopback host, which is ``localhost`` or an IPv4 address in
127.0.0.0/8.  Kiln compares the URL's bracketed host text, so ``[::1]`` is
not loopback there and is not here either (``kiln_loopback_host``);
``is_loopback_host`` keeps a wider meaning (any 127.0.0.0/8 address, ``::1``);
``kiln_loopback_bind_host`` is Kiln's exact list for the server's own bind
host.  A teacher URL's surrounding white space is trimmed (``trim_url``), as
Kiln trims it.

Neither function resolves names, opens sockets or reads the environment.  Error messages
never echo a whole URL, because its userinfo or query could hold a secret.
Imports: standard library, ``idna`` (already required by httpx) and
``kiln_registry.domain.errors``; never httpx, the database or FastAPI.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import idna

from kiln_registry.domain.errors import ConfigError, RegistrationInvalid

MAX_URL_LENGTH = 2048
MAX_ORIGIN_LENGTH = 300
MAX_HOST_LENGTH = 253
DEFAULT_PORTS = {"http": 80, "https": 443}

_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_NUMERIC_LABEL_RE = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
_PATH_RE = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/-]*")
_DELIMITERS = "/?#\\"

_Fail = Callable[[str, str], NoReturn]
# Rust's ``str::trim`` (Unicode White_Space), which Kiln applies to a teacher URL.
RUST_WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# Kiln's ``bind_host_is_loopback`` (api/terminal.rs): the exact host texts it counts.
KILN_LOOPBACK_BIND_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def trim_url(url: str) -> str:
    """``url`` without surrounding white space, as Kiln's ``url.trim()`` leaves it."""
    return url.strip(RUST_WHITE_SPACE)


def _origin_fail(rule: str, message: str) -> NoReturn:
    raise ConfigError(
        f"origin {message}",
        rule=f"origin.{rule}",
        hint="write the origin exactly as https://host[:port] (http:// only for localhost or"
        " 127.0.0.0/8) in its canonical form",
    )


def _url_fail(rule: str, message: str) -> NoReturn:
    raise RegistrationInvalid(f"teacher url {message}", rule=f"url.{rule}")


@dataclass(frozen=True, slots=True)
class _RawUrl:
    """A URL split into its written parts; nothing normalised yet."""

    scheme: str
    host: str
    bracketed: bool
    port_text: str | None
    path: str


@dataclass(frozen=True, slots=True)
class TeacherEndpoint:
    """Where a teacher is reached; ``url`` is kept as given, surrounding white space trimmed.

    ``host`` is the canonical host without IPv6 brackets, ``port`` the
    effective port (the scheme's default when none was written) and
    ``origin`` the canonical ``scheme://host[:port]``.
    """

    url: str
    scheme: str
    host: str
    port: int
    origin: str
    completions_url: str
    is_loopback: bool


def _split_url(text: str, fail: _Fail, max_length: int) -> _RawUrl:
    if len(text) > max_length:
        fail("length", f"is longer than {max_length} characters")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in text):
        fail("characters", "contains white space or control characters")
    scheme, sep, rest = text.partition("://")
    if not sep or not _SCHEME_RE.fullmatch(scheme):
        fail("scheme", "must start with a scheme and '://'")
    cut = min((i for i in (rest.find(d) for d in _DELIMITERS) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        fail("userinfo", "must not contain userinfo (user:password@)")
    if "?" in tail:
        fail("query", "must not contain a query ('?')")
    if "#" in tail:
        fail("fragment", "must not contain a fragment ('#')")
    if "\\" in tail:
        fail("path", "must not contain a backslash")
    host, bracketed, port_text = _split_authority(authority, fail)
    return _RawUrl(scheme, host, bracketed, port_text, tail)


def _split_authority(authority: str, fail: _Fail) -> tuple[str, bool, str | None]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            fail("ipv6_brackets", "has an unclosed '[' in its host")
        after = authority[end + 1 :]
        if after and not after.startswith(":"):
            fail("host", "has characters after the bracketed IPv6 address")
        return authority[1:end], True, (after[1:] if after else None)
    if "[" in authority or "]" in authority:
        fail("ipv6_brackets", "has a misplaced '[' or ']' in its host")
    if authority.count(":") > 1:
        fail("ipv6_brackets", "must write an IPv6 address in brackets, like [2001:db8::1]")
    host, sep, port_text = authority.partition(":")
    return host, False, (port_text if sep else None)


def _parse_port(port_text: str | None, fail: _Fail) -> int | None:
    if port_text is None:
        return None
    if not port_text.isascii() or not port_text.isdigit():
        fail("port", "must have a decimal port after ':' (or no ':' at all)")
    if port_text.startswith("0") or len(port_text) > 5 or not 1 <= int(port_text) <= 65535:
        fail("port", "port must be 1..65535 without leading zeros")
    return int(port_text)


def _ipv6_text(address: ipaddress.IPv6Address) -> str:
    """RFC 5952 / WHATWG form: lowercase hex, first longest zero run (>= 2) compressed."""
    pieces = [(address.packed[i] << 8) | address.packed[i + 1] for i in range(0, 16, 2)]
    best_start, best_len, start = -1, 1, -1
    for index, piece in enumerate([*pieces, 1]):
        if piece == 0 and start < 0:
            start = index
        elif piece != 0 and start >= 0:
            if index - start > best_len:
                best_start, best_len = start, index - start
            start = -1
    hexes = [format(piece, "x") for piece in pieces]
    if best_start < 0:
        return ":".join(hexes)
    head = ":".join(hexes[:best_start])
    tail = ":".join(hexes[best_start + best_len :])
    return f"{head}::{tail}"


def _normalize_ipv6(text: str, fail: _Fail) -> str:
    if "%" in text:
        fail("ipv6_form", "must not carry an IPv6 zone ('%')")
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        fail("ipv6_form", "has an invalid IPv6 address in brackets")
    return _ipv6_text(address)


def _check_a_labels(host: str, fail: _Fail) -> None:
    try:
        valid = idna.encode(idna.decode(host), uts46=True).decode("ascii") == host
    except (idna.IDNAError, UnicodeError):
        valid = False
    if not valid:
        fail("idna", "has an 'xn--' label that is not a valid IDNA A-label")


def _normalize_host(host: str, bracketed: bool, fail: _Fail) -> str:
    """The canonical host text (no brackets), or a refusal naming the rule."""
    if bracketed:
        return _normalize_ipv6(host, fail)
    if not host:
        fail("host", "has an empty host")
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            fail("idna", "has a host that is not a valid internationalized domain name")
    host = host.lower()
    if host.endswith("."):
        fail("trailing_dot", "must not end its host with a dot")
    if len(host) > MAX_HOST_LENGTH:
        fail("host", f"has a host longer than {MAX_HOST_LENGTH} characters")
    labels = host.split(".")
    if _NUMERIC_LABEL_RE.fullmatch(labels[-1]):
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            fail("ipv4_form", "must write an IPv4 host as four decimal octets, like 10.0.0.1")
    if not all(_LABEL_RE.fullmatch(label) for label in labels):
        fail("host", "has a host label that is not letters, digits and inner hyphens")
    if any(label.startswith("xn--") for label in labels):
        _check_a_labels(host, fail)
    return host


def _origin_text(scheme: str, host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" if port is None else f"{scheme}://{shown}:{port}"


def canonical_origin(text: str) -> str:
    """Return ``text`` if it is already a canonical teacher origin; refuse it otherwise.

    ``https://host[:port]``, or ``http://host[:port]`` for a Kiln loopback
    host (``localhost``, 127.0.0.0/8), as Kiln's ``[teachers.credentials]``
    allows.  Raises ``ConfigError`` with a rule such as ``origin.not_https``,
    ``origin.uppercase``, ``origin.default_port``, ``origin.path``,
    ``origin.trailing_dot``, ``origin.userinfo``, ``origin.idna`` or
    ``origin.ipv6_form``; the message suggests the canonical spelling when
    one exists.
    """
    raw = _split_url(text, _origin_fail, MAX_ORIGIN_LENGTH)
    scheme = raw.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        _origin_fail("not_https", "must use https:// (or http:// to localhost or 127.0.0.0/8)")
    port = _parse_port(raw.port_text, _origin_fail)
    host = _normalize_host(raw.host, raw.bracketed, _origin_fail)
    if scheme == "http" and not kiln_loopback_host(host):
        _origin_fail(
            "not_https", f"must use https:// for host {host!r} (http:// is for loopback only)"
        )
    default = DEFAULT_PORTS[scheme]
    suggestion = _origin_text(scheme, host, None if port == default else port)
    if raw.path:
        _origin_fail("path", f"must have no path, not even '/'; write {suggestion!r}")
    if port == default:
        _origin_fail("default_port", f"must omit the default port {default}; write {suggestion!r}")
    if not raw.host.isascii():
        _origin_fail("idna", f"must use the IDNA (punycode) host; write {suggestion!r}")
    if raw.scheme != scheme or raw.host.lower() != raw.host:
        _origin_fail("uppercase", f"must be lowercase; write {suggestion!r}")
    if raw.bracketed and raw.host != host:
        _origin_fail("ipv6_form", f"must use the compressed IPv6 form; write {suggestion!r}")
    if text != suggestion:  # a path the checks above cannot reach; kept as a guard
        _origin_fail("form", f"is not canonical; write {suggestion!r}")
    return text


def _completions_path(path: str) -> str:
    """Apply the endpoint derivation rules to an already-split URL path."""
    if not _PATH_RE.fullmatch(path):
        _url_fail("path", "path may only hold letters, digits and -._~!$&'()*+,;=:@/")
    if path.endswith("/"):
        path = path[:-1]
    segments = path.split("/")[1:]
    if any(segment in ("", ".", "..") for segment in segments):
        _url_fail("path", "path must not contain empty, '.' or '..' segments")
    if path.endswith("/v1/completions"):
        return path
    if path.endswith("/v1"):
        return path + "/completions"
    return path + "/v1/completions"


def parse_teacher_url(url: str) -> TeacherEndpoint:
    """Parse a teacher URL and derive its completions endpoint.

    Surrounding white space is trimmed first (Kiln: ``Url::parse(url.trim())``).
    Scheme and host case and the scheme's default port are normalised into
    ``origin``; userinfo, query, fragment, odd paths and ``http`` to a
    non-loopback host are refused (``RegistrationInvalid``, rule ``url.*``).
    """
    url = trim_url(url)
    raw = _split_url(url, _url_fail, MAX_URL_LENGTH)
    scheme = raw.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        _url_fail("scheme", "must use http:// or https://")
    port = _parse_port(raw.port_text, _url_fail)
    host = _normalize_host(raw.host, raw.bracketed, _url_fail)
    loopback = kiln_loopback_host(host)
    if scheme == "http" and not loopback:
        _url_fail(
            "http_not_loopback",
            f"uses plain http to host {host!r}; use https (plain http is for localhost and"
            " 127.0.0.0/8 only, as in Kiln)",
        )
    effective_port = DEFAULT_PORTS[scheme] if port is None else port
    origin = _origin_text(scheme, host, None if effective_port == DEFAULT_PORTS[scheme] else port)
    return TeacherEndpoint(
        url=url,
        scheme=scheme,
        host=host,
        port=effective_port,
        origin=origin,
        completions_url=origin + _completions_path(raw.path),
        is_loopback=loopback,
    )


def kiln_loopback_host(host: str) -> bool:
    """Kiln's teacher-URL loopback rule: exactly ``localhost`` or an IPv4 in 127.0.0.0/8.

    ``host`` is the canonical host text from ``_normalize_host`` (lowercase,
    no brackets).  IPv6 ``::1`` is not included: Kiln tests the URL's
    bracketed host text, which never parses as an address.
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.IPv4Address(host) in ipaddress.IPv4Network("127.0.0.0/8")
    except ValueError:
        return False


def kiln_loopback_bind_host(host: str) -> bool:
    """Whether Kiln counts a server bound to ``host`` as loopback-only.

    Exactly ``127.0.0.1``, ``localhost``, ``::1`` or ``[::1]`` (Kiln's
    ``bind_host_is_loopback``): ``127.0.0.2`` or ``LOCALHOST`` are not.
    """
    return host in KILN_LOOPBACK_BIND_HOSTS


def is_loopback_host(host: str) -> bool:
    """True for exactly ``localhost``, an IPv4 in 127.0.0.0/8 or IPv6 ``::1``.

    Brackets around an IPv6 literal are accepted; names are never resolved
    and the comparison is exact (``LOCALHOST`` and ``localhost.`` are not
    loopback here).
    """
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    if "%" in host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return address in ipaddress.IPv4Network("127.0.0.0/8")
    return address == ipaddress.IPv6Address("::1")
