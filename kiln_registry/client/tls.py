"""Credentials and TLS of the registry client: the bearer token and the trust store.

``check_token`` refuses a token that is not shaped like one (``kiln_`` +
URL-safe characters) without echoing it.  ``tls_context`` verifies the
registry against the system store, or only ``ca_file`` when given, and
presents ``client_cert`` (certificate, key) for mutual TLS.  ``token_from_env``
reads the token from ``--token-env NAME`` or else ``KILN_TOKEN`` (never a
command-line value, which would land in shell history and ``ps``).
``client_cert_from`` resolves ``--client-cert-file``/``--client-key-file``
(else ``KILN_CLIENT_CERT_FILE``/``KILN_CLIENT_KEY_FILE``; a PEM holding both
may be named as the certificate alone).  ``tls_refusal`` explains a transport
failure a TLS setting can fix: a registry under mutual TLS that drops the
connection right after the handshake (uvicorn sends no TLS alert, so this is
the only sign: no client certificate, or one it does not accept); a server
certificate the trust store does not know.
``client.base.unreachable`` asks it about the exception being handled.
Imports the standard library, httpx, ``credentials.redaction`` (the token shape) and
errors only.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import httpx

from kiln_registry.credentials.redaction import well_formed
from kiln_registry.domain.errors import InputError

TOKEN_ENV: Final = "KILN_TOKEN"
CERT_ENV: Final = "KILN_CLIENT_CERT_FILE"
KEY_ENV: Final = "KILN_CLIENT_KEY_FILE"
CERT_OPTIONS: Final = (
    f"--client-cert-file PEM and --client-key-file PEM (or ${CERT_ENV} and ${KEY_ENV});"
    " Python: RegistryClient(client_cert=(cert, key))"
)
MAX_CHAIN: Final = 8


def check_token(token: str) -> str:
    if not well_formed(token):
        raise InputError(
            "the registry token is malformed (expected kiln_ followed by URL-safe characters)",
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


def client_cert_from(
    cert: Path | None, key: Path | None, environ: Mapping[str, str]
) -> tuple[Path, Path] | None:
    """The (certificate, key) to present: the options, else the variables, else None."""
    cert = cert or (Path(environ[CERT_ENV]) if environ.get(CERT_ENV) else None)
    key = key or (Path(environ[KEY_ENV]) if environ.get(KEY_ENV) else None)
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


def tls_refusal(exc: BaseException | None, *, https: bool) -> tuple[str, str, str] | None:
    """``(code, message, hint)`` when a TLS setting explains the transport failure ``exc``."""
    if not https or not isinstance(exc, httpx.HTTPError):
        return None
    text = _chain_text(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            "registry_unreachable",
            "the registry's TLS certificate is not trusted (certificate verify failed)",
            "pass --ca-file with the CA that signed the registry's certificate",
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
