"""The ``[server]`` and ``[jobs]`` keys that confine what callers can do (issue 15).

``ServerGuardKeys`` is mixed into ``ServerConfig``; ``JobsGuardKeys`` into
``JobsConfig``.  The ``[server]`` keys:

* ``allowed_hosts``: the ``Host`` header values served (a name or address,
  with or without a port; ``*`` serves any).  Unset: the bound address,
  ``localhost`` and the loopback names (``api.host_guard``).
* ``cors_origins``: exact ``scheme://host[:port]`` origins that get CORS
  headers; empty (the default) sends none.
* ``teacher_hosts``: host patterns a teacher URL may name (``*.example.org``
  matches sub-domains, ``*`` any); unset allows loopback and the configured
  credential origins (``teachers.host_rules.teacher_host_patterns``).
* ``max_teachers``: the most aliases the registry holds (default 10000).
* ``max_reserved_aliases``: the most deleted aliases kept reserved (default
  100000); past it a delete is refused until an admin releases some.
* ``audit_max_events``: the audit log keeps the newest this many events
  (default 1000000); older ones are dropped as new ones are written, but
  never one younger than ``audit_keep_days``.
* ``audit_keep_days``: the retention guarantee (default 30): no event younger
  than this is ever dropped; a log full of such events refuses new state
  changes (503 ``audit_log_full``) rather than forgetting old ones.
* ``audit_retain_days``: events older than this many days are dropped as new
  ones are written (default: unset, only the count cap applies).

The ``[jobs]`` keys (issue 27 item 8: growth is bounded):

* ``retain_days``: finished jobs (succeeded, failed, cancelled) older than
  this many days are deleted with their results by the job workers (default
  30).
* ``max_queued_jobs`` / ``max_queued_tokens``: the most active (queued,
  probing, running) jobs, and input tokens in them, the registry holds
  (default 1000 jobs, 256,000,000 tokens); past either a submission is
  ``429 job_queue_full``.
* ``max_queued_jobs_per_token`` / ``max_queued_tokens_per_token``: the same
  for the jobs of one token (all of auth-off's callers are one) (default 100
  jobs, 64,000,000 tokens: one maximal corpus job).

Imports pydantic, the standard library and ``kiln_registry.domain.text`` only.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

from kiln_registry.domain.text import quoted

_FROZEN = ConfigDict(extra="forbid", frozen=True)
MAX_PATTERNS = 256
_HOST_PATTERN = re.compile(
    r"(\*|(\*\.)?[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?|\[[0-9a-f:.]+\])(:\d{1,5})?"
)
_ORIGIN = re.compile(r"https?://([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?|\[[0-9a-f:.]+\])(:\d{1,5})?")


def _check_host_pattern(value: str) -> str:
    if not _HOST_PATTERN.fullmatch(value) or ".." in value:
        raise ValueError(
            f"{quoted(value, 80)} is not a host pattern: use a lowercase name or address,"
            " optionally with :port, '*.' for sub-domains, or '*' for any (IPv6 in brackets)"
        )
    return value


def _check_origin(value: str) -> str:
    if not _ORIGIN.fullmatch(value):
        raise ValueError(
            f"{quoted(value, 80)} is not an origin: use scheme://host[:port] in lowercase, no path"
        )
    return value


HostPattern = Annotated[str, AfterValidator(_check_host_pattern)]
Origin = Annotated[str, AfterValidator(_check_origin)]


class ServerGuardKeys(BaseModel):
    model_config = _FROZEN

    allowed_hosts: Annotated[tuple[HostPattern, ...], Field(max_length=MAX_PATTERNS)] | None = None
    cors_origins: Annotated[tuple[Origin, ...], Field(max_length=MAX_PATTERNS)] = ()
    teacher_hosts: Annotated[tuple[HostPattern, ...], Field(max_length=MAX_PATTERNS)] | None = None
    max_teachers: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 10_000
    max_reserved_aliases: Annotated[StrictInt, Field(ge=1, le=10_000_000)] = 100_000
    audit_max_events: Annotated[StrictInt, Field(ge=1000, le=100_000_000)] = 1_000_000
    audit_retain_days: Annotated[StrictInt, Field(ge=1, le=36_500)] | None = None
    audit_keep_days: Annotated[StrictInt, Field(ge=1, le=36_500)] = 30

    @model_validator(mode="after")
    def _audit_days(self) -> ServerGuardKeys:
        if self.audit_retain_days is not None and self.audit_retain_days < self.audit_keep_days:
            raise ValueError(
                "audit_retain_days must be at least audit_keep_days (events younger than"
                " audit_keep_days are never dropped)"
            )
        return self


class JobsGuardKeys(BaseModel):
    """``[jobs]`` keys of issues 15 and 27: retention and the queue's quotas."""

    model_config = _FROZEN

    retain_days: Annotated[StrictInt, Field(ge=1, le=36_500)] = 30
    max_queued_jobs: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 1_000
    max_queued_tokens: Annotated[StrictInt, Field(ge=1, le=1 << 40)] = 256_000_000
    max_queued_jobs_per_token: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 100
    max_queued_tokens_per_token: Annotated[StrictInt, Field(ge=1, le=1 << 40)] = 64_000_000
