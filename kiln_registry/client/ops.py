"""One constructor per registry API operation, shared by both clients.

Each function checks its arguments (alias, job id, limit, status) before
anything is sent and returns a ``client_base.Call``: method, path with its
query, JSON body and the parser of the answer into the wire schema.
``RegistryClient`` and ``AsyncRegistryClient`` run the same calls.  Imports
pydantic, ``client_base`` and the wire schemas; never httpx.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from kiln_registry.api.jobs_schemas import (
    DeleteJobResponse,
    JobPublic,
    JobsListResponse,
    JobStatus,
)
from kiln_registry.api.schemas import (
    DeleteTeacherResponse,
    HealthResponse,
    ProbeReceipt,
    ProbeReportPublic,
    ReadyResponse,
    ReceiptsResponse,
    TeacherEntry,
    TeachersListResponse,
)
from kiln_registry.auth.wire import AuditEvent, AuditResponse, ReleaseResponse
from kiln_registry.client.base import Call, alias_path, call, check_limit, job_id_path
from kiln_registry.domain.errors import InputError


def _query(**params: object) -> str:
    pairs = {k: str(v) for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


def health() -> Call[HealthResponse]:
    return call("GET", "/health", HealthResponse)


def ready() -> Call[ReadyResponse]:
    return call("GET", "/ready", ReadyResponse)


def teachers_page(limit: int | None, cursor: str | None) -> Call[TeachersListResponse]:
    limit = None if limit is None else check_limit(limit)
    return call("GET", "/v1/teachers" + _query(limit=limit, cursor=cursor), TeachersListResponse)


def get_teacher(alias: str) -> Call[TeacherEntry]:
    return call("GET", f"/v1/teachers/{alias_path(alias)}", TeacherEntry)


def register_teacher(fields: Mapping[str, str | None]) -> Call[TeacherEntry]:
    """``POST /v1/teachers``; fields left as None are not sent (the server validates)."""
    body = {name: value for name, value in fields.items() if value is not None}
    return call("POST", "/v1/teachers", TeacherEntry, body)


def delete_teacher(alias: str) -> Call[DeleteTeacherResponse]:
    return call("DELETE", f"/v1/teachers/{alias_path(alias)}", DeleteTeacherResponse)


def probe_teacher(alias: str) -> Call[ProbeReportPublic]:
    return call("POST", f"/v1/teachers/{alias_path(alias)}/probe", ProbeReportPublic)


def launch_teacher(alias: str) -> Call[TeacherEntry]:
    return call("POST", f"/v1/teachers/{alias_path(alias)}/launch", TeacherEntry)


def receipts(alias: str, limit: int) -> Call[list[ProbeReceipt]]:
    path = f"/v1/teachers/{alias_path(alias)}/receipts" + _query(limit=check_limit(limit))
    inner = call("GET", path, ReceiptsResponse)
    return Call("GET", path, lambda data: inner.parse(data).receipts)


def audit(limit: int, before: int | None) -> Call[list[AuditEvent]]:
    path = "/v1/audit" + _query(limit=check_limit(limit), before=before)
    inner = call("GET", path, AuditResponse)
    return Call("GET", path, lambda data: inner.parse(data).events)


def release_alias(alias: str) -> Call[ReleaseResponse]:
    return call("POST", f"/v1/admin/aliases/{alias_path(alias)}/release", ReleaseResponse)


def submit_job(body: Mapping[str, object]) -> Call[JobPublic]:
    return call("POST", "/v1/jobs", JobPublic, dict(body))


def scoring_job_body(
    teacher: str,
    top_k: int,
    sequences: list[list[int]] | None,
    corpus: str | None,
) -> dict[str, object]:
    """The body of a ``teacher_scoring`` job: exactly one of ``sequences`` and ``corpus``."""
    if (sequences is None) == (corpus is None):
        raise InputError("give exactly one of sequences and corpus", rule="client.job_source")
    body: dict[str, object] = {"kind": "teacher_scoring", "teacher": teacher, "top_k": top_k}
    if corpus is not None:
        body["corpus"] = {"path": corpus}
    else:
        body["sequences"] = sequences
    return body


def jobs_page(status: str | None, limit: int | None, cursor: str | None) -> Call[JobsListResponse]:
    if status is not None and status not in JobStatus.__members__:
        raise InputError(
            f"job status must be one of {', '.join(JobStatus.__members__)}", rule="client.status"
        )
    limit = None if limit is None else check_limit(limit)
    query = _query(status=status, limit=limit, cursor=cursor)
    return call("GET", "/v1/jobs" + query, JobsListResponse)


def get_job(job_id: str) -> Call[JobPublic]:
    return call("GET", f"/v1/jobs/{job_id_path(job_id)}", JobPublic)


def cancel_job(job_id: str) -> Call[JobPublic]:
    return call("POST", f"/v1/jobs/{job_id_path(job_id)}/cancel", JobPublic)


def delete_job(job_id: str) -> Call[DeleteJobResponse]:
    """``DELETE /v1/jobs/{id}`` (issue 15): a finished job; an active one is 409."""
    return call("DELETE", f"/v1/jobs/{job_id_path(job_id)}", DeleteJobResponse)


def signing_keys(base_url: str) -> Call[dict[str, Any]]:
    """``GET /v1/keys`` parsed strictly into ``{key_id: PublicKey}`` (``jobs.signing``)."""

    def parse(data: Any) -> dict[str, Any]:
        from kiln_registry.jobs.signing import parse_keys

        return dict(parse_keys(data, f"{base_url}/v1/keys"))

    return Call("GET", "/v1/keys", parse)


def result_path(job_id: str) -> str:
    return f"/v1/jobs/{job_id_path(job_id)}/result"


def next_cursor(page: BaseModel) -> str | None:
    """A page's ``next_cursor`` (absent on the last page, and on lists without paging)."""
    value = getattr(page, "next_cursor", None)
    return value if isinstance(value, str) else None
