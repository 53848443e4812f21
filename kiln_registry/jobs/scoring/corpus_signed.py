"""The signed-file side of both corpus kinds: trailers, detached signatures, headers.

A teacher corpus ends with a ``kiln.corpus-trailer.v1`` line; an off-policy
generation corpus has the same fields in a detached ``<corpus>.sig``.  Both
verifiers (``jobs.scoring.corpus_verify`` for teacher corpora, ``jobs.generation.verify``
for generation corpora) read the trailer fields, check the signature against the
registry's keys, read the signed bytes line by line through ``SignedBody``
(bounded, hashed as read) and parse the manifest header with the helpers here.
Refusals are ``InputError`` with ``rule="corpus.<name>"``.  Imports: the
standard library, ``kiln_registry.domain.errors``, ``identity`` and
``jobs.scoring.corpus``/``jobs.core.signing``; never either verifier.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, Final

from kiln_registry.domain.errors import InputError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import OFF_POLICY_SCHEMA, off_policy_manifest
from kiln_registry.identity.strict_read import loads_strict
from kiln_registry.jobs.core.signing import TRAILER_SCHEMA, PublicKey
from kiln_registry.jobs.scoring.corpus import TRAILER_FIELDS, TRAILER_PREFIX, trailer_line

MAX_HEADER_BYTES: Final = 64 * 1024
MAX_ROW_BYTES: Final = 256 << 20
MAX_LINES: Final = 1_000_000
MAX_TRAILER_BYTES: Final = 1024
_HEX: Final = {"sha256": re.compile(r"[0-9a-f]{64}"), "key_id": re.compile(r"[0-9a-f]{64}"),
               "signature": re.compile(r"[0-9a-f]{128}")}  # fmt: skip
UNSIGNED_HINT: Final = (
    "corpora are signed since the registry added signature trailers; download it again with"
    " `kiln jobs result`, or submit the job again (its cached scores make that fast)"
)

# Called with (bytes checked, bytes to check) as verification advances.
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class CorpusSummary:
    identity: TeacherIdentity
    manifest: str
    job_id: str | None
    teacher: str | None
    top_k: int | None
    sequences: int
    key_id: str
    sha256: str


@dataclass(frozen=True, slots=True)
class Trailer:
    """A parsed trailer and where it starts (the number of signed bytes before it)."""

    sha256: str
    key_id: str
    signature: bytes
    offset: int


def corpus_error(where: str, rule: str, message: str) -> InputError:
    """``InputError`` ``corpus.<rule>`` naming where in the corpus (a line, the trailer)."""
    return InputError(f"{where}: {message}", rule=f"corpus.{rule}")


def loads_line(raw: bytes, where: str) -> Any:
    try:
        return loads_strict(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise corpus_error(where, "json", f"not strict JSON ({exc})") from None


def parse_header(raw: bytes) -> tuple[TeacherIdentity, str]:
    """The identity of an exact ``off_policy_manifest`` line (its newline stripped)."""
    text = raw.removesuffix(b"\n")
    value = loads_line(text, "line 1")
    if not isinstance(value, dict) or list(value) != ["schema", "teacher_identity"]:
        raise corpus_error("line 1", "manifest", "the first line is not an off-policy manifest")
    if value["schema"] != OFF_POLICY_SCHEMA:
        raise corpus_error("line 1", "manifest", f"schema must be {OFF_POLICY_SCHEMA!r}")
    identity = TeacherIdentity.from_mapping(value["teacher_identity"])
    manifest = off_policy_manifest(identity)
    if text != manifest.encode("utf-8"):
        raise corpus_error("line 1", "manifest_noncanonical", "the manifest is not byte-exact")
    return identity, manifest


def trailer_fields(raw: bytes) -> tuple[str, str, str]:
    """The three fields of a byte-exact trailer line ``raw`` (refused otherwise)."""
    try:
        value = loads_strict(raw.removesuffix(b"\n"))
    except (UnicodeDecodeError, ValueError):
        value = None
    inner = value.get(TRAILER_SCHEMA) if isinstance(value, dict) else None
    if (
        not isinstance(inner, dict)
        or tuple(inner) != TRAILER_FIELDS
        or not all(
            isinstance(inner[name], str) and pattern.fullmatch(inner[name])
            for name, pattern in _HEX.items()
        )
    ):
        raise corpus_error("trailer", "trailer", "the signature trailer is malformed")
    sha, key_id, signature = (inner[name] for name in TRAILER_FIELDS)
    if trailer_line(sha, key_id, signature) != raw:
        raise corpus_error("trailer", "trailer", "the signature trailer is not byte-exact")
    return sha, key_id, signature


def read_trailer(handle: BinaryIO, size: int) -> Trailer:
    """The trailer of the open corpus of ``size`` bytes (refusals: see the module docstring)."""
    handle.seek(max(0, size - MAX_TRAILER_BYTES))
    tail = handle.read(MAX_TRAILER_BYTES)
    if not tail.endswith(b"\n"):
        raise corpus_error("end of file", "truncated", "the corpus does not end with a newline")
    start = tail.rfind(b"\n", 0, len(tail) - 1) + 1
    raw = tail[start:]
    if (start == 0 and size > len(tail)) or not raw.startswith(TRAILER_PREFIX):
        if b"kiln.corpus-trailer" in raw:
            raise corpus_error("trailer", "trailer", "the signature trailer is malformed")
        raise InputError(
            "the corpus is unsigned: its last line is not a kiln.corpus-trailer.v1 signature"
            " trailer (written before corpora were signed, or the trailer was removed)",
            rule="corpus.unsigned",
            hint=UNSIGNED_HINT,
        )
    sha, key_id, signature = trailer_fields(raw)
    return Trailer(sha, key_id, bytes.fromhex(signature), size - len(raw))


def check_trailer(trailer: Trailer, keys: dict[str, PublicKey]) -> PublicKey:
    """The key that signed ``trailer``; refused when it is not one of ``keys`` or invalid."""
    key = keys.get(trailer.key_id)
    if key is None:
        raise InputError(
            f"trailer: the corpus was signed by key {trailer.key_id}, which is not the"
            f" registry's key ({', '.join(sorted(keys))})",
            rule="corpus.unknown_key",
            hint="verify against the key of the registry that published the corpus"
            " (--server, or --public-key with its GET /v1/keys document)",
        )
    if not key.verifies(trailer.sha256, trailer.signature):
        raise corpus_error(
            "trailer", "signature", f"the signature is not key {key.key_id}'s signature"
        )
    return key


class SignedBody:
    """Bounded line reads of the signed bytes before the trailer, hashed as they are read."""

    def __init__(self, handle: BinaryIO, end: int, on_progress: Progress | None) -> None:
        self.handle = handle
        self.end = end
        self.done = 0
        self.sha256 = hashlib.sha256()
        self.on_progress = on_progress

    def line(self, limit: int) -> bytes:
        raw = self.handle.readline(min(limit + 1, self.end - self.done))
        self.done += len(raw)
        self.sha256.update(raw)
        if self.on_progress is not None:
            self.on_progress(self.done, self.end)
        return raw
