"""``kiln corpus verify``, ``kiln corpus export`` and ``kiln keys show``: signed teacher corpora.

``corpus verify FILE`` checks the corpus's signature trailer against the
registry's public key (``GET /v1/keys`` from ``--server``, else
``$KILN_SERVER``, else the default URL; or offline the saved keys document
given with ``--public-key FILE``), then every line against its header
identity, and then (online only) asks the registry whether that identity is
still the one registered under the corpus's teacher alias.  An unsigned
corpus (written before corpora were signed) is refused: there is no option
to accept one, because a corpus without a signature cannot show that its
scores are the teacher's; submitting the job again gives a signed corpus
quickly from the score cache.

``corpus export FILE --format kiln-logit-cache-v3 --to DIR|FILE.tar.gz`` verifies
a teacher-scoring corpus the same way (signature and every line; the key from
the server or ``--public-key``) and publishes every row as an entry of Kiln's
logit cache v3 (``jobs.scoring.logit_cache_export``): merged into the cache root
``DIR``, or written as Kiln's deterministic archive.

``keys show`` prints the registry's public key: read from the key file
beside the database named by ``--config`` (never created there: the server
creates it on its first start), or fetched from a running registry
(``--server``).  ``--json`` prints the ``GET /v1/keys`` document, which is
what ``--public-key`` reads.

Failures are ``KilnError``s (``kiln`` prints one line and exits 2); with
``corpus verify --json`` a failure is printed as ``{"ok": false, "error":
{code, rule, message, hint}}`` on stdout instead (still exit status 2).
Imports: standard library, ``kiln_registry.client.sync``, ``cli.jobs_cmds``, and
lazily ``config`` and ``jobs``; never FastAPI.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln_registry.cli.jobs_cmds import _common, _seconds
from kiln_registry.cli.server_options import SERVER_ENV, add_access_options, registry_client
from kiln_registry.client.sync import RegistryClient
from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.observability.progress import ProgressBar

if TYPE_CHECKING:
    from kiln_registry.jobs.core.signing import PublicKey
    from kiln_registry.jobs.scoring.corpus_signed import CorpusSummary

SubParsers = Any  # argparse's _SubParsersAction is private


def _still_registered(client: RegistryClient, summary: CorpusSummary, file: Path) -> None:
    assert summary.teacher is not None
    entry = client.get_teacher(summary.teacher)
    if not entry.usable or entry.off_policy_manifest != summary.manifest:
        raise InputError(
            f"{file}: teacher alias {summary.teacher!r} no longer serves the corpus's"
            f" identity {summary.identity.revision()} (registered: {entry.identity_revision})",
            rule="corpus.identity_not_registered",
        )


def _verify_file(file: Path, keys: dict[str, PublicKey]) -> CorpusSummary:
    from kiln_registry.jobs.kinds import verify_corpus

    # Bytes checked, rate and time left on a terminal (stderr); nothing on a pipe.
    with ProgressBar("kiln corpus verify", file.stat().st_size if file.is_file() else None) as bar:
        summary = verify_corpus(file, keys, bar.update_to)
    if summary.teacher is None:
        raise InputError(f"{file}: the corpus has no rows to verify", rule="corpus.empty")
    return summary


def _report(args: argparse.Namespace, summary: CorpusSummary, registered: bool | None) -> None:
    if args.json:
        doc = {"ok": True, "file": str(args.file), "sequences": summary.sequences,
               "job_id": summary.job_id, "teacher": summary.teacher, "top_k": summary.top_k,
               "identity_revision": summary.identity.revision(), "key_id": summary.key_id,
               "sha256": summary.sha256, "registered": registered}  # fmt: skip
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    where = (
        f"still registered as {summary.teacher}"
        if registered
        else "offline: whether it is still registered was not checked"
    )
    print(
        f"ok: {summary.sequences} sequences of job {summary.job_id} (K={summary.top_k}) belong"
        f" to identity {summary.identity.revision()}, signed by registry key {summary.key_id},"
        f" {where}"
    )


def _corpus_verify(args: argparse.Namespace) -> int:
    if not args.json:
        return _verify(args)
    try:
        return _verify(args)
    except KilnError as exc:  # --json: the refusal is a JSON document too (exit status 2)
        error = {"code": exc.code, "rule": exc.rule, "message": str(exc), "hint": exc.hint or ""}
        doc = {"ok": False, "file": str(args.file), "error": error}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 2


def _verify(args: argparse.Namespace) -> int:
    from kiln_registry.jobs.core.signing import read_keys_file

    if args.public_key is None:
        with registry_client(args) as client:
            summary = _verify_file(args.file, client.signing_keys())
            _still_registered(client, summary, args.file)
        _report(args, summary, True)
        return 0
    if args.server is not None:
        raise InputError(
            "--public-key verifies offline: pass either --public-key or --server",
            rule="client.options",
        )
    _report(args, _verify_file(args.file, read_keys_file(args.public_key)), None)
    return 0


def _export_keys(args: argparse.Namespace) -> dict[str, PublicKey]:
    from kiln_registry.jobs.core.signing import read_keys_file

    if args.public_key is None:
        with registry_client(args) as client:
            return client.signing_keys()
    if args.server is not None:
        raise InputError(
            "--public-key verifies offline: pass either --public-key or --server",
            rule="client.options",
        )
    return read_keys_file(args.public_key)


def _corpus_export(args: argparse.Namespace) -> int:
    from kiln_registry.jobs.kinds import verify_corpus
    from kiln_registry.jobs.scoring.logit_cache import check_timestamp
    from kiln_registry.jobs.scoring.logit_cache_export import export_corpus

    if args.produced_at is not None:
        check_timestamp(args.produced_at)
    summary = export_corpus(
        args.file, _export_keys(args), args.to, args.produced_at, verify=verify_corpus
    )
    done = ", ".join(f"{count} {name}" for name, count in summary.outcomes.items())
    where = f"archive {args.to} ({summary.archive_bytes} bytes)" if summary.archive_bytes else (
        f"cache root {args.to}")  # fmt: skip
    print(f"ok: {summary.sequences} sequences, {summary.entries} entries ({done}) in {where}")
    return 0


def _local_keys(config_path: Path) -> list[PublicKey]:
    from kiln_registry.config.loader import load_config
    from kiln_registry.jobs.core.signing import key_path, load_signer

    config = load_config(config_path)
    return [load_signer(key_path(config.server.state_path)).public]


def _keys_show(args: argparse.Namespace) -> int:
    from kiln_registry.jobs.core.signing import keys_document

    if args.config is not None:
        if args.server is not None:
            raise InputError("pass either --config or --server", rule="client.options")
        keys = _local_keys(args.config)
    else:
        with registry_client(args) as client:
            keys = list(client.signing_keys().values())
    if args.json:
        sys.stdout.write(json.dumps(keys_document(keys), indent=2) + "\n")
        return 0
    for key in keys:
        print(f"key_id      {key.key_id}\nalgorithm   ed25519\npublic_key  {key.raw.hex()}")
    return 0


def register(sub: SubParsers) -> None:
    group = sub.add_parser("corpus", help="identity-bound teacher corpora").add_subparsers(
        dest="corpus_command", required=True, metavar="COMMAND"
    )
    p = group.add_parser(
        "verify",
        help="check a corpus's signature, every line, and that its identity is still registered",
        parents=[_common()],
    )
    p.add_argument("file", type=Path)
    p.add_argument(
        "--public-key",
        type=Path,
        metavar="FILE",
        help="verify offline against this saved GET /v1/keys document (`kiln keys show --json`)",
    )
    p.set_defaults(func=_corpus_verify)
    p = group.add_parser(
        "export",
        help="publish a verified scoring corpus as Kiln logit-cache entries (a root or .tar.gz)",
        parents=[_common()],
    )
    p.add_argument("file", type=Path)
    p.add_argument("--format", required=True, choices=["kiln-logit-cache-v3"])
    p.add_argument(
        "--to",
        type=Path,
        required=True,
        metavar="DIR|FILE.tar.gz",
        help="a Kiln cache root to merge into (created if missing), or an archive to write",
    )
    p.add_argument(
        "--public-key", type=Path, metavar="FILE", help="verify offline against this keys document"
    )
    p.add_argument(
        "--produced-at",
        metavar="RFC3339",
        help="the entries' produced_at (default: the corpus file's modification time)",
    )
    p.set_defaults(func=_corpus_export)
    group = sub.add_parser("keys", help="the registry's corpus-signing key").add_subparsers(
        dest="keys_command", required=True, metavar="COMMAND"
    )
    p = group.add_parser("show", help="print the public key that signs corpora")
    p.add_argument("--config", type=Path, help="read the key beside this kiln.toml's database")
    p.add_argument("--server", metavar="URL", help=f"fetch it (default: ${SERVER_ENV})")
    p.add_argument("--json", action="store_true", help="print the GET /v1/keys document")
    p.add_argument("--timeout", type=_seconds, default=60.0, help="seconds per request")
    add_access_options(p)
    p.set_defaults(func=_keys_show)
