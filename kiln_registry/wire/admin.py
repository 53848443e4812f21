"""Wire shapes of the admin routes (``GET /v1/audit``, alias release).

Shared by the route (``api.routes.admin``) and the client.  An audit event
names a token, never holds one.  Imports pydantic and ``wire.base`` only.
"""

from __future__ import annotations

from pydantic import Field

from kiln_registry.wire.base import WireModel


class AuditEvent(WireModel):
    """One state change: when, by which token, what, on which alias or job, outcome."""

    id: int = Field(description="Event number (ascending; pass as `before` to page back).")
    at: str = Field(description="When it happened (UTC, RFC 3339).")
    token: str | None = Field(
        description="The name of the token that acted (never the token), else null."
    )
    action: str = Field(
        description="What was done, e.g. `teacher.register`, `job.cancel`, `token.create`."
    )
    target: str | None = Field(description="The alias, job id or token name acted on, else null.")
    outcome: str = Field(description="`ok`, or the error code of a refusal.")
    status: int | None = Field(
        description="The HTTP status answered, else null (command-line actions)."
    )


class AuditResponse(WireModel):
    events: list[AuditEvent] = Field(description="Audit events, newest first.")
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last."
    )


class ReleaseResponse(WireModel):
    alias: str = Field(description="The alias released.")
    released: bool = Field(description="True: the alias can be registered again.")
