"""The registry's one vocabulary: teacher kinds and statuses, job kinds and statuses.

Every layer names these values through this module: the wire schemas
(``wire/teachers.py``, ``wire/jobs.py``), the CHECK constraints of the
rows (``db/models.py``, ``jobs/core/models.py``), the services and the job queue.
Members are ``StrEnum``s, so a member equals (and is stored as) its string.

Orders are part of the contract: ``TeacherKind`` lists its members in the
order the OpenAPI document shows them; the rows keep their own CHECK order
(see ``db/models.py``).  ``TeacherStatus.launching`` is internal: a local
teacher's placeholder row, published as ``unavailable``
(``# Remote first: the CLI's ``--kind`` choices and the teachers table's CHECK list.
TEACHER_KINDS_REMOTE_FIRST: Final[tuple[str, ...]] = (
    TeacherKind.remote.value,
    TeacherKind.local.value,
    TeacherKind.fixture.value,
)


PUBLISHED_TEACHER_STATUSES`` are the ones a response can carry).

Imports the standard library only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


# No class docstrings: pydantic would publish them as the schemas' descriptions.
# How a teacher is served: a remote vLLM endpoint, a local launch or a fixture.
class TeacherKind(StrEnum):
    fixture = "fixture"
    local = "local"
    remote = "remote"


# A registry row's status; ``launching`` never leaves the server.
class TeacherStatus(StrEnum):
    verified = "verified"
    configured = "configured"
    legacy_unverified = "legacy_unverified"
    unavailable = "unavailable"
    launching = "launching"


# Remote first: the CLI's ``--kind`` choices and the teachers table's CHECK list.
TEACHER_KINDS_REMOTE_FIRST: Final[tuple[str, ...]] = (
    TeacherKind.remote.value,
    TeacherKind.local.value,
    TeacherKind.fixture.value,
)


# Kiln's remote protocols (``kiln_train::RemoteProvider``, ``api.schemas.RemoteProvider``);
# a registration takes only ``vllm``, the one that can prove an identity.
KILN_REMOTE_PROVIDERS: Final[tuple[str, ...]] = (
    "vllm",
    "sglang",
    "llama_cpp",
    "open_router",
    "together",
    "fireworks",
    "deep_infra",
    "tgi",
)


PUBLISHED_TEACHER_STATUSES: Final[tuple[TeacherStatus, ...]] = (
    TeacherStatus.verified,
    TeacherStatus.configured,
    TeacherStatus.legacy_unverified,
    TeacherStatus.unavailable,
)


# What a job does: score given sequences, or generate an off-policy corpus.
class JobKind(StrEnum):
    teacher_scoring = "teacher_scoring"
    off_policy_generation = "off_policy_generation"


# queued -> probing -> running -> succeeded | failed | cancelled.
class JobStatus(StrEnum):
    queued = "queued"
    probing = "probing"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


# Tuples (ordered, so SQL ``IN`` lists and messages are stable); ``in`` tests membership.
ACTIVE_JOB_STATUSES: Final[tuple[JobStatus, ...]] = (JobStatus.probing, JobStatus.running)
TERMINAL_JOB_STATUSES: Final[tuple[JobStatus, ...]] = (
    JobStatus.succeeded,
    JobStatus.failed,
    JobStatus.cancelled,
)
