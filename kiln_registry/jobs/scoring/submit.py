"""Submitting a teacher-scoring job: pin the teacher, validate and store the sequences.

The shared rules are ``jobs.core.service``'s: the alias's complete spec is
pinned, every sequence is validated against the pinned identity before
anything is stored (``jobs.scoring.sources``; a bad sequence leaves no row),
and the insert transaction re-reads the alias and checks the quotas.
``output`` ``kiln-logit-cache-v3`` (the job also publishes Kiln logit-cache
entries) needs ``[jobs] logit_cache_root``.

Call from a worker thread.  Imports: standard library, SQLAlchemy,
``kiln_registry.config.settings``/``domain``/``identity`` and ``jobs``; never the API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.settings import KilnConfig
from kiln_registry.domain.errors import JobInvalid
from kiln_registry.domain.vocabulary import JobKind
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.core.service import (
    JobInput,
    Submitter,
    insert_pinned,
    job_row,
    read_pin,
)
from kiln_registry.jobs.scoring.sources import LoadedSequences, corpus_sequences, inline_sequences

LOGIT_CACHE_OUTPUT: Final = "kiln-logit-cache-v3"


@dataclass(frozen=True, slots=True)
class JobSubmission:
    """A validated request: exactly one of ``sequences`` and ``corpus_path``."""

    teacher: str
    top_k: int
    sequences: Sequence[Sequence[object]] | None = None
    corpus_path: str | None = None
    output: str | None = None  # LOGIT_CACHE_OUTPUT: also publish into [jobs] logit_cache_root


def load_sequences(
    config: KilnConfig, sub: JobSubmission, identity: TeacherIdentity
) -> LoadedSequences:
    if not 1 <= sub.top_k <= identity.max_top_k:
        raise JobInvalid(
            f"top_k: {sub.top_k} is outside 1..={identity.max_top_k} (the teacher's max_top_k)",
            rule="job.top_k",
        )
    if sub.output not in (None, LOGIT_CACHE_OUTPUT):
        raise JobInvalid(f"output: unknown output {sub.output!r}", rule="job.output")
    if sub.output is not None and config.jobs.logit_cache_root is None:
        raise JobInvalid(
            f'output: "{LOGIT_CACHE_OUTPUT}" needs [jobs] logit_cache_root, which is not set',
            rule="job.logit_cache_root",
            hint="set [jobs] logit_cache_root in kiln.toml to the Kiln logit cache root,"
            " or submit without output and use `kiln corpus export`",
        )
    if (sub.sequences is None) == (sub.corpus_path is None):
        raise JobInvalid("give exactly one of sequences and corpus", rule="job.source")
    if sub.sequences is not None:
        return inline_sequences(sub.sequences, identity, sub.top_k)
    assert sub.corpus_path is not None
    return corpus_sequences(config.jobs.corpus_root, sub.corpus_path, identity, sub.top_k)


def job_input(loaded: LoadedSequences) -> JobInput:
    """The job row's view of what a submission read."""
    return JobInput(len(loaded.sequences), loaded.token_count, loaded.corpus_path,
                    loaded.corpus_sha256)  # fmt: skip


def submit_job(
    config: KilnConfig,
    sessions: sessionmaker[Session],
    sub: JobSubmission,
    owner: str | None = None,
) -> JobRow:
    """Validate and queue a scoring job for ``owner``; return its row (detached)."""
    pin = read_pin(sessions, sub.teacher)
    loaded = load_sequences(config, sub, pin.identity)

    def write(session: Session, job_id: str) -> JobRow:
        row = job_row(job_id, pin, JobKind.teacher_scoring.value, sub.top_k,
                      job_input(loaded), sub.output)  # fmt: skip
        items = [(s.seq_id, s.tokens, s.sha256) for s in loaded.sequences]
        JobRepository(session).insert(row, items)
        return row

    submitter = Submitter(config.jobs, owner)
    return insert_pinned(sessions, sub.teacher, pin, write, submitter, loaded.token_count)


def scoring_submission(body: Any) -> JobSubmission:
    """The submission of a validated ``JobCreate`` body (the API's wire model)."""
    return JobSubmission(
        teacher=body.teacher, top_k=body.top_k, sequences=body.sequences,
        corpus_path=body.corpus.path if body.corpus is not None else None, output=body.output,
    )  # fmt: skip
