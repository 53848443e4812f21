"""Gateway settings and the flags of ``python -m kiln_registry.gateway``.

Owns ``GatewayConfig`` (what one gateway enforces) and ``parse_gateway_argv``
(the entry point's flags: each exactly ``--name=value``, known names only,
canonical integers, each at most once).  The API key never travels in argv:
``--api-key-env=NAME`` names the variable the key is read from at start, and
the key lives only in ``GatewayConfig.api_key`` (left out of ``repr``).

Defaults: the request body bound is ``16 * max_model_len + 64 KiB`` (a token
id list with up to 15 digits per id), clamped to 1..256 MiB; 64 requests in
flight; 256 proven client connections (ones whose request passed the key
check) and, apart from them, 64 unproven ones (no such request yet), of which
one at least 1 s old is closed to make room for a newcomer; 10 s for an
unproven connection's head; 600 s for an upstream answer; 75 s for
an idle proven connection; 15 s to drain on SIGTERM.

``is_loopback_host`` and ``exposure_warning``: what the gateway (and the
launcher) says when it listens beyond loopback: with a key, that the key
travels in plain HTTP; without one, that anyone who reaches the port may use it.

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kiln_registry.domain.errors import InputError

MIN_REQUEST_BODY = 1 << 20
MAX_REQUEST_BODY = 256 << 20
MAX_KEY_BYTES = 4096
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
_INT = re.compile(r"0|[1-9][0-9]{0,9}")
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,255}")


def default_body_bytes(max_model_len: int) -> int:
    return max(MIN_REQUEST_BODY, min(MAX_REQUEST_BODY, max_model_len * 16 + 65536))


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """What one gateway listens on, forwards to and enforces."""

    host: str
    port: int
    upstream_uds: str
    served_model_id: str
    max_model_len: int
    max_top_k: int
    base_alias: str | None = None
    api_key: bytes | None = field(default=None, repr=False)
    max_body_bytes: int = 0  # 0: default_body_bytes(max_model_len)
    max_concurrent: int = 64
    max_connections: int = 256
    max_unproven: int = 64
    upstream_timeout: float = 600.0
    idle_timeout: float = 75.0
    head_timeout: float = 10.0
    evict_after: float = 1.0  # an unproven connection younger than this is never closed early
    drain_seconds: float = 15.0

    @property
    def body_limit(self) -> int:
        return self.max_body_bytes or default_body_bytes(self.max_model_len)


_INT_FLAGS: Mapping[str, tuple[int, int]] = {
    "port": (0, 65535),
    "max-model-len": (1, 16_777_216),
    "max-top-k": (0, 65_536),
    "max-body-bytes": (1, MAX_REQUEST_BODY),
    "max-concurrent": (1, 65_536),
    "max-connections": (1, 65_536),
    "max-unproven-connections": (1, 65_536),
    "head-timeout": (1, 3_600),
    "upstream-timeout": (1, 86_400),
    "drain-seconds": (1, 86_400),
}
_TEXT_FLAGS = frozenset({"host", "upstream-uds", "served-model-id", "base-alias", "api-key-env"})
_REQUIRED = ("host", "port", "upstream-uds", "served-model-id", "max-model-len", "max-top-k")


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (names are never resolved)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, *, keyed: bool) -> str | None:
    """What to warn about when the gateway listens on ``host`` (None on loopback)."""
    if is_loopback_host(host):
        return None
    if keyed:
        return (
            f"the gateway listens on {host} in plain HTTP: the API key crosses the network "
            "unencrypted; terminate TLS in front of it or listen on 127.0.0.1"
        )
    return (
        f"the gateway listens on {host} without an API key: anyone who reaches the port "
        "may use the teacher; give --api-key-env or listen on 127.0.0.1"
    )


def gateway_argv(config: GatewayConfig, *, api_key_env: str | None) -> list[str]:
    """The entry point's flags for ``config`` (the key itself is never in them)."""
    argv = [
        f"--host={config.host}",
        f"--port={config.port}",
        f"--upstream-uds={config.upstream_uds}",
        f"--served-model-id={config.served_model_id}",
        f"--max-model-len={config.max_model_len}",
        f"--max-top-k={config.max_top_k}",
        f"--drain-seconds={max(1, int(config.drain_seconds))}",
    ]
    if config.base_alias is not None:
        argv.append(f"--base-alias={config.base_alias}")
    if api_key_env is not None:
        argv.append(f"--api-key-env={api_key_env}")
    return argv


def parse_gateway_argv(argv: Sequence[str], env: Mapping[str, str]) -> GatewayConfig:
    """Parse the entry point's flags; the key is read from the named variable."""
    flags = _flags(argv)
    missing = [f"--{name}" for name in _REQUIRED if name not in flags]
    if missing:
        raise InputError(f"missing gateway flag(s): {', '.join(missing)}", rule="gateway.flag")
    for name in ("served-model-id", "base-alias"):
        if name in flags and not _MODEL_ID.fullmatch(flags[name]):
            raise InputError(f"--{name} is not a served model id", rule="gateway.flag")
    if not flags["upstream-uds"].startswith("/"):
        raise InputError("--upstream-uds must be an absolute path", rule="gateway.flag")
    ints = {name: _int(name, flags[name]) for name in _INT_FLAGS if name in flags}
    return GatewayConfig(
        host=flags["host"],
        port=ints["port"],
        upstream_uds=flags["upstream-uds"],
        served_model_id=flags["served-model-id"],
        base_alias=flags.get("base-alias"),
        max_model_len=ints["max-model-len"],
        max_top_k=ints["max-top-k"],
        api_key=_key(flags.get("api-key-env"), env),
        max_body_bytes=ints.get("max-body-bytes", 0),
        max_concurrent=ints.get("max-concurrent", 64),
        max_connections=ints.get("max-connections", 256),
        max_unproven=ints.get("max-unproven-connections", 64),
        head_timeout=float(ints.get("head-timeout", 10)),
        upstream_timeout=float(ints.get("upstream-timeout", 600)),
        drain_seconds=float(ints.get("drain-seconds", 15)),
    )


def _flags(argv: Sequence[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    for index, token in enumerate(argv):
        name, sep, value = token.partition("=")
        name = name.removeprefix("--") if token.startswith("--") else ""
        if name not in _INT_FLAGS and name not in _TEXT_FLAGS:
            raise InputError(
                f"gateway argument #{index + 1} is not a gateway flag", rule="gateway.flag"
            )
        if not sep or not value or any(c in value for c in "\x00\r\n"):
            raise InputError(
                f"--{name} needs one non-empty --{name}=VALUE token", rule="gateway.flag"
            )
        if name in flags:
            raise InputError(f"--{name} is given twice", rule="gateway.flag")
        flags[name] = value
    return flags


def _int(name: str, text: str) -> int:
    low, high = _INT_FLAGS[name]
    if not _INT.fullmatch(text) or not low <= int(text) <= high:
        raise InputError(f"--{name} must be a whole number in {low}..={high}", rule="gateway.flag")
    return int(text)


def _key(name: str | None, env: Mapping[str, str]) -> bytes | None:
    if name is None:
        return None
    if not _ENV_NAME.fullmatch(name):
        raise InputError(
            "--api-key-env must name an upper-case environment variable", rule="gateway.api_key"
        )
    value = env.get(name)
    if not value:
        raise InputError(f"the API key variable {name} is unset or empty", rule="gateway.api_key")
    key = value.encode("utf-8", "surrogateescape")
    if len(key) > MAX_KEY_BYTES or not all(0x21 <= byte <= 0x7E for byte in key):
        raise InputError(
            f"the API key in {name} must be 1..{MAX_KEY_BYTES} visible ASCII characters",
            rule="gateway.api_key",
        )
    return key
