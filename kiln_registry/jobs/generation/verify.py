"""Verifying an off-policy generation corpus (layout in ``jobs.generation.output``).

The signature is detached: ``<corpus>.sig`` holds one byte-exact
``kiln.corpus-trailer.v1`` line whose SHA-256 covers the whole corpus,
checked against ``keys`` first.  Then every line is read once, hashed while
it is checked: line 1 the byte-exact ``off_policy_manifest``; every later
line an ``OffPolicyDistillationExample`` as Kiln's serde types define it
(``crates/kiln-train/src/opd.rs``): ``id`` a string, ``messages`` a
non-empty array of ``{"role", "content"}`` strings, ``teacher_response`` a
non-empty string (Kiln refuses an empty one), ``teacher_tokens`` (when
present) objects with ``token_id`` (u32 below ``vocab_size``), ``token``,
``logprob`` (finite, <= 0) and ``top_logprobs`` of ``K`` distinct
``{"token_id", "logprob"}`` entries best first; ``metadata`` naming this
identity, one job, teacher and settings throughout; the ``teacher_tokens``
ids equal ``kiln_token_ids`` at ``kiln_action_positions`` (format v2; v1:
``completion_token_ids``).  Ids are unique.  Refusals are
``InputError`` with ``rule="corpus.<name>"`` naming the line.

Imports: standard library, ``kiln_registry.domain.errors``/``identity`` and
``jobs.scoring.corpus_signed``/``jobs.generation.output``/``jobs.core.signing``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Final

from kiln_registry.domain.errors import KilnError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.identity.strict_read import FileProblem, Problem, read_regular_file
from kiln_registry.jobs.core.signing import PublicKey, signature_path
from kiln_registry.jobs.generation.output import (
    EXAMPLE_KEYS,
    META_FORMAT,
    META_FORMAT_V1,
)
from kiln_registry.jobs.scoring import corpus_signed as cv
from kiln_registry.jobs.scoring.corpus_signed import corpus_error as _error

_REQUIRED: Final = ("id", "messages", "teacher_response")
_U32: Final = 2**32


def _number(value: object, where: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(float(value)) or float(value) > 0:  # type: ignore[arg-type]
        raise _error(where, "logprob", "a logprob must be a finite number <= 0")
    return float(value)  # type: ignore[arg-type]


def _token_id(value: object, vocab: int, where: str) -> int:
    if type(value) is not int or not 0 <= value < min(vocab, _U32):
        raise _error(where, "token_id", f"token_id must be an integer below vocab_size {vocab}")
    return value


def _messages(value: object, where: str) -> None:
    if not isinstance(value, list) or not value:
        raise _error(where, "messages", "messages must be a non-empty array")
    for message in value:
        if (
            not isinstance(message, dict)
            or sorted(message) != ["content", "role"]
            or not all(isinstance(v, str) for v in message.values())
        ):
            raise _error(where, "messages", 'every message is {"role", "content"} strings')


class _ExampleChecker:
    def __init__(self, identity: TeacherIdentity) -> None:
        self.identity = identity
        self.digest = identity.digest()
        self.fixed: tuple[object, object, object] | None = None
        self.ids: set[str] = set()
        self.top_k: int | None = None

    def check(self, row: object, where: str) -> None:
        if not isinstance(row, dict) or [k for k in EXAMPLE_KEYS if k in row] != list(row):
            raise _error(
                where, "row_keys", f"keys must be among {', '.join(EXAMPLE_KEYS)}, in order"
            )
        if not all(k in row for k in _REQUIRED) or not isinstance(row["id"], str):
            raise _error(where, "row_keys", "id, messages and teacher_response are required")
        if row["id"] in self.ids:
            raise _error(where, "id", "ids must be unique")
        self.ids.add(row["id"])
        _messages(row["messages"], where)
        if not isinstance(row["teacher_response"], str) or not row["teacher_response"]:
            raise _error(where, "teacher_response", "teacher_response must be a non-empty string")
        meta = self._metadata(row.get("metadata"), where)
        top_k = meta["settings"].get("top_k") if isinstance(meta["settings"], dict) else None
        self.top_k = top_k if type(top_k) is int else None
        tokens = row.get("teacher_tokens")
        if (tokens is not None) != (isinstance(top_k, int) and top_k > 0):
            raise _error(where, "teacher_tokens", "teacher_tokens are present iff top_k > 0")
        if tokens is not None:
            ids = self._tokens(tokens, int(top_k), where)  # type: ignore[arg-type]
            if ids != self._expected_ids(meta, where):
                raise _error(where, "teacher_tokens", "teacher_tokens differ from the metadata ids")

    def _expected_ids(self, meta: dict[str, Any], where: str) -> object:
        """v1: the sampled ids; v2: Kiln's sequence at its action positions."""
        if meta["format"] == META_FORMAT_V1:
            return meta["completion_token_ids"]
        seq, positions = meta.get("kiln_token_ids"), meta.get("kiln_action_positions")
        if not isinstance(seq, list) or not isinstance(positions, list) or not positions:
            raise _error(where, "metadata", "kiln_token_ids and kiln_action_positions are required")
        for token in seq:
            _token_id(token, self.identity.vocab_size, where)
        last = 0
        for at in positions:
            if type(at) is not int or not last < at < len(seq):
                raise _error(where, "metadata", "kiln_action_positions must increase, from 1,"
                             " within kiln_token_ids")  # fmt: skip
            last = at
        return [seq[at] for at in positions]

    def _metadata(self, meta: object, where: str) -> dict[str, Any]:
        if not isinstance(meta, dict) or meta.get("format") not in (META_FORMAT, META_FORMAT_V1):
            raise _error(where, "metadata", f"metadata.format must be {META_FORMAT!r}")
        if meta.get("identity_digest") != self.digest:
            raise _error(where, "identity", "the example does not belong to the header's identity")
        fixed = (meta.get("job_id"), meta.get("teacher"), repr(meta.get("settings")))
        self.fixed = self.fixed or fixed
        if fixed != self.fixed:
            raise _error(where, "mixed", "job_id, teacher and settings must be the same throughout")
        ids = meta.get("completion_token_ids")
        if not isinstance(ids, list) or not ids:
            raise _error(where, "metadata", "completion_token_ids must be a non-empty array")
        for token in ids:
            _token_id(token, self.identity.vocab_size, where)
        return meta

    def _tokens(self, tokens: object, k: int, where: str) -> list[int]:
        if not isinstance(tokens, list) or not tokens:
            raise _error(where, "teacher_tokens", "teacher_tokens must be a non-empty array")
        ids: list[int] = []
        for i, token in enumerate(tokens):
            at = f"{where} teacher_tokens[{i}]"
            if not isinstance(token, dict) or list(token) != ["token_id", "token", "logprob",
                                                              "top_logprobs"]:  # fmt: skip
                raise _error(at, "teacher_tokens", "keys must be token_id, token, logprob,"
                             " top_logprobs")  # fmt: skip
            ids.append(_token_id(token["token_id"], self.identity.vocab_size, at))
            if not isinstance(token["token"], str):
                raise _error(at, "teacher_tokens", "token must be a string")
            _number(token["logprob"], at)
            self._top(token["top_logprobs"], k, at)
        return ids

    def _top(self, top: object, k: int, where: str) -> None:
        if not isinstance(top, list) or len(top) != k:
            raise _error(where, "top_logprobs", f"top_logprobs must hold {k} entries")
        seen: set[int] = set()
        last = 0.0
        for entry in top:
            if not isinstance(entry, dict) or list(entry) != ["token_id", "logprob"]:
                raise _error(where, "top_logprobs", 'entries are {"token_id", "logprob"}')
            token = _token_id(entry["token_id"], self.identity.vocab_size, where)
            value = _number(entry["logprob"], where)
            if token in seen or value > last:
                raise _error(where, "topk_order", "entries must be distinct and best first")
            seen.add(token)
            last = value


def _signature(path: Path, keys: dict[str, PublicKey], size: int) -> cv.Trailer:
    sig = signature_path(path)

    def refuse(problem: FileProblem) -> KilnError:
        if problem.kind in (Problem.TOO_LARGE, Problem.GREW):
            return _error("trailer", "trailer", "the signature trailer is malformed")
        reason = problem.detail or problem.kind.value.replace("_", " ")
        return _error(str(sig), "open", f"cannot open ({reason})")

    raw, _ = read_regular_file(sig, limit=cv.MAX_TRAILER_BYTES, refuse=refuse)
    sha, key_id, signature = cv.trailer_fields(raw)
    trailer = cv.Trailer(sha, key_id, bytes.fromhex(signature), size)
    cv.check_trailer(trailer, keys)
    return trailer


def verify_generation_corpus(
    path: Path, keys: dict[str, PublicKey], on_progress: cv.Progress | None = None
) -> cv.CorpusSummary:
    """Check ``<path>.sig`` against ``keys``, then every line (see the module docstring)."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise _error(str(path), "open", f"cannot open ({exc.strerror})") from None
    with handle:
        trailer = _signature(path, keys, os.fstat(handle.fileno()).st_size)
        body = cv.SignedBody(handle, trailer.offset, on_progress)
        header = body.line(cv.MAX_HEADER_BYTES)
        if not header or len(header) > cv.MAX_HEADER_BYTES:
            raise _error("line 1", "manifest", "missing or oversized manifest line")
        identity, _ = cv.parse_header(header)
        checker = _ExampleChecker(identity)
        for number in range(2, cv.MAX_LINES + 2):
            raw = body.line(cv.MAX_ROW_BYTES)
            if not raw:
                break
            if len(raw) > cv.MAX_ROW_BYTES or number > cv.MAX_LINES:
                raise _error(f"line {number}", "size", "the line or the corpus is too large")
            checker.check(cv.loads_line(raw, f"line {number}"), f"line {number}")
    if body.sha256.hexdigest() != trailer.sha256:
        raise _error("content", "sha256", "the corpus does not hash to the signed SHA-256: it"
                     " was changed after it was signed")  # fmt: skip
    job_id, teacher, _ = checker.fixed or (None, None, None)
    return cv.CorpusSummary(
        identity=identity, manifest=off_policy_manifest(identity),
        job_id=job_id if isinstance(job_id, str) else None,
        teacher=teacher if isinstance(teacher, str) else None, top_k=checker.top_k,
        sequences=len(checker.ids), key_id=trailer.key_id, sha256=trailer.sha256,
    )  # fmt: skip
