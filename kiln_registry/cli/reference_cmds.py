"""``kiln reference-teacher``: serve a local model as an eager Transformers teacher.

Owns the command's flags, the loopback rule (a host that is not loopback is
refused unless ``--api-key-env`` names the key variable), and the one JSON
startup line on stdout (``fingerprint``, ``url``, ``identity_digest``,
``served_model_id``), flushed once the socket listens.  The work is done by
``kiln_registry.reference_teacher``.

Imports: standard library and kiln_registry; torch, transformers and uvicorn
only inside the command (through ``reference_teacher``).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any

from kiln_registry.cli.argtypes import env_name, integer, positive_int
from kiln_registry.domain.errors import InputError

SubParsers = Any  # argparse's _SubParsersAction is private
MAX_THREADS = 8


def _port(text: str) -> int:
    value = integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {text!r} is outside 0..=65535")
    return value


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url(host: str, port: int, scheme: str = "http") -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{shown}:{port}"


def _tls_files(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """``--tls-cert-file``/``--tls-key-file`` (both or neither), loaded once to fail early."""
    cert, key = args.tls_cert_file, args.tls_key_file
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InputError(
            "--tls-cert-file and --tls-key-file must be given together", rule="reference.tls"
        )
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=lambda: b"")
    except (OSError, ssl.SSLError) as exc:
        raise InputError(
            f"could not load --tls-cert-file {cert} / --tls-key-file ({type(exc).__name__})",
            rule="reference.tls",
            hint="give a PEM certificate chain and its unencrypted PEM key",
        ) from None
    return cert, key


def _cmd_reference_teacher(args: argparse.Namespace) -> int:
    if not is_loopback(args.host) and args.api_key_env is None:
        raise InputError(
            f"--host {args.host} is not a loopback address and no --api-key-env was given",
            rule="reference.non_loopback_without_key",
            hint="bind 127.0.0.1, or name the variable holding the API key with --api-key-env",
        )
    tls = _tls_files(args)
    import torch

    from kiln_registry.reference_teacher.app import (
        bind_socket,
        check_env_name,
        create_reference_app,
        run_reference_server,
    )
    from kiln_registry.reference_teacher.identity import load_reference_teacher

    if args.api_key_env is not None:
        check_env_name(args.api_key_env)
    torch.set_num_threads(args.threads or min(MAX_THREADS, os.cpu_count() or 1))
    teacher, identity = load_reference_teacher(
        args.model_path,
        served_model_id=args.served_model_id,
        max_top_k=args.max_top_k,
        max_model_len=args.max_model_len,
    )
    app = create_reference_app(teacher, api_key_env=args.api_key_env)
    sock = bind_socket(args.host, args.port)
    line = {
        "event": "listening",
        "url": _url(args.host, sock.getsockname()[1], "https" if tls else "http"),
        "served_model_id": args.served_model_id,
        "fingerprint": identity.fingerprint(),
        "identity_digest": identity.digest(),
    }
    sys.stdout.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    run_reference_server(app, sock, tls=tls)
    return 0


def register(sub: SubParsers) -> None:
    parser = sub.add_parser(
        "reference-teacher",
        help="serve a local model with eager Transformers on vLLM's prompt-logprobs protocol",
    )
    parser.add_argument("--model-path", required=True, help="local model directory")
    parser.add_argument("--served-model-id", required=True, help="the model name clients send")
    parser.add_argument("--max-top-k", required=True, type=positive_int, metavar="K")
    parser.add_argument("--max-model-len", required=True, type=positive_int, metavar="L")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", default=8000, type=_port, help="0 picks a free port")
    parser.add_argument(
        "--api-key-env",
        default=None,
        type=env_name,
        metavar="NAME",
        help="environment variable holding the API key that guards /v1/*",
    )
    parser.add_argument("--tls-cert-file", type=Path, metavar="PEM", help="serve HTTPS")
    parser.add_argument("--tls-key-file", type=Path, metavar="PEM", help="its private key")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.set_defaults(func=_cmd_reference_teacher)
