"""The options of every ``kiln`` command that talks to a registry server.

Owns ``--server URL`` (else ``$KILN_SERVER``, else the client's default),
``--json`` and ``--timeout SECONDS`` (in (0, 3600], default 60) as one argparse
parent parser, the ``seconds`` and ``number`` argument types, and
``server_url`` (which URL a parsed command talks to).

Imports: standard library and ``kiln_registry.client`` (for its default URL).
"""

from __future__ import annotations

import argparse
import os

from kiln_registry.client import DEFAULT_SERVER

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


def server_options(*, server: bool = True) -> argparse.ArgumentParser:
    """A parent parser: ``--server`` (when ``server``), ``--json`` and ``--timeout``."""
    parent = argparse.ArgumentParser(add_help=False)
    if server:
        parent.add_argument(
            "--server",
            metavar="URL",
            help=f"registry URL (default: ${SERVER_ENV}, else {DEFAULT_SERVER})",
        )
    parent.add_argument("--json", action="store_true", help="print one JSON document")
    parent.add_argument("--timeout", type=seconds, default=60.0, help="seconds per request")
    return parent


def server_url(args: argparse.Namespace) -> str:
    """``--server``, else ``$KILN_SERVER``, else the client's default URL."""
    url: str = args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER
    return url
