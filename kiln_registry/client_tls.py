"""Credentials and TLS of the registry client: the bearer token and the trust store.

``check_token`` refuses a token that is not shaped like one (``kiln_`` +
URL-safe characters) without echoing it.  ``tls_context`` verifies the
registry against the system store, or only ``ca_file`` when given, and
presents ``client_cert`` (certificate, key) for mutual TLS.  ``token_from_env``
reads the token from ``--token-env NAME`` or else ``KILN_TOKEN`` (never a
command-line value, which would land in shell history and ``ps``).
Imports the standard library, ``auth.tokens`` and errors only.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from kiln_registry.auth.tokens import well_formed
from kiln_registry.errors import InputError

TOKEN_ENV: Final = "KILN_TOKEN"


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
