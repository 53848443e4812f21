"""Off-policy generation corpora in Kiln's format, their detached signature, and the cache.

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

The cache: ``generation_cache`` rows keyed by (identity digest, settings
SHA-256, prompt ids SHA-256) hold a verified ``Generated`` as JSON; only
deterministic settings are cached (the caller's rule).

Imports: standard library, orjson, SQLAlchemy, ``kiln_registry.db``/
``identity`` and ``jobs``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from kiln_registry.db.models import utc_timestamp
from kiln_registry.db.repository import insert_ignoring_duplicates
from kiln_registry.domain.errors import JobConflict, KilnError, ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.off_policy import off_policy_manifest
from kiln_registry.identity.strict_read import FileProblem, Problem, read_regular_file
from kiln_registry.jobs.core.models import GenerationCacheRow
from kiln_registry.jobs.core.signing import CorpusSigner, fsync_dir
from kiln_registry.jobs.generation.sources import GenerationSettings
from kiln_registry.jobs.generation.wire import Generated, KilnTokens
from kiln_registry.jobs.scoring.cache import LOOKUP_CHUNK
from kiln_registry.jobs.scoring.corpus import LOCAL_TAG, partial_path, trailer_line

META_FORMAT: Final = "kiln-registry.generation.v2"
META_FORMAT_V1: Final = "kiln-registry.generation.v1"  # teacher_tokens = sampled ids
EXAMPLE_KEYS: Final = ("id", "messages", "teacher_response", "teacher_tokens", "metadata")
SIGNATURE_SUFFIX: Final = ".sig"
MAX_SIGNATURE_BYTES: Final = 1024


def signature_path(corpus: Path) -> Path:
    return corpus.with_name(corpus.name + SIGNATURE_SUFFIX)


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


# -- the generation cache --------------------------------------------------------


def cache_lookup(
    session: Session, identity_digest: str, settings_sha256: str, prompts: Sequence[str]
) -> dict[str, Generated]:
    """Cached generations of ``prompts`` (ids SHA-256s); rows that do not decode are skipped."""
    found: dict[str, Generated] = {}
    for start in range(0, len(prompts), LOOKUP_CHUNK):
        chunk = list(prompts[start : start + LOOKUP_CHUNK])
        rows = session.execute(
            select(GenerationCacheRow.prompt_sha256, GenerationCacheRow.result_json).where(
                GenerationCacheRow.identity_digest == identity_digest,
                GenerationCacheRow.settings_sha256 == settings_sha256,
                GenerationCacheRow.prompt_sha256.in_(chunk),
            )
        )
        for sha, text in rows:
            try:
                found[sha] = Generated.from_json(json.loads(text))
            except (ValueError, KeyError, TypeError):
                continue
    return found


def cache_store(
    session: Session, identity_digest: str, settings_sha256: str,
    items: Iterable[tuple[str, Generated]],
) -> None:  # fmt: skip
    now = utc_timestamp()
    values = [
        {"identity_digest": identity_digest, "settings_sha256": settings_sha256,
         "prompt_sha256": sha, "result_json": json.dumps(gen.to_json(), separators=(",", ":")),
         "created_at": now}
        for sha, gen in items
    ]  # fmt: skip
    if values:
        session.execute(insert_ignoring_duplicates(session, GenerationCacheRow).values(values))


# -- the prompts of a job ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptItem:
    idx: int
    seq_id: str
    token_ids: list[int]
    token_sha256: str
    messages_json: str


def insert_prompts(session: Session, job_id: str, items: Sequence[tuple[Any, str]]) -> None:
    """Store a job's prompts (``(JobSequence, messages_json)``) in pages."""
    from sqlalchemy import insert

    from kiln_registry.jobs.core.models import JobSequenceRow

    for start in range(0, len(items), LOOKUP_CHUNK):
        session.execute(
            insert(JobSequenceRow),
            [
                {"job_id": job_id, "idx": start + i, "seq_id": seq.seq_id,
                 "token_ids": seq.tokens, "token_sha256": seq.sha256, "messages_json": messages}
                for i, (seq, messages) in enumerate(items[start : start + LOOKUP_CHUNK])
            ],
        )  # fmt: skip


def prompt_page(session: Session, job_id: str, *, after: int, limit: int) -> list[PromptItem]:
    from kiln_registry.jobs.core.models import JobSequenceRow

    rows = session.execute(
        select(JobSequenceRow.idx, JobSequenceRow.seq_id, JobSequenceRow.token_ids,
               JobSequenceRow.token_sha256, JobSequenceRow.messages_json)
        .where(JobSequenceRow.job_id == job_id, JobSequenceRow.idx > after)
        .order_by(JobSequenceRow.idx)
        .limit(limit)
    )  # fmt: skip
    return [
        PromptItem(idx, seq_id, [int.from_bytes(data[i : i + 4], "little")
                                 for i in range(0, len(data), 4)], sha, messages or "[]")
        for idx, seq_id, data, sha, messages in rows
    ]  # fmt: skip
