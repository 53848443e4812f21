"""Submitting an off-policy generation job: pin the teacher, render and store the prompts.

The same rules as a scoring submission (``jobs.core.service``): the alias's
complete spec is pinned, every prompt is validated against the pinned
identity before anything is stored (so a bad prompt leaves no row), and the
insert transaction re-reads the alias and refuses (``JobConflict``) if it
changed meanwhile.  Prompts are rendered with the loaded student's chat
template (``jobs.generation.sources``); the job row records the canonical
sampling settings in ``generation_json`` and ``top_k``.

Call from a worker thread.  Imports: standard library, SQLAlchemy,
``kiln_registry.config.settings``/``domain`` and ``jobs``; never the API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
from kiln_registry.jobs.generation.repository import insert_prompts
from kiln_registry.jobs.generation.sources import (
    GenerationSettings,
    Prompts,
    corpus_prompts,
    inline_prompts,
    student_tokenizer,
)


@dataclass(frozen=True, slots=True)
class GenerationSubmission:
    """A validated request: exactly one of ``prompts`` and ``corpus_path``."""

    teacher: str
    settings: GenerationSettings
    prompts: Sequence[object] | None = None
    corpus_path: str | None = None


def load_prompts(
    config: KilnConfig, sub: GenerationSubmission, identity: TeacherIdentity
) -> Prompts:
    sub.settings.check(identity)
    if (sub.prompts is None) == (sub.corpus_path is None):
        raise JobInvalid("give exactly one of prompts and corpus", rule="job.source")
    tokenizer = student_tokenizer(config.student.model_path)
    if sub.prompts is not None:
        return inline_prompts(sub.prompts, tokenizer, identity, sub.settings)
    assert sub.corpus_path is not None
    return corpus_prompts(config.jobs.corpus_root, sub.corpus_path, tokenizer, identity,
                          sub.settings)  # fmt: skip


def submit_generation(
    config: KilnConfig,
    sessions: sessionmaker[Session],
    sub: GenerationSubmission,
    owner: str | None = None,
) -> JobRow:
    """Validate and queue a generation job for ``owner``; return its row (detached)."""
    pin = read_pin(sessions, sub.teacher)
    prompts = load_prompts(config, sub, pin.identity)

    def write(session: Session, job_id: str) -> JobRow:
        source = JobInput(len(prompts.items), prompts.token_count, prompts.corpus_path,
                          prompts.corpus_sha256)  # fmt: skip
        row = job_row(job_id, pin, JobKind.off_policy_generation.value, sub.settings.top_k,
                      source)  # fmt: skip
        row.generation_json = sub.settings.canonical_json()
        JobRepository(session).insert(row, [])
        insert_prompts(session, job_id, prompts.items)
        return row

    submitter = Submitter(config.jobs, owner)
    return insert_pinned(sessions, sub.teacher, pin, write, submitter, prompts.token_count)


def generation_submission(body: Any) -> GenerationSubmission:
    """The submission of a validated ``GenerationJobCreate`` body (the API's wire model)."""
    prompts = None
    if body.prompts is not None:
        prompts = [
            {**({"id": p.id} if p.id is not None else {}),
             "messages": [{"role": m.role, "content": m.content} for m in p.messages]}
            for p in body.prompts
        ]  # fmt: skip
    settings = GenerationSettings(
        max_tokens=body.max_tokens, top_k=body.top_k, temperature=float(body.temperature),
        top_p=float(body.top_p), seed=body.seed,
    )  # fmt: skip
    return GenerationSubmission(
        teacher=body.teacher, settings=settings, prompts=prompts,
        corpus_path=body.corpus.path if body.corpus is not None else None,
    )  # fmt: skip
