"""A port that is already taken is one ``kiln: error:`` line, before anything starts.

``ensure_port_free(host, port)`` binds (and closes) a socket the way uvicorn
binds its listener (``SO_REUSEADDR``; IPv6 for an IPv6 literal, else IPv4);
``EADDRINUSE`` or ``EACCES`` becomes a ``ConfigError`` naming the address and
what to do, instead of uvicorn's log line and exit status 1.  A port taken in
the instant between this check and uvicorn's bind still fails in uvicorn.
Imports the standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import errno
import socket

from kiln_registry.domain.errors import ConfigError


def ensure_port_free(host: str, port: int) -> None:
    # uvicorn's own choice: IPv6 when the host is an IPv6 literal, else IPv4.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except socket.gaierror as exc:
            raise ConfigError(
                f"cannot resolve the listen address {host!r} ({exc.strerror})",
                rule="server.host",
                hint="set [server] host to an address of this machine, or pass --host",
            ) from None
        except OSError as exc:
            _refuse(host, port, exc)


def _refuse(host: str, port: int, exc: OSError) -> None:
    if exc.errno == errno.EADDRINUSE:
        problem, rule = (
            "is already in use (another server is listening there)",
            "server.port_in_use",
        )
    elif exc.errno == errno.EACCES:
        problem, rule = "needs privileges this user lacks", "server.port_denied"
    else:
        problem, rule = f"cannot be bound ({exc.strerror})", "server.bind"
    raise ConfigError(
        f"cannot listen on {host}:{port}: the port {problem}",
        rule=rule,
        hint="stop the other process, or pick a free port with --port or [server] port",
    )
