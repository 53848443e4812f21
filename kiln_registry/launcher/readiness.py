"""Readiness and the listening address of a supervised server.

Owns ``HealthTarget`` (a TCP host and port, or a Unix socket), ``health_ok``
(``GET /health`` over plain HTTP with ``http.client``, which never uses a
proxy, until 200) and ``check_port_free`` (refuse a launch whose address is
already taken, before anything is staged).  ``launcher.supervisor`` polls
it; it knows nothing about vLLM or identities.

Imports: standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import http.client
import os
import socket
from dataclasses import dataclass

from kiln_registry.domain.errors import LauncherError

HEALTH_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class HealthTarget:
    """Where ``GET /health`` is polled: a TCP host and port, or a Unix socket."""

    host: str = "127.0.0.1"
    port: int = 8000
    uds: str | None = None

    @property
    def url(self) -> str:
        if self.uds is not None:
            return f"http+unix://{self.uds}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def health_ok(target: HealthTarget, timeout: float = HEALTH_TIMEOUT_SECONDS) -> bool:
    """True when ``GET /health`` answers 200 (http.client never uses a proxy)."""
    connection: http.client.HTTPConnection
    if target.uds is not None:
        connection = _UnixConnection(target.uds, timeout)
    else:
        connection = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        response.read(65536)
        return response.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def check_port_free(target: HealthTarget, bind_host: str | None) -> None:
    """Refuse a launch whose listening address is already taken (before staging)."""
    if target.uds is not None:
        if os.path.lexists(target.uds):
            raise LauncherError(f"--uds {target.uds} already exists", rule="launcher.port_in_use")
        return
    host = bind_host or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, target.port))
        except OSError as exc:
            raise LauncherError(
                f"port {target.port} on {host} is not available ({exc.strerror})",
                rule="launcher.port_in_use",
                hint="stop the other server or pass another --port after '--'",
            ) from None
