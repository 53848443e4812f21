"""Job submission's shared rules, lookup, cancellation and results: the queue's service layer.

Every job kind's submission (``jobs.scoring.submit``, ``jobs.generation.submit``,
dispatched from ``jobs.kinds``) pins the alias's complete spec (identity, URL,
credential id, model id, bounds, and the registry row's creation time, so a
delete and re-register is detected even with identical values) into the job
row (``job_row``), after validating every input row against the pinned
identity.  Unknown aliases are ``TeacherNotFound.in_job`` (``400
teacher_not_registered``); aliases without a verified, usable identity are
``IdentityRequired`` (the alias's kind decides:
``teachers.kinds``, ``check_pinnable``).  Inputs are read outside any transaction; the insert
transaction (``insert_pinned``) re-reads the alias and refuses
(``JobConflict``) if it changed meanwhile, and checks the queue's quotas
(``jobs.core.quotas``).  A job belongs to the token that submitted it
(``jobs.owner``); every lookup takes a ``viewer``: ``None`` (an admin token,
or auth off) sees every job, a token name only that token's jobs, and
another token's job is ``job_not_found`` like a missing one.

Call these from a worker thread (they block on SQLite and files).
Imports: standard library, SQLAlchemy, ``kiln_registry.config.settings``/``db``/
``errors``/``identity``, ``jobs.core`` and the teacher kind table; never the API layer
or a job kind.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.settings import JobsConfig, KilnConfig
from kiln_registry.db.engine import BEGIN_OPTION
from kiln_registry.db.models import TeacherRow, utc_timestamp
from kiln_registry.db.repository import TeacherRepository, unit_of_work
from kiln_registry.domain.errors import (
    JobConflict,
    TeacherNotFound,
)
from kiln_registry.domain.vocabulary import JobStatus
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.quotas import check_quotas
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.teachers.kinds import kind_of

RESULT_DIR_NAME = "job-results"


@dataclass(frozen=True, slots=True)
class PinnedTeacher:
    """The parts of a registry row a job pins and later compares (phase a)."""

    alias: str
    kind: str
    url: str
    credential_id: str | None
    model_id: str
    created_at: str
    identity_json: str
    identity_digest: str

    @property
    def identity(self) -> TeacherIdentity:
        return TeacherIdentity.from_canonical_json(self.identity_json)


def result_dir(config: KilnConfig) -> Path:
    """``[jobs] result_root``, or ``job-results`` beside the database."""
    return config.jobs.result_root or config.server.state_path / RESULT_DIR_NAME


def result_root(config: KilnConfig) -> Path:
    """``result_dir``, created (mode 0700) when a job first writes a corpus."""
    root = result_dir(config)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def pin_teacher(row: TeacherRow | None, alias: str) -> PinnedTeacher:
    """The pinnable spec of a usable alias, or the refusal Kiln clients expect."""
    if row is None:
        raise TeacherNotFound.in_job(
            f"teacher alias {alias!r} is not registered",
            hint="register the teacher first (POST /v1/teachers)",
        )
    kind_of(row.kind).check_pinnable(row, alias)  # the kind's refusal, if any
    assert row.identity_json and row.identity_digest and row.url and row.model_id
    identity = TeacherIdentity.from_canonical_json(row.identity_json)
    return PinnedTeacher(
        alias=row.alias,
        kind=row.kind,
        url=row.url,
        credential_id=row.credential_id,
        model_id=row.model_id,
        created_at=row.created_at,
        identity_json=row.identity_json,
        identity_digest=identity.digest(),
    )


def read_pin(sessions: sessionmaker[Session], alias: str) -> PinnedTeacher:
    with unit_of_work(sessions) as session:
        return pin_teacher(TeacherRepository(session).get(alias), alias)


@dataclass(frozen=True, slots=True)
class JobInput:
    """What a submission read: its row count, tokens and, from a corpus, its path and hash."""

    count: int
    token_count: int
    corpus_path: str | None = None
    corpus_sha256: str | None = None


def job_row(
    job_id: str, pin: PinnedTeacher, kind: str, top_k: int, source: JobInput,
    output: str | None = None,
) -> JobRow:  # fmt: skip
    """A new queued job of ``kind`` pinned to ``pin`` (the caller adds its input rows)."""
    now = utc_timestamp()
    return JobRow(
        id=job_id, kind=kind, status=JobStatus.queued.value,
        teacher_alias=pin.alias,
        teacher_kind=pin.kind, teacher_url=pin.url, teacher_credential_id=pin.credential_id,
        teacher_model_id=pin.model_id, teacher_created_at=pin.created_at,
        identity_json=pin.identity_json, identity_digest=pin.identity_digest, top_k=top_k,
        source="inline" if source.corpus_path is None else "corpus",
        corpus_path=source.corpus_path, corpus_sha256=source.corpus_sha256,
        sequence_count=source.count, token_count=source.token_count, device=None,
        claim_token=None, cancel_requested=0, attempts=0, scored_count=0, cache_hits=0,
        requests_sent=0, retries=0, created_at=now, updated_at=now, output=output,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Submitter:
    """Who submits a job (``owner``: the token's name, ``None`` with auth off) and the
    ``[jobs]`` quotas it is held to."""

    jobs: JobsConfig
    owner: str | None = None


def insert_pinned(
    sessions: sessionmaker[Session],
    alias: str,
    pin: PinnedTeacher,
    write: Callable[[Session, str], JobRow],
    submitter: Submitter,
    tokens: int,
) -> JobRow:
    """Insert a new job (``write(session, job_id)``) in one transaction that re-reads the
    alias (``JobConflict`` if it changed since ``pin`` was read) and checks the queue's
    quotas for ``tokens`` more input tokens (``JobQueueFull``).  Returns the detached row."""
    job_id = "job-" + secrets.token_hex(12)
    with unit_of_work(sessions) as session:
        if pin_teacher(TeacherRepository(session).get(alias), alias) != pin:
            raise JobConflict(
                f"teacher alias {alias!r} changed while the job was being submitted",
                hint="submit the job again",
            )
        check_quotas(session, submitter.jobs, submitter.owner, tokens)
        row = write(session, job_id)
        row.owner = submitter.owner
        session.flush()
        session.expunge(row)
        return row


def _read_only(session: Session) -> None:
    """Reads BEGIN DEFERRED: a status poll never waits for, or holds, the write lock."""
    session.connection(execution_options={BEGIN_OPTION: "DEFERRED"})


def get_job(sessions: sessionmaker[Session], job_id: str, viewer: str | None = None) -> JobRow:
    """The job (``viewer``: a non-admin token's name sees only its own jobs)."""
    with unit_of_work(sessions) as session:
        _read_only(session)
        row = JobRepository(session).require(job_id, viewer)
        session.expunge(row)
        return row


def list_jobs(
    sessions: sessionmaker[Session],
    *,
    limit: int = 100,
    status: str | None = None,
    before: tuple[str, str] | None = None,
    viewer: str | None = None,
) -> list[JobRow]:
    """Newest first; ``before`` is the ``(created_at, id)`` of the previous page's last job."""
    with unit_of_work(sessions) as session:
        _read_only(session)
        rows = JobRepository(session).list_jobs(
            limit=limit, status=status, before=before, viewer=viewer
        )
        session.expunge_all()
        return rows


def cancel_job(sessions: sessionmaker[Session], job_id: str, viewer: str | None = None) -> JobRow:
    with unit_of_work(sessions) as session:
        row = JobRepository(session).request_cancel(job_id, viewer)
        session.expunge(row)
        return row


def result_file(
    sessions: sessionmaker[Session], job_id: str, viewer: str | None = None
) -> tuple[JobRow, Path]:
    """The published corpus of a succeeded job; ``JobConflict`` otherwise."""
    row = get_job(sessions, job_id, viewer)
    if row.status != JobStatus.succeeded or row.result_path is None:
        raise JobConflict(
            f"job {job_id!r} is {row.status}; a result exists only once it has succeeded",
            hint="follow the job with `kiln jobs show --follow`",
        )
    path = Path(row.result_path)
    if not path.is_file() or path.stat().st_size != row.result_bytes:
        raise JobConflict(
            f"the result file of job {job_id!r} is missing or changed on disk",
            rule="job.result_missing",
        )
    return row, path
