"""Identity-bound teacher corpora: the result JSONL of a scoring job, written and verified.

Layout (``kiln.teacher-scores.v1``):

* Line 1 is exactly the teacher's ``off_policy_manifest``
  (``{"schema":"kiln.off-policy-distillation-manifest.v1","teacher_identity":J}``
  with ``J`` the canonical identity bytes), because Kiln requires the first
  non-empty line of an off-policy corpus to be that exact string and counts
  every other line as a record.  So the job id and K are not in the header:
* every further line is one sequence, compact JSON with keys in this order:
  ``format`` (``"kiln.teacher-scores.v1"``), ``job_id``, ``teacher`` (the
  alias), ``identity_digest`` (hex of the header identity), ``top_k``,
  ``id``, ``token_ids_sha256`` (SHA-256 of the ids as 4-byte little-endian
  unsigned integers), ``token_ids``, ``topk_ids`` and ``topk_logprobs`` (one
  K-wide row per position: row ``i`` is the teacher's distribution over the
  token after position ``i``; the last row comes from Kiln's causal final-row
  probe) and ``token_logprobs`` (the ``n - 1`` logprobs of the sequence's own
  next tokens).  Logprobs are float32 values in their shortest round-trip form.
* The last line is the signature trailer, compact JSON in exactly this form
  ``{"kiln.corpus-trailer.v1":{"sha256":S,"key_id":I,"signature":G}}``: ``S``
  the lowercase hex SHA-256 of every byte before the trailer line, ``I`` the
  registry key's id and ``G`` the lowercase hex Ed25519 signature over
  ``jobs.core.signing.signed_message(S)``.

``CorpusWriter`` hashes the bytes as it writes them to a hidden partial file
named for the writer's claim (``.<name>.<tag>.partial``, so two workers that
both believe they hold a job never share a file), signs the digest once and
appends the trailer (``seal``: fsync, close); ``publish`` renames it over the
final name and fsyncs the directory, and the caller runs it inside the
transaction that proves the claim still holds; ``discard`` removes it.  Reading and
verifying a corpus is ``jobs.scoring.corpus_verify``.

Imports: standard library, numpy, orjson, ``identity.document`` and
``jobs.scoring.cache``/``jobs.core.signing``/``jobs.scoring.sources``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

import numpy as np
import orjson

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.jobs.core.signing import TRAILER_SCHEMA, CorpusSigner, fsync_dir
from kiln_registry.jobs.scoring.cache import ScoredSequence
from kiln_registry.jobs.scoring.sources import token_ids_sha256

ROW_FORMAT: Final = "kiln.teacher-scores.v1"
ROW_KEYS: Final = (
    "format", "job_id", "teacher", "identity_digest", "top_k", "id", "token_ids_sha256",
    "token_ids", "topk_ids", "topk_logprobs", "token_logprobs",
)  # fmt: skip
TRAILER_FIELDS: Final = ("sha256", "key_id", "signature")
TRAILER_PREFIX: Final = b'{"' + TRAILER_SCHEMA.encode("ascii") + b'":'


def trailer_line(sha256: str, key_id: str, signature: str) -> bytes:
    """The exact trailer line (with its newline) for these hex values."""
    body = {TRAILER_SCHEMA: dict(zip(TRAILER_FIELDS, (sha256, key_id, signature), strict=True))}
    return orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)


@dataclass(frozen=True, slots=True)
class RowContext:
    """The fields every row of one job repeats, and their encoded prefix."""

    job_id: str
    teacher: str
    identity: TeacherIdentity
    top_k: int

    def prefix(self) -> bytes:
        """``{"format":...,"top_k":K,`` : the constant head of every row."""
        head = {
            "format": ROW_FORMAT,
            "job_id": self.job_id,
            "teacher": self.teacher,
            "identity_digest": self.identity.digest(),
            "top_k": self.top_k,
        }
        return orjson.dumps(head)[:-1] + b","


_NUMPY: Final = orjson.OPT_SERIALIZE_NUMPY


def encode_row(
    prefix: bytes,
    seq_id: str,
    tokens: np.ndarray[Any, Any],
    scored: ScoredSequence,
    sha256: str | None = None,
) -> bytes:
    """One corpus line (with its newline); ``prefix`` is ``RowContext.prefix()``."""
    tail = {
        "id": seq_id,
        "token_ids_sha256": sha256 or token_ids_sha256(tokens),
        "token_ids": np.ascontiguousarray(tokens, dtype=np.int32),
        "topk_ids": np.ascontiguousarray(scored.topk_ids, dtype=np.int32),
        "topk_logprobs": np.ascontiguousarray(scored.topk_logprobs, dtype=np.float32),
        "token_logprobs": np.ascontiguousarray(scored.token_logprobs, dtype=np.float32),
    }
    return prefix + orjson.dumps(tail, option=_NUMPY | orjson.OPT_APPEND_NEWLINE)[1:]


LOCAL_TAG: Final = "local"  # a writer outside any job claim (tools, tests)


def partial_path(final: Path, tag: str, suffix: str = "") -> Path:
    """Where the writer holding claim ``tag`` builds ``final`` (+ ``suffix``): hidden, beside it."""
    return final.with_name(f".{final.name}{suffix}.{tag}.partial")


class CorpusWriter:
    """Streams a corpus into its claim's partial file beside ``final``; seals and publishes it."""

    def __init__(
        self, final: Path, ctx: RowContext, signer: CorpusSigner, *, tag: str = LOCAL_TAG
    ) -> None:
        self.final = final
        self.signer = signer
        self.partial = partial_path(final, tag)
        self.ctx = ctx
        self._prefix = ctx.prefix()
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        self.lines = 0
        fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self._file: BinaryIO | None = os.fdopen(fd, "wb", buffering=1 << 20)
        self._write((off_policy_manifest(ctx.identity) + "\n").encode("utf-8"))

    def _write(self, data: bytes) -> None:
        assert self._file is not None, "the corpus writer is closed"
        self._file.write(data)
        self.sha256.update(data)
        self.bytes += len(data)
        self.lines += 1

    def write(
        self,
        seq_id: str,
        tokens: np.ndarray[Any, Any],
        scored: ScoredSequence,
        sha256: str | None = None,
    ) -> None:
        """Append one row; ``sha256`` of the ids when the caller already has it."""
        self._write(encode_row(self._prefix, seq_id, tokens, scored, sha256))

    def seal(self) -> tuple[str, int]:
        """Append the signed trailer, fsync and close the partial file.

        Returns the SHA-256 and size of the whole file (trailer included).
        """
        assert self._file is not None, "the corpus writer is closed"
        body = self.sha256.hexdigest()
        signature = self.signer.sign(body).hex()
        self._write(trailer_line(body, self.signer.public.key_id, signature))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        return self.sha256.hexdigest(), self.bytes

    def publish(self) -> None:
        """Rename the sealed file over ``final`` and fsync the directory."""
        assert self._file is None, "seal the corpus before publishing it"
        os.replace(self.partial, self.final)
        fsync_dir(self.final.parent)

    def commit(self) -> tuple[str, int]:
        """``seal`` then ``publish``, for a writer with no claim to prove."""
        digest = self.seal()
        self.publish()
        return digest

    def discard(self) -> None:
        """Drop this claim's partial file (uncommitted results never become a corpus)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.partial.unlink(missing_ok=True)
