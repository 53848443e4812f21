"""Wire schemas of the job API: ``JobCreate`` in, ``JobPublic``/``JobsListResponse`` out.

Inputs forbid unknown fields and use strict integers (``true`` or ``1.0`` is
never a token id).  Output models are built from a ``JobRow`` by
``job_public`` field by field, so the claim token and the pinned credential
id never reach a response.  Imports pydantic and ``jobs.models``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from kiln_registry.jobs.models import JobRow

MAX_INLINE_SEQUENCES = 10_000
MAX_INLINE_TOKENS = 1_000_000
JOB_ID_PATTERN = r"^job-[0-9a-f]{24}$"
JobStatus = Literal["queued", "probing", "running", "succeeded", "failed", "cancelled"]


class CorpusRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(
        min_length=1,
        max_length=4096,
        description='A JSONL file of `{"id", "token_ids"}` lines under `[jobs] corpus_root`'
        " (absolute, or relative to the root).",
    )


class JobCreate(BaseModel):
    """A teacher-scoring job: exactly one of `sequences` and `corpus`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["teacher_scoring"]
    teacher: str = Field(min_length=1, max_length=128, description="A registered teacher alias.")
    top_k: Annotated[
        StrictInt, Field(ge=1, le=65_536, description="K, 1..=the teacher's max_top_k.")
    ]
    sequences: (
        Annotated[
            list[Annotated[list[StrictInt], Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_INLINE_SEQUENCES),
        ]
        | None
    ) = None
    corpus: CorpusRef | None = None

    @model_validator(mode="after")
    def _one_source(self) -> JobCreate:
        if (self.sequences is None) == (self.corpus is None):
            raise ValueError("give exactly one of sequences and corpus")
        if self.sequences is not None and sum(map(len, self.sequences)) > MAX_INLINE_TOKENS:
            raise ValueError(f"inline sequences hold at most {MAX_INLINE_TOKENS} tokens in total")
        return self


class JobProgress(BaseModel):
    total: int = Field(description="Sequences in the job.")
    done: int = Field(description="Sequences written to the result (scored + cache hits).")
    scored: int
    cache_hits: int
    requests: int = Field(description="Scoring requests sent, retries included.")
    retries: int


class JobTimestamps(BaseModel):
    created_at: str
    claimed_at: str | None = Field(description="A worker claimed this attempt.")
    spec_checked_at: str | None = Field(description="Phase a: the registry still equals the pin.")
    probed_at: str | None = Field(description="Phase b: both probes matched the pinned identity.")
    leased_at: str | None = Field(description="Phase c: device leased, cache opened.")
    scoring_started_at: str | None = Field(description="Phase d: scoring began.")
    finished_at: str | None
    updated_at: str


class JobError(BaseModel):
    code: str
    rule: str | None
    message: str


class JobSource(BaseModel):
    kind: Literal["inline", "corpus"]
    path: str | None
    sha256: str | None


class JobResultInfo(BaseModel):
    bytes: int
    sha256: str


class JobPublic(BaseModel):
    id: str
    kind: Literal["teacher_scoring"]
    status: JobStatus
    teacher: str
    identity_revision: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    top_k: int
    source: JobSource
    device: str | None
    attempts: int
    cancel_requested: bool
    progress: JobProgress
    timestamps: JobTimestamps
    error: JobError | None
    result: JobResultInfo | None


class JobsListResponse(BaseModel):
    jobs: list[JobPublic]


def job_public(row: JobRow) -> JobPublic:
    error = None
    if row.error_code is not None:
        error = JobError(code=row.error_code, rule=row.error_rule, message=row.error_message or "")
    result = None
    if row.status == "succeeded" and row.result_sha256 is not None:
        result = JobResultInfo(bytes=row.result_bytes or 0, sha256=row.result_sha256)
    return JobPublic(
        id=row.id,
        kind="teacher_scoring",
        status=row.status,  # type: ignore[arg-type]
        teacher=row.teacher_alias,
        identity_revision="sha256:" + row.identity_digest,
        top_k=row.top_k,
        source=JobSource(kind=row.source, path=row.corpus_path, sha256=row.corpus_sha256),  # type: ignore[arg-type]
        device=row.device,
        attempts=row.attempts,
        cancel_requested=bool(row.cancel_requested),
        progress=JobProgress(
            total=row.sequence_count,
            done=row.scored_count + row.cache_hits,
            scored=row.scored_count,
            cache_hits=row.cache_hits,
            requests=row.requests_sent,
            retries=row.retries,
        ),
        timestamps=JobTimestamps(
            created_at=row.created_at,
            claimed_at=row.claimed_at,
            spec_checked_at=row.spec_checked_at,
            probed_at=row.probed_at,
            leased_at=row.leased_at,
            scoring_started_at=row.scoring_started_at,
            finished_at=row.finished_at,
            updated_at=row.updated_at,
        ),
        error=error,
        result=result,
    )
