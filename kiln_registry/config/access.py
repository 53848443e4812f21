"""Rules of the ``[server]`` access-control keys (kept out of ``config.py`` for size).

``auth`` (``"required"`` | ``"off"``; unset means required unless ``host`` is a
loopback address), ``metrics_public``, ``tls_cert_file``/``tls_key_file``
(both or neither) and ``tls_client_ca_file`` (mutual TLS; needs the pair).
``auth_required`` resolves the default; ``is_loopback`` says which hosts count
as loopback (``localhost``, 127.0.0.0/8, ``::1``).  The start-up refusal of
``auth = "off"`` on a non-loopback host lives in ``server.check_access``.
Imports the standard library only.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Protocol


class AccessKeys(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def auth(self) -> str | None: ...
    @property
    def tls_cert_file(self) -> Path | None: ...
    @property
    def tls_key_file(self) -> Path | None: ...
    @property
    def tls_client_ca_file(self) -> Path | None: ...


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def auth_required(server: AccessKeys) -> bool:
    """``[server] auth`` with its default: required unless the host is loopback."""
    if server.auth is None:
        return not is_loopback(server.host)
    return server.auth == "required"


def check_tls_keys(server: AccessKeys) -> None:
    """``tls_cert_file`` and ``tls_key_file`` come together; a client CA needs them."""
    if (server.tls_cert_file is None) != (server.tls_key_file is None):
        raise ValueError("tls_cert_file and tls_key_file must be set together")
    if server.tls_client_ca_file is not None and server.tls_cert_file is None:
        raise ValueError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
