"""The job kinds as a table: what the API, the runner and ``kiln corpus`` consult per kind.

``KINDS`` maps each ``JobKind`` value to a ``JobKindSpec``: how a validated
request body becomes the kind's submission and is queued (``submission``,
``submit``), which phase-(d) pipeline runs the job once the spec check,
probes and device lease passed (``pipeline``: it receives the job's proved
endpoints, ``jobs.core.endpoints``, so every kind spreads over a replica
set), what the result download adds (``result_headers``), and which corpora
the kind wrote and how they are verified (``owns_corpus``, ``verify``).  The
request models themselves are the API's (one discriminated union on
``kind``); the database's CHECK constraint on ``jobs.kind`` lists the kinds
too (``jobs.core.models``, changed by a migration).

Adding a job kind: a package beside ``jobs/scoring`` and ``jobs/generation``
with its submission, pipeline (an ``OrderedPipeline`` whose requests go
through ``JobTeachers.call``) and verifier; one entry here; the vocabulary
value (``domain.vocabulary.JobKind``); the request model in the API; and a
migration for the CHECK constraint.

Imports: standard library, SQLAlchemy's session types, ``kiln_registry.config``/
``domain`` and ``jobs``; never the API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.settings import KilnConfig
from kiln_registry.domain.errors import InputError, JobInvalid
from kiln_registry.domain.vocabulary import JobKind
from kiln_registry.jobs.core.endpoints import JobTeachers
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.signing import PublicKey, signature_path
from kiln_registry.jobs.core.state import ClaimedJob
from kiln_registry.jobs.generation import output as generation_output
from kiln_registry.jobs.generation.pipeline import generation_pipeline
from kiln_registry.jobs.generation.submit import generation_submission, submit_generation
from kiln_registry.jobs.generation.verify import verify_generation_corpus
from kiln_registry.jobs.scoring.corpus_signed import CorpusSummary, Progress
from kiln_registry.jobs.scoring.corpus_verify import verify_scoring_corpus
from kiln_registry.jobs.scoring.pipeline import scoring_pipeline
from kiln_registry.jobs.scoring.submit import scoring_submission, submit_job


class JobPipeline(Protocol):
    """Phase (d) of one claimed job (``jobs.core.ordered_pipeline.OrderedPipeline``)."""

    async def run(self) -> None: ...

    def discard(self) -> None: ...


Submit = Callable[[KilnConfig, sessionmaker[Session], Any, str | None], JobRow]
StartPipeline = Callable[[ClaimedJob, JobTeachers], Awaitable[JobPipeline]]
Verify = Callable[[Path, dict[str, PublicKey], Progress | None], CorpusSummary]


@dataclass(frozen=True, slots=True)
class JobKindSpec:
    """Everything kind-specific about a job; see the module docstring."""

    kind: str
    submission: Callable[[Any], Any]  # the API's validated request body -> ``submit``'s input
    submit: Submit  # (config, sessions, submission, owner) -> the queued row (detached)
    pipeline: StartPipeline
    result_headers: Callable[[Path], dict[str, str]]  # the corpus -> extra response headers
    owns_corpus: Callable[[Path], bool]  # whether a corpus file is of this kind
    verify: Verify


def _no_headers(corpus: Path) -> dict[str, str]:
    return {}


def _has_signature(corpus: Path) -> bool:
    return signature_path(corpus).is_file()


def _has_trailer(corpus: Path) -> bool:
    return not _has_signature(corpus)


KINDS: dict[str, JobKindSpec] = {
    JobKind.teacher_scoring.value: JobKindSpec(
        kind=JobKind.teacher_scoring.value, submission=scoring_submission, submit=submit_job,
        pipeline=scoring_pipeline, result_headers=_no_headers, owns_corpus=_has_trailer,
        verify=verify_scoring_corpus,
    ),
    JobKind.off_policy_generation.value: JobKindSpec(
        kind=JobKind.off_policy_generation.value, submission=generation_submission,
        submit=submit_generation, pipeline=generation_pipeline,
        result_headers=generation_output.result_headers, owns_corpus=_has_signature,
        verify=verify_generation_corpus,
    ),
}  # fmt: skip


def job_kind(kind: str) -> JobKindSpec:
    """The spec of ``kind``; a kind this registry does not know fails closed."""
    spec = KINDS.get(kind)
    if spec is None:
        raise JobInvalid(
            f"kind: unknown job kind {kind!r}",
            rule="job.kind",
            hint=f"use one of {', '.join(sorted(KINDS))}",
        )
    return spec


def verify_corpus(
    path: Path, keys: dict[str, PublicKey], on_progress: Progress | None = None
) -> CorpusSummary:
    """Verify any job's corpus with its kind's verifier (signature first, then every line):
    one with a detached ``<corpus>.sig`` is an off-policy generation corpus, else a
    teacher-scoring corpus with its trailer line."""
    for spec in KINDS.values():
        if spec.owns_corpus(path):
            return spec.verify(path, keys, on_progress)
    raise InputError(f"{path}: no job kind reads this corpus", rule="corpus.kind")
