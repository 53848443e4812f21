"""Verifying an identity-bound teacher corpus (layout in ``jobs.scoring.corpus``) line by line.

``verify_scoring_corpus(path, keys)`` first checks the signature trailer: the last
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
The trailer, header and signed-byte reading are ``jobs.scoring.corpus_signed``'s;
``jobs.kinds.verify_corpus`` sends a corpus with a detached ``.sig`` to
``jobs.generation.verify`` instead.
Imports: standard library, numpy, ``kiln_registry.domain.errors``,
``identity.document`` and ``jobs.scoring.corpus``/``corpus_signed``/``sources``,
``jobs.core.signing``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.jobs.core.signing import PublicKey
from kiln_registry.jobs.scoring.corpus import (
    ROW_FORMAT,
    ROW_KEYS,
)
from kiln_registry.jobs.scoring.corpus_signed import (
    MAX_HEADER_BYTES,
    MAX_LINES,
    MAX_ROW_BYTES,
    CorpusSummary,
    Progress,
    SignedBody,
    check_trailer,
    corpus_error,
    loads_line,
    parse_header,
    read_trailer,
)
from kiln_registry.jobs.scoring.sources import EXTRA_CONTEXT_TOKENS, token_ids_sha256


def _ints(value: object, where: str, name: str) -> np.ndarray[Any, Any]:
    if not isinstance(value, list) or not all(type(x) is int for x in value):
        raise corpus_error(where, "row_shape", f"{name} must be an array of integers")
    return np.asarray(value, dtype=np.int64)


def _matrix(value: object, rows: int, k: int, where: str, name: str) -> list[list[Any]]:
    if not isinstance(value, list) or len(value) != rows:
        raise corpus_error(where, "row_shape", f"{name} must have {rows} rows")
    if not all(isinstance(row, list) and len(row) == k for row in value):
        raise corpus_error(where, "row_shape", f"every {name} row must have {k} entries")
    return value


def _id_matrix(value: object, rows: int, k: int, where: str, vocab: int) -> None:
    matrix = _matrix(value, rows, k, where, "topk_ids")
    if not all(type(x) is int for row in matrix for x in row):
        raise corpus_error(where, "row_shape", "topk_ids must hold integers")
    ids = np.asarray(matrix, dtype=np.int64).reshape(rows, k)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise corpus_error(where, "token_id", f"a top-K id is not below vocab_size {vocab}")
    ordered = np.sort(ids, axis=1)
    if np.any(ordered[:, 1:] == ordered[:, :-1]):
        raise corpus_error(where, "duplicate_id", "a topk_ids row repeats an id")


def _logprobs(values: np.ndarray[Any, Any], where: str, name: str) -> None:
    if values.size and (not np.all(np.isfinite(values)) or values.max() > 0.0):
        raise corpus_error(where, "logprob", f"{name} holds a positive or non-finite logprob")


def _lp_matrix(value: object, rows: int, k: int, where: str) -> None:
    matrix = _matrix(value, rows, k, where, "topk_logprobs")
    if not all(type(x) in (int, float) for row in matrix for x in row):
        raise corpus_error(where, "row_shape", "topk_logprobs must hold numbers")
    lps = np.asarray(matrix, dtype=np.float64).reshape(rows, k)
    _logprobs(lps, where, "topk_logprobs")
    if np.any(np.diff(lps, axis=1) > 0.0):
        raise corpus_error(where, "topk_order", "topk_logprobs increase with rank")


class _LineChecker:
    """Checks rows against the header identity and the first row's job, teacher and K."""

    def __init__(self, identity: TeacherIdentity) -> None:
        self.identity = identity
        self.digest = identity.digest()
        self.first: tuple[object, object, object] | None = None
        self.ids: set[str] = set()

    def check(self, row: object, where: str) -> None:
        if not isinstance(row, dict) or tuple(row) != ROW_KEYS:
            raise corpus_error(
                where, "row_keys", f"a row must have exactly the keys {', '.join(ROW_KEYS)}"
            )
        if row["format"] != ROW_FORMAT or row["identity_digest"] != self.digest:
            raise corpus_error(
                where, "identity", "the row does not belong to the header's identity"
            )
        fixed = (row["job_id"], row["teacher"], row["top_k"])
        self.first = self.first or fixed
        if fixed != self.first:
            raise corpus_error(
                where, "mixed", "job_id, teacher and top_k must be the same on every row"
            )
        k = row["top_k"]
        if type(k) is not int or not 1 <= k <= self.identity.max_top_k:
            raise corpus_error(where, "top_k", f"top_k must be 1..={self.identity.max_top_k}")
        seq_id = row["id"]
        if not isinstance(seq_id, str) or seq_id in self.ids:
            raise corpus_error(where, "id", "ids must be unique strings")
        self.ids.add(seq_id)
        self._check_scores(row, k, where)

    def _check_scores(self, row: dict[str, Any], k: int, where: str) -> None:
        tokens = _ints(row["token_ids"], where, "token_ids")
        n, vocab = int(tokens.size), self.identity.vocab_size
        if n < 1 or n + EXTRA_CONTEXT_TOKENS > self.identity.max_model_len:
            raise corpus_error(where, "length", f"{n} tokens do not fit max_model_len")
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise corpus_error(where, "token_id", f"a token id is not below vocab_size {vocab}")
        if token_ids_sha256(tokens) != row["token_ids_sha256"]:
            raise corpus_error(where, "token_sha256", "token_ids_sha256 does not match token_ids")
        _id_matrix(row["topk_ids"], n, k, where, vocab)
        _lp_matrix(row["topk_logprobs"], n, k, where)
        own = row["token_logprobs"]
        if not isinstance(own, list) or len(own) != n - 1:
            raise corpus_error(where, "row_shape", f"token_logprobs must have {n - 1} entries")
        if not all(type(x) in (int, float) for x in own):
            raise corpus_error(where, "row_shape", "token_logprobs must hold numbers")
        _logprobs(np.asarray(own, dtype=np.float64), where, "token_logprobs")


def _check_lines(body: SignedBody) -> _LineChecker:
    header = body.line(MAX_HEADER_BYTES)
    if not header or len(header) > MAX_HEADER_BYTES:
        raise corpus_error("line 1", "manifest", "missing or oversized manifest line")
    identity, _ = parse_header(header)
    checker = _LineChecker(identity)
    for number in range(2, MAX_LINES + 2):
        raw = body.line(MAX_ROW_BYTES)
        if not raw:
            break
        if len(raw) > MAX_ROW_BYTES or number > MAX_LINES:
            raise corpus_error(f"line {number}", "size", "the line or the corpus is too large")
        checker.check(loads_line(raw, f"line {number}"), f"line {number}")
    return checker


def verify_scoring_corpus(
    path: Path, keys: dict[str, PublicKey], on_progress: Progress | None = None
) -> CorpusSummary:
    """Check the trailer against ``keys``, then every line; see the module docstring.

    ``jobs.kinds.verify_corpus`` sends a corpus here unless it has a detached
    ``<corpus>.sig`` (an off-policy generation corpus, ``jobs.generation.verify``).
    """
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise corpus_error(str(path), "open", f"cannot open ({exc.strerror})") from None
    with handle:
        trailer = read_trailer(handle, os.fstat(handle.fileno()).st_size)
        key = check_trailer(trailer, keys)
        handle.seek(0)
        body = SignedBody(handle, trailer.offset, on_progress)
        checker = _check_lines(body)
    if body.sha256.hexdigest() != trailer.sha256:
        raise corpus_error(
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
