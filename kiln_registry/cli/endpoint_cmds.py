"""``kiln teacher-endpoint ALIAS``: serve one registered alias in vLLM's protocol.

Parses the flags into ``endpoint.startup.EndpointOptions``, loads
``--config`` (only its ``[teachers.credentials]`` and ``[server]
teacher_ca_file`` are used) and checks its secret variables, configures
logging (JSON lines by default, secrets and tokens redacted) and runs
``endpoint.run.run_endpoint``.  See docs/teacher-endpoint.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from kiln_registry.cli.server_options import add_access_options, client_access, server_url

if TYPE_CHECKING:
    from kiln_registry.endpoint.startup import EndpointOptions

DEFAULT_LISTEN = "127.0.0.1:8001"


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not in (0, 86400]")
    return value


def count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer in 1..1000000")
    return int(text)


def _options(args: argparse.Namespace) -> EndpointOptions:
    from kiln_registry.config.loader import check_startup_environment, load_config
    from kiln_registry.endpoint.admission import Limits
    from kiln_registry.endpoint.startup import EndpointOptions, ListenOptions

    config = load_config(args.config) if args.config else None
    if config is not None:
        check_startup_environment(config, os.environ)
    host, port = args.listen
    return EndpointOptions(
        alias=args.alias,
        listen=ListenOptions(
            host=host,
            port=port,
            api_key_env=args.api_key_env,
            tls_cert_file=args.tls_cert_file,
            tls_key_file=args.tls_key_file,
            insecure_no_auth=args.insecure_no_auth,
        ),
        config=config,
        limits=Limits(
            max_prompts=args.max_prompts,
            max_n=args.max_n,
            max_body_bytes=args.max_body_mib << 20,
        ),
        recheck_s=args.recheck_s,
        probe_timeout_s=args.probe_timeout_s,
        request_timeout_s=args.request_timeout_s,
    )


def _run(args: argparse.Namespace) -> int:
    from kiln_registry.auth.serving import install_token_redaction
    from kiln_registry.client.asynchronous import AsyncRegistryClient
    from kiln_registry.endpoint.run import run_endpoint
    from kiln_registry.observability.logs import configure_logging

    options = _options(args)
    names = options.config.secret_env_names() if options.config else frozenset()
    configure_logging(args.log_format, names, args.log_level)
    install_token_redaction()

    @asynccontextmanager
    async def registry() -> AsyncIterator[AsyncRegistryClient]:
        async with AsyncRegistryClient(
            server_url(args), timeout=args.timeout, **client_access(args)
        ) as client:
            yield client

    def announce(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    asyncio.run(run_endpoint(options, registry, announce))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "teacher-endpoint",
        help="serve one registered alias as a verified vLLM endpoint for any trainer",
        description="Prove every replica of ALIAS against its pinned identity, then serve"
        " GET /health, GET /v1/models and POST /v1/completions as vLLM does, checking every"
        " answer before it is relayed (docs/teacher-endpoint.md).",
    )
    p.add_argument("alias", help="the registered alias to serve")
    p.add_argument("--server", metavar="URL", help="registry URL (default: $KILN_SERVER)")
    add_access_options(p)
    p.add_argument("--timeout", type=positive, default=60.0, help="seconds per registry request")
    p.add_argument(
        "--listen",
        type=listen_address,
        default=listen_address(DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help=f"where to serve (default {DEFAULT_LISTEN})",
    )
    p.add_argument("--config", type=Path, help="kiln.toml with [teachers.credentials.<id>]")
    p.add_argument(
        "--recheck-s",
        type=positive,
        default=30.0,
        help="re-read the alias from the registry every N seconds (default 30)",
    )
    p.add_argument("--api-key-env", metavar="NAME",
                   help="require Authorization: Bearer $NAME on /v1/* and /metrics")  # fmt: skip
    p.add_argument("--tls-cert-file", type=Path, metavar="PEM", help="serve HTTPS: certificate")
    p.add_argument("--tls-key-file", type=Path, metavar="PEM", help="its unencrypted key")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="accept a non-loopback --listen without TLS and an API key")  # fmt: skip
    p.add_argument("--max-prompts", type=count, default=256, help="prompts per request")
    p.add_argument("--max-n", type=count, default=16, help="largest n")
    p.add_argument("--max-body-mib", type=count, default=64, help="request body bound, MiB")
    p.add_argument("--probe-timeout-s", type=positive, default=30.0, help="per probe request")
    p.add_argument("--request-timeout-s", type=positive, default=600.0,
                   help="one relayed request at the teacher (default 600)")  # fmt: skip
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    p.add_argument("--log-level", choices=("debug", "info", "warning"), default="info")
    p.set_defaults(func=_run)
