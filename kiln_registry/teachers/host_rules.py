"""``[server] teacher_hosts``: where registrations may send probes (issue 15, attack 3).

``check_teacher_host`` refuses a teacher URL whose host (and port, where the
pattern names one) matches none of the configured patterns, before anything
is resolved or sent.  Patterns: ``*`` (any host), ``name`` (exactly), a
``*.suffix`` (any sub-domain of ``suffix``, not ``suffix`` itself), or an
address (IPv6 in brackets), each optionally with ``:port``.

Unset (``teacher_host_patterns``): the loopback names ``localhost``,
``127.0.0.1`` and ``[::1]`` on any port, plus the exact host and port of each
configured credential origin (``[teachers.credentials.*] origin``), so a
registration cannot point the registry's probes at an arbitrary internal
service; ``"*"`` allows any host, as the old default did.  The check compares
names, not resolved addresses: confine by address with a pattern that names
addresses, or resolve names you trust.

Imports the standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Sequence

from kiln_registry.domain.errors import RegistrationInvalid

DEFAULT_PORTS = {"http": 80, "https": 443}
LOOPBACK_PATTERNS = ("localhost", "127.0.0.1", "[::1]")


def teacher_host_patterns(
    configured: Sequence[str] | None, credential_origins: Iterable[str]
) -> tuple[str, ...]:
    """``[server] teacher_hosts``, or when unset: loopback plus each credential origin."""
    if configured is not None:
        return tuple(configured)
    patterns = list(LOOPBACK_PATTERNS)
    for origin in credential_origins:  # canonical origins: scheme://host[:port], checked at load
        parts = urllib.parse.urlsplit(origin)
        host = (parts.hostname or "").lower()
        port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
        if host:
            patterns.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return tuple(patterns)


def _split(pattern: str) -> tuple[str, int | None]:
    if pattern.startswith("["):
        host, _, rest = pattern[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else None
    host, sep, port = pattern.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return pattern, None


def host_matches(pattern: str, host: str, port: int) -> bool:
    want_host, want_port = _split(pattern)
    if want_port is not None and want_port != port:
        return False
    if want_host == "*":
        return True
    if want_host.startswith("*."):
        return host.endswith(want_host[1:]) and len(host) > len(want_host) - 1
    return host == want_host


def check_teacher_host(url: str, patterns: Sequence[str] | None) -> None:
    """Refuse ``url`` unless its host matches one of ``patterns`` (None: any host)."""
    if patterns is None:
        return
    try:
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 0)
    except ValueError:
        host, port = "", 0
    if host and any(host_matches(pattern, host, port) for pattern in patterns):
        return
    raise RegistrationInvalid(
        "the teacher URL's host is not in [server] teacher_hosts (unset: loopback and the "
        "configured credential origins)",
        rule="teacher.host_not_allowed",
        hint="register a teacher on an allowed host, or ask the operator to add its host",
    )
