"""``kiln teachers ...``: the registry client commands and ``kiln teachers parity``.

Owns the ``teachers`` command group (``list``, ``show``, ``register``,
``delete``, ``probe``, ``launch``, ``receipts``, ``parity``), their flags, and the human
rendering of registry answers (tables and key/value blocks; every
server-supplied string is made printable before it reaches the terminal).
``--json`` prints the registry's answer as one JSON document instead.

The registry is ``--server URL``, else ``$KILN_SERVER``, else
``http://127.0.0.1:8420``.  Failures are ``KilnError``s: ``kiln`` prints one
line and exits 2.  ``parity`` exits 0 for ``identical`` and
``within_tolerance`` and 1 for ``mismatch``.

Imports: standard library, ``kiln_registry.client.sync``, ``kiln_registry.domain.errors``,
``cli.server_options`` and (inside the command) ``kiln_registry.parity.run``; never
FastAPI, the database or torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kiln_registry.cli.argtypes import env_name
from kiln_registry.cli.server_options import number, registry_client, server_options
from kiln_registry.domain.errors import InputError
from kiln_registry.domain.text import clipped
from kiln_registry.domain.vocabulary import TEACHER_KINDS_REMOTE_FIRST
from kiln_registry.wire.teachers import ProbeReportPublic, TeacherEntry

SubParsers = Any  # argparse's _SubParsersAction is private
REVISION_PREFIX = 12
MAX_CELL = 48
KINDS = TEACHER_KINDS_REMOTE_FIRST


def printable(value: object, limit: int | None = None) -> str:
    """``value`` as one terminal-safe line: control and escape characters become '?'."""
    text = "-" if value is None else str(value)
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if limit is None else clipped(text, limit)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[printable(c, MAX_CELL) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _revision(revision: str | None) -> str:
    return "-" if revision is None else revision.removeprefix("sha256:")[:REVISION_PREFIX]


def _emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _list(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        entries = client.list_teachers()
    if args.json:
        _emit_json({"teachers": [e.model_dump(mode="json", by_alias=True) for e in entries]})
        return 0
    if not entries:
        print("no teachers registered")
        return 0
    rows = [
        (
            e.spec.alias,
            e.spec.kind.value,
            e.status.value,
            "yes" if e.usable else "no",
            e.spec.model_id,
            e.spec.max_top_k,
            _revision(e.identity_revision),
        )
        for e in entries
    ]
    print(table(("alias", "kind", "status", "usable", "model", "max_top_k", "revision"), rows))
    return 0


def render_entry(entry: TeacherEntry) -> str:
    """A ``TeacherEntry`` as aligned ``key: value`` lines."""
    spec = entry.spec
    pairs: list[tuple[str, object]] = [
        ("alias", spec.alias),
        ("kind", spec.kind.value),
        ("status", entry.status.value),
        ("usable", "yes" if entry.usable else "no"),
        ("status message", entry.status_message),
        ("provider", spec.provider),
        ("model", spec.model_id),
        ("url", spec.url),
        ("credential", spec.credential_id),
        ("adapter", spec.adapter),
        ("max_top_k", spec.max_top_k),
        ("vocab_size", spec.vocab_size),
        ("tokenizer hash", spec.tokenizer_hash),
        ("identity revision", entry.identity_revision),
        ("notes", spec.notes),
    ]
    if spec.identity is not None:
        identity = spec.identity.model_dump(mode="json", by_alias=True)
        pairs += [(f"identity.{k}", v) for k, v in identity.items() if k not in ("schema",)]
    for index, replica in enumerate(entry.replicas or ()):
        pairs.append((f"replica {index}", f"{replica.url} ({replica.status.value})"))
    if entry.off_policy_manifest is not None:
        pairs.append(("off-policy manifest", entry.off_policy_manifest))
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {printable(v)}" for k, v in pairs)


def _show(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        entry = client.get_teacher(args.alias)
    return _print_entry(args, entry)


def _launch(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        entry = client.launch_teacher(args.alias)
    return _print_entry(args, entry)


def _print_entry(args: argparse.Namespace, entry: TeacherEntry) -> int:
    if args.json:
        _emit_json(entry.model_dump(mode="json", by_alias=True))
    else:
        print(render_entry(entry))
    return 0


def _register(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        entry = client.register_teacher(
            alias=args.alias,
            kind=args.kind,
            provider=args.provider,
            model_id=args.model_id,
            url=args.url[0] if args.url and len(args.url) == 1 else None,
            urls=args.url if args.url and len(args.url) > 1 else None,
            credential_id=args.credential_id,
            notes=args.notes,
            adapter=args.adapter,
            launch_profile=args.launch_profile,
        )
    if args.json:
        _emit_json(entry.model_dump(mode="json", by_alias=True))
    else:
        print(f"registered {printable(entry.spec.alias)}")
        print(render_entry(entry))
    return 0


def _delete(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        result = client.delete_teacher(args.alias)
    if args.json:
        _emit_json(result.model_dump(mode="json"))
    else:
        print(f"deleted {printable(result.alias)}")
    return 0


def render_probe(report: ProbeReportPublic) -> str:
    lines = [
        f"outcome   {report.outcome}",
        f"url       {printable(report.url)}",
        f"model     {printable(report.model_id)}",
        f"identity  {printable(report.identity_digest)}",
    ]
    if report.failure is not None:
        f = report.failure
        lines.append(f"failure   {printable(f.code)} {printable(f.rule)}: {printable(f.message)}")
    rows = [
        (a.purpose, a.k, a.status_code, f"{a.elapsed_ms:.1f}", a.bytes_read,
         f"{a.row_widths.min}..{a.row_widths.max}" if a.row_widths else "-")
        for a in report.attempts
    ]  # fmt: skip
    lines += ["", table(("purpose", "k", "http", "ms", "bytes", "row widths"), rows)]
    return "\n".join(lines)


def _probe(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        report = client.probe_teacher(args.alias)
    if args.json:
        _emit_json(report.model_dump(mode="json"))
    else:
        print(render_probe(report))
    return 0


def _receipts(args: argparse.Namespace) -> int:
    with registry_client(args) as client:
        receipts = client.receipts(args.alias, limit=args.limit)
    if args.json:
        _emit_json({"receipts": [r.model_dump(mode="json") for r in receipts]})
        return 0
    rows = [
        (r.id, r.created_at, r.outcome, _revision(r.identity_revision),
         r.report.failure.code if r.report.failure else None)
        for r in receipts
    ]  # fmt: skip
    print(table(("id", "created", "outcome", "revision", "failure"), rows) if rows else "none")
    return 0


def render_parity(report: dict[str, Any]) -> str:
    lines = [f"grade: {report['grade']}"]
    for side in ("a", "b"):
        t = report["teachers"][side]
        lines.append(
            f"teacher {side.upper()}: {printable(t['url'])} model {printable(t['model_id'])}"
            f" identity {_revision(t['identity_revision'])} ({printable(t['implementation'])})"
        )
    lines.append(
        f"K={report['k']}, {report['prompt_count']} prompts of {report['prompt_len']} tokens,"
        f" {report['compared_rows']} rows compared, atol {report['atol']}"
    )
    rows = [
        (cls, s["rows"], s["identical_rows"], f"{s['max_abs_diff']:.3g}",
         f"{s['min_topk_overlap']:.3f}")
        for cls, s in report["by_position"].items()
    ]  # fmt: skip
    lines.append(table(("positions", "rows", "identical", "max |diff|", "min overlap"), rows))
    div = report.get("first_divergence")
    if div:
        lines.append(
            f"first divergence: prompt {div['prompt']} position {div['position']} ({div['class']}),"
            f" |diff| {div['max_abs_diff']:.3g}, top-K overlap {div['topk_overlap']:.3f},"
            f" A top {div['a_top_ids']} vs B top {div['b_top_ids']}"
        )
    return "\n".join(lines)


def _positions(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _parity(args: argparse.Namespace) -> int:
    from kiln_registry.parity.run import ParityOptions, ParityTarget, parity

    if len(args.url) != 2:
        raise InputError("give exactly two --url flags (teacher A, teacher B)", rule="parity.urls")
    a = ParityTarget(args.url[0], args.model_id_a or args.model_id, args.api_key_env_a)
    b = ParityTarget(args.url[1], args.model_id_b or args.model_id, args.api_key_env_b)
    options = ParityOptions(
        positions=_positions(args.positions),
        top_k=args.top_k,
        prompts=args.prompts,
        max_prompt_len=args.max_prompt_len,
        atol=args.atol,
        timeout_s=args.timeout,
        ca_file=args.ca_file,
    )
    report = parity(a, b, options)
    if args.json:
        _emit_json(report)
    else:
        print(render_parity(report))
    return 1 if report["grade"] == "mismatch" else 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _release(args: argparse.Namespace) -> int:
    from kiln_registry.cli.audit_cmds import release_command

    return release_command(args)


def _add(
    group: SubParsers, name: str, help_text: str, func: Callable[[argparse.Namespace], int],
    *, client: bool = True,
) -> argparse.ArgumentParser:  # fmt: skip
    parser: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, parents=[server_options(server=client)]
    )
    parser.set_defaults(func=func)
    return parser


def _add_register(group: SubParsers) -> None:
    p = _add(group, "register", "probe a teacher and register it under an alias", _register)
    p.add_argument("--alias", required=True)
    p.add_argument("--kind", choices=KINDS, default="remote")
    p.add_argument("--provider", help="remote protocol (only 'vllm' can prove an identity)")
    p.add_argument("--model-id", help="served model id (remote, fixture); ignored for local")
    p.add_argument(
        "--url",
        action="append",
        help="teacher base URL (remote); repeat it to register a replica set",
    )
    p.add_argument("--credential-id", help="a [teachers.credentials.<id>] of the server")
    p.add_argument("--notes")
    p.add_argument("--adapter", help="local: an adapter directory of the student's adapter_dir")
    p.add_argument("--launch-profile", help="local: a [teachers.local.<profile>] instead")


def _add_parity(group: SubParsers) -> None:
    p = _add(group, "parity", "compare two teachers' prompt_logprobs", _parity, client=False)
    p.add_argument("--url", action="append", required=True, help="teacher URL (give two)")
    p.add_argument("--model-id", help="served model id of both teachers")
    p.add_argument("--model-id-a", help="served model id of teacher A")
    p.add_argument("--model-id-b", help="served model id of teacher B")
    p.add_argument(
        "--api-key-env-a", type=env_name, metavar="NAME", help="variable holding A's API key"
    )
    p.add_argument(
        "--api-key-env-b", type=env_name, metavar="NAME", help="variable holding B's API key"
    )
    p.add_argument("--positions", default="first,interior,final", help="comma list")
    p.add_argument("--top-k", type=_positive, help="K (default: min(20, both max_top_k))")
    p.add_argument("--prompts", type=_positive, default=2, help="number of prompts (<= 16)")
    p.add_argument("--max-prompt-len", type=_positive, help="cap the prompt length")
    p.add_argument("--atol", type=number, default=1e-3, help="max |logprob difference|")
    p.add_argument("--ca-file", type=Path, help="PEM CA bundle for HTTPS teachers")


def register(sub: SubParsers) -> None:
    teachers = sub.add_parser("teachers", help="list, register, inspect and compare teachers")
    group = teachers.add_subparsers(dest="teachers_command", required=True, metavar="COMMAND")
    _add(group, "list", "list registered teachers", _list)
    _add(group, "show", "show one teacher", _show).add_argument("alias")
    _add_register(group)
    _add(group, "delete", "delete an alias", _delete).add_argument("alias")
    _add(group, "probe", "re-run the identity probes of an alias", _probe).add_argument("alias")
    _add(group, "launch", "relaunch an unavailable local alias", _launch).add_argument("alias")
    release = _add(group, "release", "free a deleted alias for registration (admin)", _release)
    release.add_argument("alias")
    receipts = _add(group, "receipts", "list stored probe receipts", _receipts)
    receipts.add_argument("alias")
    receipts.add_argument("--limit", type=_positive, default=100, help="at most 1000")
    _add_parity(group)
