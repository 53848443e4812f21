"""Verifying an identity-bound teacher corpus (layout in ``jobs.corpus``) line by line.

``verify_corpus(path, keys)`` first checks the signature trailer: the last
line must be a byte-exact ``kiln.corpus-trailer.v1`` line (a corpus without
one is refused as unsigned, ``corpus.unsigned``), signed by one of ``keys``
(``corpus.unknown_key``) with a valid Ed25519 signature over its SHA-256
(``corpus.signature``).  It then reads everything before the trailer once,
hashing it while it checks each line, and refuses the first bad line; when
every line is well formed but the bytes do not hash to the signed SHA-256,
the content was changed after signing (``corpus.sha256``).  So any change to
any byte is refused.  Line checks: the first line is a byte-exact
``off_policy_manifest``; every later line is a strict JSON object with
exactly the row keys in order, ``format`` and ``identity_digest`` belong to
the header's identity, one ``job_id``, ``teacher`` and ``top_k``
(1..=max_top_k) throughout, unique ids, token ids
below ``vocab_size`` whose SHA-256 matches ``token_ids_sha256``, a length that
fits ``max_model_len`` with the probe token and generation slot, ``n`` rows of
``K`` distinct in-vocabulary ids with finite, non-positive, non-increasing
logprobs, and ``n - 1`` finite, non-positive next-token logprobs.  Whether the
identity is still registered is the caller's question (``kiln corpus
verify`` asks the server).

Refusals are ``InputError`` with ``rule="corpus.<name>"`` naming the line.
Imports: standard library, numpy, ``kiln_registry.domain.errors``,
``identity.document`` and ``jobs.corpus``/``jobs.signing``/``jobs.sources``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

import numpy as np

from kiln_registry.domain.errors import InputError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import OFF_POLICY_SCHEMA, off_policy_manifest
from kiln_registry.identity.strict_read import loads_strict
from kiln_registry.jobs.corpus import (
    ROW_FORMAT,
    ROW_KEYS,
    TRAILER_FIELDS,
    TRAILER_PREFIX,
    trailer_line,
)
from kiln_registry.jobs.signing import TRAILER_SCHEMA, PublicKey
from kiln_registry.jobs.sources import EXTRA_CONTEXT_TOKENS, token_ids_sha256

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


def _error(where: str, rule: str, message: str) -> InputError:
    return InputError(f"{where}: {message}", rule=f"corpus.{rule}")


def _loads(raw: bytes, where: str) -> Any:
    try:
        return loads_strict(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _error(where, "json", f"not strict JSON ({exc})") from None


def parse_header(raw: bytes) -> tuple[TeacherIdentity, str]:
    """The identity of an exact ``off_policy_manifest`` line (its newline stripped)."""
    text = raw.removesuffix(b"\n")
    value = _loads(text, "line 1")
    if not isinstance(value, dict) or list(value) != ["schema", "teacher_identity"]:
        raise _error("line 1", "manifest", "the first line is not an off-policy manifest")
    if value["schema"] != OFF_POLICY_SCHEMA:
        raise _error("line 1", "manifest", f"schema must be {OFF_POLICY_SCHEMA!r}")
    identity = TeacherIdentity.from_mapping(value["teacher_identity"])
    manifest = off_policy_manifest(identity)
    if text != manifest.encode("utf-8"):
        raise _error("line 1", "manifest_noncanonical", "the manifest is not byte-exact")
    return identity, manifest


def _ints(value: object, where: str, name: str) -> np.ndarray[Any, Any]:
    if not isinstance(value, list) or not all(type(x) is int for x in value):
        raise _error(where, "row_shape", f"{name} must be an array of integers")
    return np.asarray(value, dtype=np.int64)


def _matrix(value: object, rows: int, k: int, where: str, name: str) -> list[list[Any]]:
    if not isinstance(value, list) or len(value) != rows:
        raise _error(where, "row_shape", f"{name} must have {rows} rows")
    if not all(isinstance(row, list) and len(row) == k for row in value):
        raise _error(where, "row_shape", f"every {name} row must have {k} entries")
    return value


def _id_matrix(value: object, rows: int, k: int, where: str, vocab: int) -> None:
    matrix = _matrix(value, rows, k, where, "topk_ids")
    if not all(type(x) is int for row in matrix for x in row):
        raise _error(where, "row_shape", "topk_ids must hold integers")
    ids = np.asarray(matrix, dtype=np.int64).reshape(rows, k)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise _error(where, "token_id", f"a top-K id is not below vocab_size {vocab}")
    ordered = np.sort(ids, axis=1)
    if np.any(ordered[:, 1:] == ordered[:, :-1]):
        raise _error(where, "duplicate_id", "a topk_ids row repeats an id")


def _logprobs(values: np.ndarray[Any, Any], where: str, name: str) -> None:
    if values.size and (not np.all(np.isfinite(values)) or values.max() > 0.0):
        raise _error(where, "logprob", f"{name} holds a positive or non-finite logprob")


def _lp_matrix(value: object, rows: int, k: int, where: str) -> None:
    matrix = _matrix(value, rows, k, where, "topk_logprobs")
    if not all(type(x) in (int, float) for row in matrix for x in row):
        raise _error(where, "row_shape", "topk_logprobs must hold numbers")
    lps = np.asarray(matrix, dtype=np.float64).reshape(rows, k)
    _logprobs(lps, where, "topk_logprobs")
    if np.any(np.diff(lps, axis=1) > 0.0):
        raise _error(where, "topk_order", "topk_logprobs increase with rank")


class _LineChecker:
    """Checks rows against the header identity and the first row's job, teacher and K."""

    def __init__(self, identity: TeacherIdentity) -> None:
        self.identity = identity
        self.digest = identity.digest()
        self.first: tuple[object, object, object] | None = None
        self.ids: set[str] = set()

    def check(self, row: object, where: str) -> None:
        if not isinstance(row, dict) or tuple(row) != ROW_KEYS:
            raise _error(
                where, "row_keys", f"a row must have exactly the keys {', '.join(ROW_KEYS)}"
            )
        if row["format"] != ROW_FORMAT or row["identity_digest"] != self.digest:
            raise _error(where, "identity", "the row does not belong to the header's identity")
        fixed = (row["job_id"], row["teacher"], row["top_k"])
        self.first = self.first or fixed
        if fixed != self.first:
            raise _error(where, "mixed", "job_id, teacher and top_k must be the same on every row")
        k = row["top_k"]
        if type(k) is not int or not 1 <= k <= self.identity.max_top_k:
            raise _error(where, "top_k", f"top_k must be 1..={self.identity.max_top_k}")
        seq_id = row["id"]
        if not isinstance(seq_id, str) or seq_id in self.ids:
            raise _error(where, "id", "ids must be unique strings")
        self.ids.add(seq_id)
        self._check_scores(row, k, where)

    def _check_scores(self, row: dict[str, Any], k: int, where: str) -> None:
        tokens = _ints(row["token_ids"], where, "token_ids")
        n, vocab = int(tokens.size), self.identity.vocab_size
        if n < 1 or n + EXTRA_CONTEXT_TOKENS > self.identity.max_model_len:
            raise _error(where, "length", f"{n} tokens do not fit max_model_len")
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise _error(where, "token_id", f"a token id is not below vocab_size {vocab}")
        if token_ids_sha256(tokens) != row["token_ids_sha256"]:
            raise _error(where, "token_sha256", "token_ids_sha256 does not match token_ids")
        _id_matrix(row["topk_ids"], n, k, where, vocab)
        _lp_matrix(row["topk_logprobs"], n, k, where)
        own = row["token_logprobs"]
        if not isinstance(own, list) or len(own) != n - 1:
            raise _error(where, "row_shape", f"token_logprobs must have {n - 1} entries")
        if not all(type(x) in (int, float) for x in own):
            raise _error(where, "row_shape", "token_logprobs must hold numbers")
        _logprobs(np.asarray(own, dtype=np.float64), where, "token_logprobs")


def _trailer_fields(raw: bytes) -> tuple[str, str, str]:
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
        raise _error("trailer", "trailer", "the signature trailer is malformed")
    sha, key_id, signature = (inner[name] for name in TRAILER_FIELDS)
    if trailer_line(sha, key_id, signature) != raw:
        raise _error("trailer", "trailer", "the signature trailer is not byte-exact")
    return sha, key_id, signature


def read_trailer(handle: BinaryIO, size: int) -> Trailer:
    """The trailer of the open corpus of ``size`` bytes (refusals: see the module docstring)."""
    handle.seek(max(0, size - MAX_TRAILER_BYTES))
    tail = handle.read(MAX_TRAILER_BYTES)
    if not tail.endswith(b"\n"):
        raise _error("end of file", "truncated", "the corpus does not end with a newline")
    start = tail.rfind(b"\n", 0, len(tail) - 1) + 1
    raw = tail[start:]
    if (start == 0 and size > len(tail)) or not raw.startswith(TRAILER_PREFIX):
        if b"kiln.corpus-trailer" in raw:
            raise _error("trailer", "trailer", "the signature trailer is malformed")
        raise InputError(
            "the corpus is unsigned: its last line is not a kiln.corpus-trailer.v1 signature"
            " trailer (written before corpora were signed, or the trailer was removed)",
            rule="corpus.unsigned",
            hint=UNSIGNED_HINT,
        )
    sha, key_id, signature = _trailer_fields(raw)
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
        raise _error("trailer", "signature", f"the signature is not key {key.key_id}'s signature")
    return key


class _SignedBody:
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


def _check_lines(body: _SignedBody) -> _LineChecker:
    header = body.line(MAX_HEADER_BYTES)
    if not header or len(header) > MAX_HEADER_BYTES:
        raise _error("line 1", "manifest", "missing or oversized manifest line")
    identity, _ = parse_header(header)
    checker = _LineChecker(identity)
    for number in range(2, MAX_LINES + 2):
        raw = body.line(MAX_ROW_BYTES)
        if not raw:
            break
        if len(raw) > MAX_ROW_BYTES or number > MAX_LINES:
            raise _error(f"line {number}", "size", "the line or the corpus is too large")
        checker.check(_loads(raw, f"line {number}"), f"line {number}")
    return checker


def verify_corpus(
    path: Path, keys: dict[str, PublicKey], on_progress: Progress | None = None
) -> CorpusSummary:
    """Check the trailer against ``keys``, then every line; see the module docstring.

    A corpus with a detached ``<corpus>.sig`` is an off-policy generation corpus
    (``jobs.generation_verify``), which Kiln reads directly.
    """
    if path.with_name(path.name + ".sig").is_file():
        from kiln_registry.jobs.generation_verify import verify_generation_corpus

        return verify_generation_corpus(path, keys, on_progress)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise _error(str(path), "open", f"cannot open ({exc.strerror})") from None
    with handle:
        trailer = read_trailer(handle, os.fstat(handle.fileno()).st_size)
        key = check_trailer(trailer, keys)
        handle.seek(0)
        body = _SignedBody(handle, trailer.offset, on_progress)
        checker = _check_lines(body)
    if body.sha256.hexdigest() != trailer.sha256:
        raise _error(
            "content",
            "sha256",
            "the lines before the trailer do not hash to the signed SHA-256: the corpus was"
            " changed after it was signed",
        )
    job_id, teacher, top_k = checker.first or (None, None, None)
    return CorpusSummary(
        identity=checker.identity,
        manifest=off_policy_manifest(checker.identity),
        job_id=job_id if isinstance(job_id, str) else None,
        teacher=teacher if isinstance(teacher, str) else None,
        top_k=top_k if isinstance(top_k, int) else None,
        sequences=len(checker.ids),
        key_id=key.key_id,
        sha256=trailer.sha256,
    )
