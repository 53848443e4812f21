"""Wire shapes of the admin routes (``GET /v1/audit``, alias release).

Shared by the route (``api.routes.admin``) and the client.  An audit event
names a token, never holds one.  Imports pydantic and ``api.schemas``.
"""

from __future__ import annotations

from pydantic import Field

from kiln_registry.api.schemas import WireModel


class AuditEvent(WireModel):
    """One state change: when, by which token, what, on which alias or job, outcome."""

    id: int
    at: str
    token: str | None
    action: str
    target: str | None
    outcome: str
    status: int | None


class AuditResponse(WireModel):
    events: list[AuditEvent]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last."
    )


class ReleaseResponse(WireModel):
    alias: str
    released: bool
