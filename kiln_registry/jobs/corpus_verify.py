"""Verifying an identity-bound teacher corpus (layout in ``jobs.corpus``) line by line.

``verify_corpus(path)`` reads the file with bounded lines and checks: the
first line is a byte-exact ``off_policy_manifest``; every later line is a
strict JSON object with exactly the row keys in order, ``format`` and
``identity_digest`` belong to the header's identity, one ``job_id``,
``teacher`` and ``top_k`` (1..=max_top_k) throughout, unique ids, token ids
below ``vocab_size`` whose SHA-256 matches ``token_ids_sha256``, a length that
fits ``max_model_len`` with the probe token and generation slot, ``n`` rows of
``K`` distinct in-vocabulary ids with finite, non-positive, non-increasing
logprobs, and ``n - 1`` finite, non-positive next-token logprobs.  Whether the
identity is still registered is the caller's question (``kiln corpus
verify`` asks the server).

Refusals are ``InputError`` with ``rule="corpus.<name>"`` naming the line.
Imports: standard library, numpy, ``kiln_registry.errors``,
``identity.document`` and ``jobs.corpus``/``jobs.sources``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from kiln_registry.errors import InputError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import OFF_POLICY_SCHEMA, off_policy_manifest
from kiln_registry.jobs.corpus import ROW_FORMAT, ROW_KEYS
from kiln_registry.jobs.sources import EXTRA_CONTEXT_TOKENS, strict_json, token_ids_sha256

MAX_HEADER_BYTES: Final = 64 * 1024
MAX_ROW_BYTES: Final = 256 << 20
MAX_LINES: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class CorpusSummary:
    identity: TeacherIdentity
    manifest: str
    job_id: str | None
    teacher: str | None
    top_k: int | None
    sequences: int


def _error(where: str, rule: str, message: str) -> InputError:
    return InputError(f"{where}: {message}", rule=f"corpus.{rule}")


def _loads(raw: bytes, where: str) -> Any:
    try:
        return strict_json(raw)
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


def verify_corpus(path: Path) -> CorpusSummary:
    """Check every line of the corpus at ``path``; see the module docstring."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise _error(str(path), "open", f"cannot open ({exc.strerror})") from None
    with handle:
        header = handle.readline(MAX_HEADER_BYTES + 1)
        if not header or len(header) > MAX_HEADER_BYTES:
            raise _error("line 1", "manifest", "missing or oversized manifest line")
        identity, manifest = parse_header(header)
        checker = _LineChecker(identity)
        for number in range(2, MAX_LINES + 2):
            raw = handle.readline(MAX_ROW_BYTES + 1)
            if not raw:
                break
            if len(raw) > MAX_ROW_BYTES or number > MAX_LINES:
                raise _error(f"line {number}", "size", "the line or the corpus is too large")
            checker.check(_loads(raw, f"line {number}"), f"line {number}")
    job_id, teacher, top_k = checker.first or (None, None, None)
    return CorpusSummary(
        identity=identity,
        manifest=manifest,
        job_id=job_id if isinstance(job_id, str) else None,
        teacher=teacher if isinstance(teacher, str) else None,
        top_k=top_k if isinstance(top_k, int) else None,
        sequences=len(checker.ids),
    )
