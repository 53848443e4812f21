"""``kiln serve`` and ``kiln openapi``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from kiln_registry.domain.errors import ConfigError

DEFAULT_OPENAPI_PATH = Path("openapi") / "kiln-registry.openapi.json"


def render_openapi() -> str:
    from kiln_registry.api.app import create_app

    schema: dict[str, Any] = create_app(None).openapi()
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def _openapi(args: argparse.Namespace) -> int:
    path: Path = args.output
    text = render_openapi()
    if args.check:
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = ""
        if current != text:
            raise ConfigError(
                f"{path} is stale or missing", rule="openapi.stale", hint="run `kiln openapi`"
            )
        print(f"{path} is current")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    print(f"wrote {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from kiln_registry.cli.ports import ensure_port_free
    from kiln_registry.serve.startup import prepare, run_server

    server = prepare(args.config, host=args.host, port=args.port).server
    ensure_port_free(server.host, server.port)  # one `kiln: error:` line, exit status 2
    run_server(
        args.config,
        host=args.host,
        port=args.port,
        insecure_no_auth=args.insecure_no_auth,
        upgrade=args.upgrade,
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run the registry server")
    serve.add_argument("--config", type=Path, required=True, help="path to kiln.toml")
    serve.add_argument("--host", help="override [server] host")
    serve.add_argument("--port", type=int, help="override [server] port")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help='accept [server] auth = "off" on a non-loopback host (logs a warning every hour)',
    )
    serve.add_argument(
        "--upgrade",
        action="store_true",
        help="upgrade a database behind this release's schema before serving"
        " (otherwise refused; see `kiln db upgrade`)",
    )
    serve.set_defaults(func=_serve)

    openapi = sub.add_parser("openapi", help="write (or --check) the generated OpenAPI schema")
    openapi.add_argument("--output", type=Path, default=DEFAULT_OPENAPI_PATH)
    openapi.add_argument("--check", action="store_true", help="exit 2 when the file is stale")
    openapi.set_defaults(func=_openapi)
