"""``kiln audit`` (list the audit log) and ``kiln teachers release ALIAS`` (admin).

Both talk to a running registry with an ``admin`` token (``--token-env NAME``
or ``KILN_TOKEN``).  ``release_command`` is registered under ``kiln teachers``
by ``teachers_cmds``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kiln_registry.cli.server_options import registry_client, server_options
from kiln_registry.domain.text import quoted

SubParsers = Any  # argparse's _SubParsersAction is private


def _audit(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        events = client.audit(limit=args.limit, before=args.before)
    if args.json:
        doc = {"events": [e.model_dump(mode="json") for e in events]}
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return 0
    for e in events:
        print(f"{e.id}\t{e.at}\t{e.token or '-'}\t{e.action}\t{e.target or '-'}\t{e.outcome}")
    return 0


def release_command(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        client.release_alias(args.alias)
    print(f"released {args.alias}; it can be registered again")
    return 0


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"{quoted(text, 16)} is not in 1..1000")
    return int(text)


def _event_id(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 2**62:
        raise argparse.ArgumentTypeError(f"{quoted(text, 24)} is not an event id")
    return int(text)


def register(sub: SubParsers) -> None:
    p = sub.add_parser("audit", help="list the audit log (admin)", parents=[server_options()])
    p.add_argument("--limit", type=_count, default=100, help="at most 1000 events")
    p.add_argument("--before", type=_event_id, help="only events older than this id")
    p.set_defaults(func=_audit)
