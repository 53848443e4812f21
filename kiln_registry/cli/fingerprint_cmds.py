"""``kiln fingerprint encode`` and ``kiln fingerprint verify``.

Owns the two offline fingerprint commands.  Both print one line of canonical
JSON on stdout and exit 0; bad input raises a ``KilnError`` that
``kiln_registry.cli.main`` prints as one line with exit status 2.

    kiln fingerprint encode IDENTITY_JSON_FILE [--launcher-strict]
        {"fingerprint", "identity_sha256", "identity_revision", "identity"}
    kiln fingerprint verify FINGERPRINT [--launcher-strict]
        {"valid": true, "identity_sha256", "identity_revision", "identity"}

Imports only ``kiln_registry.identity`` and the standard library: no
network, database or heavy dependency.
"""

from __future__ import annotations

import argparse
import sys

from kiln_registry.identity.canonical import canonical_json, strict_json_loads
from kiln_registry.identity.document import TeacherIdentity, validate_identity
from kiln_registry.identity.fingerprint import verify_fingerprint
from kiln_registry.identity.input_manifest import MAX_INPUT_BYTES, read_regular_file


def _write_json(value: dict[str, object]) -> None:
    sys.stdout.buffer.write(canonical_json(value) + b"\n")
    sys.stdout.flush()


def _summary(identity: TeacherIdentity) -> dict[str, object]:
    return {
        "identity_sha256": identity.digest(),
        "identity_revision": identity.revision(),
        "identity": identity.to_dict(),
    }


def _encode(args: argparse.Namespace) -> int:
    path: str = args.identity_file
    data = read_regular_file(path, what="identity file", max_bytes=MAX_INPUT_BYTES)
    obj = strict_json_loads(data, what=f"identity file {path}", max_bytes=MAX_INPUT_BYTES)
    identity = TeacherIdentity.from_mapping(obj, launcher_strict=args.launcher_strict)
    _write_json({"fingerprint": identity.fingerprint(), **_summary(identity)})
    return 0


def _verify(args: argparse.Namespace) -> int:
    identity = verify_fingerprint(args.fingerprint)
    if args.launcher_strict:
        validate_identity(identity, launcher_strict=True)
    _write_json({"valid": True, **_summary(identity)})
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kiln fingerprint {encode,verify}`` to the ``kiln`` parser."""
    group = sub.add_parser(
        "fingerprint",
        help="encode or verify a kiln-teacher-v1 fingerprint (offline)",
        description="Encode an identity document as a kiln-teacher-v1 fingerprint, or"
        " verify a fingerprint and print the identity it carries.",
    )
    actions = group.add_subparsers(dest="fingerprint_command", required=True)
    strict_help = (
        "also apply the launcher's rules (candidates <= max_model_len * row width,"
        " model id pattern, vllm:<version> >= 0.20.1)"
    )

    encode = actions.add_parser(
        "encode", help="print the fingerprint of an identity JSON file (14 keys)"
    )
    encode.add_argument("identity_file", metavar="IDENTITY_JSON_FILE")
    encode.add_argument("--launcher-strict", action="store_true", help=strict_help)
    encode.set_defaults(func=_encode)

    verify = actions.add_parser(
        "verify", help="check every fingerprint rule; print the identity or the failed rule"
    )
    verify.add_argument("fingerprint", metavar="FINGERPRINT")
    verify.add_argument("--launcher-strict", action="store_true", help=strict_help)
    verify.set_defaults(func=_verify)
