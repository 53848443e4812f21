"""Wire schemas of the job API: ``JobCreate`` in, ``JobPublic``/``JobsListResponse`` out.

Inputs forbid unknown fields and use strict integers (``true`` or ``1.0`` is
never a token id).  The server builds the output models from a job row field
by field (``api.job_views.job_public``), so the claim token and the pinned
credential id never reach a response.  Imports pydantic, ``kiln_registry.domain``
(aliases, vocabulary) and ``wire.base`` only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from kiln_registry.domain.aliases import ALIAS_JSON_PATTERN, MAX_ALIAS_CHARS
from kiln_registry.domain.vocabulary import JobStatus as JobStatus
from kiln_registry.wire.base import Sha256Hex, Sha256Ref, WireModel

MAX_INLINE_SEQUENCES = 10_000
MAX_INLINE_TOKENS = 1_000_000
JOB_ID_PATTERN = r"^job-[0-9a-f]{24}$"
# A token id is a signed 64-bit value at most (issue 15: 2^63 was an OverflowError, a 500);
# the vocabulary bound itself is checked against the pinned identity at submission.
TokenId = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]


# The teacher of a job request (both kinds).
JobTeacher = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_ALIAS_CHARS,
        json_schema_extra={"pattern": ALIAS_JSON_PATTERN},
        description="A registered teacher alias (as registered; `/` allowed).",
    ),
]


class JobSourceKind(StrEnum):
    inline = "inline"
    corpus = "corpus"


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

    kind: Literal["teacher_scoring"] = Field(
        description="The job kind: `teacher_scoring` (the teacher's top-K logprobs for every "
        "position)."
    )
    teacher: JobTeacher
    top_k: Annotated[
        StrictInt, Field(ge=1, le=65_536, description="K, 1..=the teacher's max_top_k.")
    ]
    sequences: (
        Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_INLINE_SEQUENCES),
        ]
        | None
    ) = Field(
        default=None,
        description="Inline token-id sequences, 1..=10000 of them and 1,000,000 ids in all"
        " (exactly one of `sequences` and `corpus`).",
    )
    corpus: CorpusRef | None = Field(
        default=None,
        description="A corpus file on the server (exactly one of `sequences` and `corpus`).",
    )
    output: Literal["kiln-logit-cache-v3"] | None = Field(
        default=None,
        description="`kiln-logit-cache-v3`: besides its signed corpus, the job publishes every"
        " row as an entry of Kiln's logit cache v3 under `[jobs] logit_cache_root` (merged by"
        " Kiln's rules) before it succeeds.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> JobCreate:
        if (self.sequences is None) == (self.corpus is None):
            raise ValueError("give exactly one of sequences and corpus")
        if self.sequences is not None and sum(map(len, self.sequences)) > MAX_INLINE_TOKENS:
            raise ValueError(f"inline sequences hold at most {MAX_INLINE_TOKENS} tokens in total")
        return self


class ChatMessageIn(BaseModel):
    """Kiln's `ChatMessage`: a role and its text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"] = Field(
        description="Who speaks: `system`, `user` or `assistant` (Kiln's `ChatMessage`)."
    )
    content: str = Field(max_length=1 << 20, description="The message text (at most 1 MiB).")


class PromptIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = Field(
        default=None, min_length=1, max_length=256, description="Default: the prompt's index."
    )
    messages: list[ChatMessageIn] = Field(
        min_length=1,
        max_length=256,
        description="The conversation to continue, 1..=256 messages, rendered with the student's "
        "chat template.",
    )


class GenerationJobCreate(BaseModel):
    """An off-policy generation job: exactly one of `prompts` and `corpus`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["off_policy_generation"] = Field(
        description="The job kind: `off_policy_generation`."
    )
    teacher: JobTeacher
    max_tokens: Annotated[StrictInt, Field(ge=1, le=32_768, description="Tokens per prompt.")]
    top_k: Annotated[
        StrictInt,
        Field(
            ge=0,
            le=65_536,
            description="teacher_tokens top-K, 0..=max_top_k (0: text only, which Kiln's"
            " production trainer cannot use: it refuses cross_entropy; it trains at 16 or 32).",
        ),
    ] = 0
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="0 = greedy.")
    top_p: float = Field(
        default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass, in (0, 1]; 1 disables it."
    )
    seed: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = Field(
        default=None, description="Sampling seed (0..=2^63-1); omit for none."
    )
    prompts: list[PromptIn] | None = Field(
        default=None,
        min_length=1,
        max_length=10_000,
        description="Inline prompts, 1..=10000 (exactly one of `prompts` and `corpus`).",
    )
    corpus: CorpusRef | None = Field(
        default=None, description='A JSONL file of `{"id", "messages"}` lines.'
    )

    @model_validator(mode="after")
    def _one_source(self) -> GenerationJobCreate:
        if (self.prompts is None) == (self.corpus is None):
            raise ValueError("give exactly one of prompts and corpus")
        return self


AnyJobCreate = Annotated[JobCreate | GenerationJobCreate, Field(discriminator="kind")]


KILN_TEXT_ONLY_NOTE = (
    "text only (top_k 0): the corpus has no teacher_tokens, and Kiln's production OPD trainer"
    " refuses objective cross_entropy and needs teacher_tokens for reverse_kl, so Kiln cannot"
    " train on it; submit top_k 16 or 32 for a trainable corpus"
)
KILN_SMALL_K_NOTE = (
    "Kiln's production OPD trainer runs reverse_kl at top_k 16 or 32 and needs at least that"
    " many top_logprobs per teacher token; a corpus below top_k 16 only suits other readers"
)


def kiln_note(top_k: int) -> str | None:
    """What Kiln's production trainer makes of a generation corpus at ``top_k``."""
    if top_k == 0:
        return KILN_TEXT_ONLY_NOTE
    return KILN_SMALL_K_NOTE if top_k < 16 else None


class GenerationInfo(WireModel):
    max_tokens: int = Field(description="Tokens generated per prompt at most.")
    temperature: float = Field(description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(description="Nucleus sampling mass.")
    seed: int | None = Field(description="Sampling seed, or null for none.")
    kiln_note: str | None = Field(
        default=None,
        description="Set when Kiln's production trainer cannot use the corpus as is: top_k 0"
        " (no teacher_tokens; Kiln refuses cross_entropy) or top_k below 16.",
    )


class JobProgress(WireModel):
    total: int = Field(ge=0, description="Sequences in the job.")
    done: int = Field(ge=0, description="Sequences written to the result (scored + cache hits).")
    scored: int = Field(ge=0, description="Sequences scored by the teacher in this job.")
    cache_hits: int = Field(
        ge=0,
        description="Sequences answered from the score cache (same identity, K and token ids).",
    )
    requests: int = Field(ge=0, description="Scoring requests sent, retries included.")
    retries: int = Field(
        ge=0, description="Scoring requests sent again after a connection failure or HTTP 503."
    )


class JobTimestamps(WireModel):
    created_at: str = Field(description="When the job was submitted (UTC, RFC 3339).")
    claimed_at: str | None = Field(description="A worker claimed this attempt.")
    spec_checked_at: str | None = Field(description="Phase a: the registry still equals the pin.")
    probed_at: str | None = Field(description="Phase b: both probes matched the pinned identity.")
    leased_at: str | None = Field(description="Phase c: device leased, cache opened.")
    scoring_started_at: str | None = Field(description="Phase d: scoring began.")
    finished_at: str | None = Field(
        description="When the job reached a terminal status, else null."
    )
    updated_at: str = Field(description="The last change to the job.")


class JobError(WireModel):
    code: str = Field(description="Stable snake_case error code (as in the error envelope).")
    rule: str | None = Field(description="The dotted rule that failed, where one did.")
    message: str = Field(description="What went wrong, in one line.")


class JobSource(WireModel):
    kind: JobSourceKind = Field(
        description="`inline` (sequences or prompts in the request) or `corpus` (a file under "
        "`[jobs] corpus_root`)."
    )
    path: str | None = Field(
        description="The corpus path relative to `[jobs] corpus_root`; null for inline input."
    )
    sha256: Sha256Hex | None = Field(
        description="SHA-256 of the corpus file as read at submission; null for inline input."
    )


class JobResultInfo(WireModel):
    bytes: int = Field(ge=0, description="Size of the result corpus in bytes.")
    sha256: Sha256Hex = Field(
        description="SHA-256 of the whole result corpus (also sent as `x-kiln-result-sha256`)."
    )


class JobPublic(WireModel):
    id: str = Field(description="The job id, `job-` + 24 lowercase hex digits.")
    kind: Literal["teacher_scoring", "off_policy_generation"] = Field(
        description="The job kind: `teacher_scoring` or `off_policy_generation`."
    )
    status: JobStatus = Field(
        description="queued -> probing -> running -> succeeded | failed | cancelled."
    )
    teacher: str = Field(description="The teacher alias the job pinned at submission.")
    identity_revision: Sha256Ref = Field(
        description="The pinned teacher identity (`sha256:` + identity digest)."
    )
    top_k: int = Field(ge=0, le=65_536, description="0 only for text-only generation jobs.")
    generation: GenerationInfo | None = Field(
        default=None, description="Sampling settings of an off_policy_generation job."
    )
    source: JobSource = Field(description="Where the input came from.")
    device: str | None = Field(
        description="The device lease the job holds or held (`[jobs] devices`), else null."
    )
    attempts: int = Field(
        ge=0, description="How many times a worker claimed the job (a restart re-queues it)."
    )
    cancel_requested: bool = Field(
        description="Cancellation was asked for; a running job stops at its next request boundary."
    )
    progress: JobProgress = Field(description="Counters of the current attempt.")
    timestamps: JobTimestamps = Field(
        description="When each phase of the current attempt happened."
    )
    error: JobError | None = Field(description="Why the job failed, else null.")
    result: JobResultInfo | None = Field(
        description="The result corpus of a succeeded job, else null."
    )
    output: Literal["kiln-logit-cache-v3"] | None = Field(
        default=None,
        description="`kiln-logit-cache-v3` when the job also publishes Kiln logit-cache entries.",
    )
    waiting: str | None = Field(
        default=None,
        description="Set on a queued job while no job worker is alive (`/ready` `workers`):"
        " `no worker has claimed this job; start `kiln worker``.",
    )


class JobsListResponse(WireModel):
    jobs: list[JobPublic] = Field(description="Jobs, newest first.")
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last."
    )


class DeleteJobResponse(WireModel):
    status: Literal["deleted"] = Field(default="deleted", description="Always `deleted`.")
    id: str = Field(pattern=JOB_ID_PATTERN, description="The removed job's id.")
