"""Off-policy generation corpora in Kiln's format and their detached signature.

Layout (what Kiln's ``parse_off_policy_distillation_dataset_str`` reads,
``crates/kiln-train/src/opd.rs``): line 1 is exactly the teacher's
``off_policy_manifest``; every further line is one
``OffPolicyDistillationExample`` in input order, compact JSON with keys in
this order: ``id``, ``messages`` (the prompt, as submitted), ``teacher_response``
(the generated ids decoded with the student tokenizer, special tokens
skipped), ``teacher_tokens`` (only when ``top_k > 0``: one
``TeacherActionToken`` ``{"token_id", "token", "logprob", "top_logprobs":
[{"token_id", "logprob"}, ...]}`` per action position of the conversation as
Kiln's preparation tokenizes it (``jobs.generation.kiln``), the teacher's
top ``K`` there best first) and ``metadata`` (``format``
``kiln-registry.generation.v2``, ``job_id``, ``teacher``,
``identity_digest``, ``prompt_token_ids_sha256``, ``completion_token_ids``
(the sampled ids), ``finish_reason``, ``settings`` and, when ``top_k > 0``,
``kiln_token_ids`` and ``kiln_action_positions``: Kiln's whole token
sequence and the positions ``teacher_tokens`` describe).  Format ``v1``
corpora (``teacher_tokens`` per sampled id, which Kiln refuses) still verify.

Kiln parses every non-manifest line as an example, so the signature cannot
be a trailer line here: it is the same ``kiln.corpus-trailer.v1`` line a
scoring corpus ends with, covering the SHA-256 of the whole ``.jsonl``,
written to ``<corpus>.jsonl.sig`` beside it (published first, then the
corpus; both atomically, from partial files named for the writer's claim, inside
the transaction that proves the claim still holds, as ``jobs.scoring.corpus`` does).

The generation cache and a job's prompts are ``jobs.generation.repository``.

Imports: standard library, orjson, SQLAlchemy, ``kiln_registry.db``/
``identity`` and ``jobs``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

import orjson

from kiln_registry.domain.errors import JobConflict, KilnError, ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.identity.strict_read import FileProblem, Problem, read_regular_file
from kiln_registry.jobs.core.signing import (
    SIGNATURE_SUFFIX,
    CorpusSigner,
    fsync_dir,
    signature_path,
)
from kiln_registry.jobs.generation.sources import GenerationSettings
from kiln_registry.jobs.generation.wire import Generated, KilnTokens
from kiln_registry.jobs.scoring.corpus import LOCAL_TAG, partial_path, trailer_line

META_FORMAT: Final = "kiln-registry.generation.v2"
META_FORMAT_V1: Final = "kiln-registry.generation.v1"  # teacher_tokens = sampled ids
EXAMPLE_KEYS: Final = ("id", "messages", "teacher_response", "teacher_tokens", "metadata")
MAX_SIGNATURE_BYTES: Final = 1024


def detached_signature(corpus: Path) -> str:
    """The trailer line of ``<corpus>.sig`` without its newline (``JobConflict`` if absent)."""

    def refuse(problem: FileProblem) -> KilnError:
        what = "too large" if problem.kind in (Problem.TOO_LARGE, Problem.GREW) else "missing"
        return JobConflict(
            f"the signature of {corpus.name} is {what} on disk", rule="job.result_missing"
        )

    raw, _ = read_regular_file(signature_path(corpus), limit=MAX_SIGNATURE_BYTES, refuse=refuse)
    return raw.rstrip(b"\n").decode("ascii", errors="replace")


@dataclass(frozen=True, slots=True)
class ExampleContext:
    job_id: str
    teacher: str
    identity: TeacherIdentity
    settings: GenerationSettings
    tokenizer: Any

    def token_text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))


def _teacher_tokens(ctx: ExampleContext, kiln: KilnTokens) -> list[dict[str, object]]:
    return [
        {"token_id": kiln.sequence[at], "token": ctx.token_text(kiln.sequence[at]),
         "logprob": own,
         "top_logprobs": [{"token_id": i, "logprob": lp} for i, lp in zip(ids, lps, strict=True)]}
        for at, own, ids, lps in zip(
            kiln.positions, kiln.logprobs, kiln.top_ids, kiln.top_logprobs, strict=True
        )
    ]  # fmt: skip


def response_text(ctx: ExampleContext, seq_id: str, gen: Generated) -> str:
    """The generated ids decoded with the student tokenizer, special tokens skipped."""
    text = str(ctx.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
    if not text:
        # Kiln refuses an example whose teacher_response is empty (opd.rs).
        raise ProbeFailed(
            f"generation for prompt {seq_id!r}: the teacher's response decodes to empty text,"
            " which Kiln cannot train on",
            rule="generation.empty_response",
            hint="raise max_tokens or change the prompt",
        )
    return text


def encode_example(
    ctx: ExampleContext, seq_id: str, messages_json: str, prompt_sha256: str, gen: Generated
) -> bytes:
    """One example line (with its newline); see the module docstring."""
    example: dict[str, object] = {
        "id": seq_id,
        "messages": json.loads(messages_json),
        "teacher_response": response_text(ctx, seq_id, gen),
    }
    meta: dict[str, object] = {
        "format": META_FORMAT, "job_id": ctx.job_id, "teacher": ctx.teacher,
        "identity_digest": ctx.identity.digest(), "prompt_token_ids_sha256": prompt_sha256,
        "completion_token_ids": gen.token_ids, "finish_reason": gen.finish_reason,
        "settings": json.loads(ctx.settings.canonical_json()),
    }  # fmt: skip
    if ctx.settings.top_k > 0:
        assert gen.kiln is not None, "the pipeline scores Kiln's tokenization when top_k > 0"
        example["teacher_tokens"] = _teacher_tokens(ctx, gen.kiln)
        meta["kiln_token_ids"] = gen.kiln.sequence
        meta["kiln_action_positions"] = gen.kiln.positions
    example["metadata"] = meta
    return orjson.dumps(example, option=orjson.OPT_APPEND_NEWLINE)


def _seal(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


class ExampleWriter:
    """Streams a generation corpus into its claim's partial file; signs it detached."""

    def __init__(
        self, final: Path, identity: TeacherIdentity, signer: CorpusSigner, *, tag: str = LOCAL_TAG
    ) -> None:
        self.final = final
        self.signer = signer
        self.partial = partial_path(final, tag)
        self.sig_partial = partial_path(final, tag, SIGNATURE_SUFFIX)
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self._file: BinaryIO | None = os.fdopen(fd, "wb", buffering=1 << 20)
        self.write((off_policy_manifest(identity) + "\n").encode("utf-8"))

    def write(self, line: bytes) -> None:
        assert self._file is not None, "the corpus writer is closed"
        self._file.write(line)
        self.sha256.update(line)
        self.bytes += len(line)

    def seal(self) -> tuple[str, int]:
        """Sign the digest into the signature's partial file; fsync both; SHA-256 and size."""
        assert self._file is not None, "the corpus writer is closed"
        digest = self.sha256.hexdigest()
        line = trailer_line(digest, self.signer.public.key_id, self.signer.sign(digest).hex())
        fd = os.open(self.sig_partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as sig:
            sig.write(line)
            _seal(sig)
        _seal(self._file)
        self._file = None
        return digest, self.bytes

    def publish(self) -> None:
        """Rename ``<final>.sig`` then ``final`` into place; fsync the directory."""
        assert self._file is None, "seal the corpus before publishing it"
        os.replace(self.sig_partial, signature_path(self.final))
        os.replace(self.partial, self.final)
        fsync_dir(self.final.parent)

    def commit(self) -> tuple[str, int]:
        """``seal`` then ``publish``, for a writer with no claim to prove."""
        digest = self.seal()
        self.publish()
        return digest

    def discard(self) -> None:
        """Close; remove this claim's partial files."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.partial.unlink(missing_ok=True)
        self.sig_partial.unlink(missing_ok=True)


def result_headers(corpus: Path) -> dict[str, str]:
    """``GET /v1/jobs/{id}/result``'s extra header: Kiln reads every line of this corpus,
    so its signature is detached (``<corpus>.sig``) and sent beside it."""
    return {"x-kiln-corpus-signature": detached_signature(corpus)}
