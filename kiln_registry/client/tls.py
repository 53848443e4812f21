"""Credentials and TLS of the registry client: the bearer token and the trust store.

``check_token`` refuses a token that is not shaped like one (``kiln_`` +
URL-safe characters) without echoing it.  ``tls_context`` verifies the
registry against the system store, or only ``ca_file`` when given, and
presents ``client_cert`` (certificate, key) for mutual TLS.  ``token_from_env``
reads the token from ``--token-env NAME`` or else ``KILN_TOKEN`` (never a
command-line value, which would land in shell history and ``ps``).
``client_cert_from`` resolves ``--client-cert-file``/``--client-key-file``
(else ``KILN_CLIENT_CERT_FILE``/``KILN_CLIENT_KEY_FILE``; a PEM holding both
may be named as the certificate alone) and ``ca_file_from`` ``--ca-file`` (else
``KILN_CA_FILE``); a variable naming a path that is not a file is refused by
name.  ``tls_refusal`` explains a transport
failure a TLS setting can fix: a registry under mutual TLS that drops the
connection right after the handshake (uvicorn sends no TLS alert, so this is
the only sign: no client certificate, or one it does not accept); a server
certificate the trust store does not know; an ``http://`` URL whose server
hung up at once and completes a TLS handshake (``speaks_tls``, one blocking
connection of at most 2 s, on this failure path only): "this server speaks
HTTPS".
``client.base.unreachable`` asks it about the exception being handled.
Imports the standard library, httpx, ``credentials.redaction`` (the token shape) and
errors only.
"""

from __future__ import annotations

import socket
import ssl
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import httpx

from kiln_registry.credentials.redaction import token_problem
from kiln_registry.domain.errors import InputError
from kiln_registry.domain.text import quoted

TOKEN_ENV: Final = "KILN_TOKEN"
CA_ENV: Final = "KILN_CA_FILE"
CERT_ENV: Final = "KILN_CLIENT_CERT_FILE"
KEY_ENV: Final = "KILN_CLIENT_KEY_FILE"
CERT_OPTIONS: Final = (
    f"--client-cert-file PEM and --client-key-file PEM (or ${CERT_ENV} and ${KEY_ENV});"
    " Python: RegistryClient(client_cert=(cert, key))"
)
MAX_CHAIN: Final = 8
TLS_SNIFF_S: Final = 2.0


def check_token(token: str) -> str:
    problem = token_problem(token)
    if problem is not None:
        raise InputError(
            f"the registry token is malformed: {problem} (expected kiln_ followed by 43 or"
            " more URL-safe characters)",
            rule="client.token",
            hint="copy the whole line `kiln tokens create` printed",
        )
    return token


def token_from_env(name: str | None, environ: Mapping[str, str]) -> str | None:
    """The token in ``$name`` (required to be set), else ``$KILN_TOKEN``, else None."""
    if name is not None:
        value = environ.get(name, "")
        if not value:
            raise InputError(
                f"--token-env {name[:64]}: that variable is unset or empty",
                rule="client.token_env",
                hint="export the token in that variable first",
            )
        return check_token(value.strip())
    value = environ.get(TOKEN_ENV, "").strip()
    return check_token(value) if value else None


def tls_context(
    ca_file: Path | None, client_cert: tuple[Path, Path] | None = None
) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
        if client_cert is not None:
            context.load_cert_chain(client_cert[0], client_cert[1], password=lambda: b"")
    except (OSError, ssl.SSLError) as exc:
        raise InputError(
            f"could not load the registry CA or client certificate ({type(exc).__name__})",
            rule="client.tls",
            hint="give PEM files (--ca-file)",
        ) from None
    return context


def _env_file(name: str, environ: Mapping[str, str]) -> Path | None:
    """The file ``$name`` names, else None; refused when set to a path that is not a file."""
    value = environ.get(name, "")
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise InputError(
            f"${name} names {quoted(value, 200)}, which is not a readable file",
            rule="client.tls_env",
            hint=f"point ${name} at the PEM file, or unset it",
        )
    return path


def ca_file_from(ca_file: Path | None, environ: Mapping[str, str]) -> Path | None:
    """The CA to verify the registry against: ``ca_file``, else ``$KILN_CA_FILE``, else None."""
    return ca_file if ca_file is not None else _env_file(CA_ENV, environ)


def client_cert_from(
    cert: Path | None, key: Path | None, environ: Mapping[str, str]
) -> tuple[Path, Path] | None:
    """The (certificate, key) to present: the options, else the variables, else None."""
    cert = cert or _env_file(CERT_ENV, environ)
    key = key or _env_file(KEY_ENV, environ)
    if cert is None:
        if key is not None:
            raise InputError(
                "a client key was given without a client certificate",
                rule="client.client_cert",
                hint=f"give {CERT_OPTIONS}",
            )
        return None
    return cert, key or cert


def _chain_text(exc: BaseException) -> str:
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < MAX_CHAIN:
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


def speaks_tls(host: str, port: int) -> bool:
    """True when ``host:port`` completes a TLS handshake (certificate not checked)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only asks "is this TLS?"; nothing is sent after
    try:
        with (
            socket.create_connection((host, port), timeout=TLS_SNIFF_S) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ValueError):
        return False


def _plain_http_to_tls(exc: BaseException, base_url: str) -> tuple[str, str, str] | None:
    """An http:// URL whose server hung up at once: say so when it speaks HTTPS."""
    parts = urllib.parse.urlsplit(base_url)
    if not isinstance(exc, httpx.RemoteProtocolError) or parts.scheme != "http":
        return None
    if parts.hostname is None or not speaks_tls(parts.hostname, parts.port or 80):
        return None
    https_url = urllib.parse.urlunsplit(("https", *parts[1:]))
    return (
        "registry_unreachable",
        f"this server speaks HTTPS; use {https_url} (plain http:// got no answer)",
        f"pass --server {https_url} (or set KILN_SERVER), with --ca-file or ${CA_ENV} when"
        " its certificate is self-signed",
    )


def tls_refusal(
    exc: BaseException | None, *, https: bool, base_url: str = ""
) -> tuple[str, str, str] | None:
    """``(code, message, hint)`` when a TLS setting explains the transport failure ``exc``."""
    if not isinstance(exc, httpx.HTTPError):
        return None
    if not https:
        return _plain_http_to_tls(exc, base_url) if base_url else None
    text = _chain_text(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            "registry_unreachable",
            "the registry's TLS certificate is not trusted (certificate verify failed)",
            f"pass --ca-file (or set ${CA_ENV}) with the CA that signed the registry's certificate",
        )
    if isinstance(exc, httpx.RemoteProtocolError) or "CERTIFICATE_REQUIRED" in text:
        return (
            "registry_client_certificate_required",
            "the registry closed the connection right after the TLS handshake without"
            " answering: it requires a client certificate (mutual TLS) and none was presented,"
            " or not one signed by its [server] tls_client_ca_file",
            f"give {CERT_OPTIONS}",
        )
    return None
