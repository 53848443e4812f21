"""The options of every ``kiln`` command that talks to a registry server.

Owns ``--server URL`` (else ``$KILN_SERVER``, else the client's default),
``--token-env NAME`` / ``--ca-file PEM`` (token from $NAME, else $KILN_TOKEN; CA
else $KILN_CA_FILE, read by the client),
``--client-cert-file``/``--client-key-file`` (mutual TLS; else
$KILN_CLIENT_CERT_FILE/$KILN_CLIENT_KEY_FILE; ``client_access`` gives the
client's keyword arguments), ``--json`` and
``--timeout SECONDS`` (in (0, 3600], default 60) as one argparse
parent parser, the ``seconds`` and ``number`` argument types,
``server_url`` (which URL a parsed command talks to) and ``registry_client``.

Imports: standard library and ``kiln_registry.client`` (sync, tls).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln_registry.cli.argtypes import env_name
from kiln_registry.client.sync import DEFAULT_SERVER, RegistryClient
from kiln_registry.client.tls import (
    CA_ENV,
    CERT_ENV,
    KEY_ENV,
    TOKEN_ENV,
    client_cert_from,
    token_from_env,
)

SERVER_ENV = "KILN_SERVER"
MAX_TIMEOUT_SECONDS = 3600


def number(text: str) -> float:
    """A float, as Python spells it."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def seconds(text: str) -> float:
    """A number of seconds in (0, 3600]."""
    value = number(text)
    if not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not in (0, 3600] seconds")
    return value


def server_options(
    *, server: bool = True, timeout_type: Callable[[str], float] = seconds
) -> argparse.ArgumentParser:
    """A parent parser: ``--server`` (when ``server``), ``--json`` and ``--timeout``.

    ``timeout_type`` parses ``--timeout`` (the job commands word their refusal their own way).
    """
    parent = argparse.ArgumentParser(add_help=False)
    if server:
        parent.add_argument(
            "--server",
            metavar="URL",
            help=f"registry URL (default: ${SERVER_ENV}, else {DEFAULT_SERVER})",
        )
        add_access_options(parent)
    parent.add_argument("--json", action="store_true", help="print one JSON document")
    parent.add_argument("--timeout", type=timeout_type, default=60.0, help="seconds per request")
    return parent


def server_url(args: argparse.Namespace) -> str:
    """``--server``, else ``$KILN_SERVER``, else the client's default URL."""
    url: str = args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    return url


def registry_client(args: argparse.Namespace) -> RegistryClient:
    """The client a parsed command talks through (``server_url``, ``--timeout``, access)."""
    return RegistryClient(server_url(args), timeout=args.timeout, **client_access(args))


def add_access_options(parser: argparse.ArgumentParser) -> None:
    """``--token-env NAME`` and ``--ca-file PEM`` (never a ``--token VALUE``)."""
    parser.add_argument(
        "--token-env",
        type=env_name,
        metavar="NAME",
        help=f"read the registry token from $NAME (default: ${TOKEN_ENV} when set)",
    )
    parser.add_argument(
        "--ca-file",
        type=Path,
        metavar="PEM",
        help=f"verify an https registry against this CA (default: ${CA_ENV} when set, else the"
        " system store)",
    )
    parser.add_argument(
        "--client-cert-file",
        type=Path,
        metavar="PEM",
        help=f"mutual TLS: present this client certificate (default: ${CERT_ENV} when set)",
    )
    parser.add_argument(
        "--client-key-file",
        type=Path,
        metavar="PEM",
        help=f"its private key (default: ${KEY_ENV}, else the certificate file)",
    )


def client_access(args: argparse.Namespace) -> dict[str, Any]:
    """The token, CA and client-certificate arguments of ``RegistryClient`` for a command."""
    cert = getattr(args, "client_cert_file", None)
    key = getattr(args, "client_key_file", None)
    return {
        "token": token_from_env(getattr(args, "token_env", None), os.environ),
        "ca_file": getattr(args, "ca_file", None),
        "client_cert": client_cert_from(cert, key, os.environ),
    }
