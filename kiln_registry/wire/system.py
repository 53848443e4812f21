"""Wire shapes every route shares: the error envelope, health and readiness.

The error envelope is Kiln's: ``{"error": {"code", "message", "hint", "rule"?}}``.
Imports pydantic and ``wire.base`` only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kiln_registry.wire.base import Count, WireModel


class ErrorDetail(WireModel):
    code: str = Field(min_length=1, description="Stable snake_case error code.")
    message: str = Field(
        description="What went wrong, in one line (never a secret or a submitted value)."
    )
    hint: str = Field(description="What to do next (always a string, possibly empty).")
    rule: str | None = Field(
        default=None, min_length=1, description="The dotted rule that failed, where one did."
    )


class ErrorResponse(WireModel):
    error: ErrorDetail = Field(
        description="The error: code, message, hint and (where one failed) rule."
    )


class HealthResponse(WireModel):
    status: Literal["ok"] = Field(default="ok", description="Always `ok` while the process serves.")


class LegacyRegistryReport(WireModel):
    """The last start-up import of ``[server] legacy_registry``; a refusal keeps the server up."""

    status: Literal["imported", "refused"] = Field(description="`imported` or `refused`.")
    path: str = Field(description="The legacy `teachers.json` read.")
    rule: str | None = Field(
        default=None, description="The rule that refused it; absent when imported."
    )
    message: str = Field(description="What happened, in one line.")


class WorkersReport(WireModel):
    """Job workers and the queue: a queued job no live worker will claim is never silent."""

    live: Count = Field(
        description="Job worker processes (`kiln worker`, or the workers embedded in `kiln serve`)"
        " whose heartbeat is younger than `[jobs] lease_timeout_s`."
    )
    embedded: bool = Field(description="`[jobs] embedded_workers`: this server runs workers too.")
    queued: Count = Field(description="Jobs waiting for a worker (status `queued`).")
    oldest_queued_age_s: float | None = Field(
        ge=0, description="Seconds the oldest queued job has waited, else null."
    )
    warning: str | None = Field(
        default=None,
        description="Set while jobs are queued and no worker is alive: what to start. `/ready`"
        " still answers 200 (readiness is the API's; alert on this field or"
        " `kiln_job_workers_live`).",
    )


class ReadyResponse(WireModel):
    status: Literal["ready", "starting"] = Field(
        description="`ready`, or `starting` while start-up work runs."
    )
    version: str = Field(description="The registry's release (the package version).")
    database_revision: str | None = Field(description="The database's Alembic revision, else null.")
    teachers: Count = Field(description="Registered aliases.")
    workers: WorkersReport = Field(description="Live job workers and the age of the queue.")
    legacy_registry: LegacyRegistryReport | None = Field(
        default=None, description="The last legacy registry import; absent when none is configured."
    )
