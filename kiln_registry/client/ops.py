"""One constructor per registry API operation, shared by both clients.

Each function checks its arguments (alias, job id, limit, status) before
anything is sent and returns a ``client.base.Call``: method, path with its
query, JSON body and the parser of the answer into the wire schema.  The
public operations take the signature (and docstring) of the client method
they become (``client.core``'s table): ``RegistryClient`` and
``AsyncRegistryClient`` run the same calls.  Imports
pydantic, ``client.base`` and the wire schemas; never httpx.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kiln_registry.client.base import (
    MAX_RESULT_BYTES,
    AwaitingClient,
    BlockingClient,
    Call,
    Request,
    alias_path,
    call,
    check_limit,
    job_id_path,
)
from kiln_registry.client.jobs import Download, ProgressCallback, Waiter
from kiln_registry.domain.errors import InputError
from kiln_registry.domain.vocabulary import JobKind
from kiln_registry.wire.admin import AuditEvent, AuditResponse, ReleaseResponse
from kiln_registry.wire.jobs import DeleteJobResponse, JobPublic, JobsListResponse, JobStatus
from kiln_registry.wire.system import HealthResponse, ReadyResponse
from kiln_registry.wire.teachers import (
    DeleteTeacherResponse,
    ProbeReceipt,
    ProbeReportPublic,
    ReceiptsResponse,
    TeacherEntry,
    TeachersListResponse,
)


def _query(**params: object) -> str:
    pairs = {k: str(v) for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


def health() -> Call[HealthResponse]:
    return call("GET", "/health", HealthResponse)


def ready() -> Call[ReadyResponse]:
    return call("GET", "/ready", ReadyResponse)


def teachers_page(
    *, limit: int | None = None, cursor: str | None = None
) -> Call[TeachersListResponse]:
    """One page of ``GET /v1/teachers`` (pass its ``next_cursor`` for the next)."""
    limit = None if limit is None else check_limit(limit)
    return call("GET", "/v1/teachers" + _query(limit=limit, cursor=cursor), TeachersListResponse)


def get_teacher(alias: str) -> Call[TeacherEntry]:
    return call("GET", f"/v1/teachers/{alias_path(alias)}", TeacherEntry)


def register_teacher(
    *,
    alias: str,
    kind: str,
    provider: str | None = None,
    model_id: str | None = None,
    url: str | None = None,
    credential_id: str | None = None,
    notes: str | None = None,
    adapter: str | None = None,
    launch_profile: str | None = None,
    urls: Sequence[str] | None = None,
) -> Call[TeacherEntry]:
    """``POST /v1/teachers``; fields left as None are not sent (the server validates).

    ``urls`` registers a replica set (several endpoints of one teacher) instead of ``url``.
    """
    fields = {"alias": alias, "kind": kind, "provider": provider, "model_id": model_id,
              "url": url, "credential_id": credential_id, "notes": notes,
              "adapter": adapter, "launch_profile": launch_profile,
              "urls": None if urls is None else list(urls)}  # fmt: skip
    body = {name: value for name, value in fields.items() if value is not None}
    return call("POST", "/v1/teachers", TeacherEntry, body)


def delete_teacher(alias: str) -> Call[DeleteTeacherResponse]:
    return call("DELETE", f"/v1/teachers/{alias_path(alias)}", DeleteTeacherResponse)


def probe_teacher(alias: str) -> Call[ProbeReportPublic]:
    """Re-run the probes against the stored identity; returns the probe report."""
    return call("POST", f"/v1/teachers/{alias_path(alias)}/probe", ProbeReportPublic)


def report_teacher(alias: str) -> Call[ProbeReportPublic]:
    """Report answers outside the pin (scope ``read``); the registry re-probes by itself."""
    return call("POST", f"/v1/teachers/{alias_path(alias)}/report", ProbeReportPublic)


def launch_teacher(alias: str) -> Call[TeacherEntry]:
    """Relaunch an ``unavailable`` local alias with its stored identity."""
    return call("POST", f"/v1/teachers/{alias_path(alias)}/launch", TeacherEntry)


def receipts(alias: str, *, limit: int = 100) -> Call[list[ProbeReceipt]]:
    path = f"/v1/teachers/{alias_path(alias)}/receipts" + _query(limit=check_limit(limit))
    inner = call("GET", path, ReceiptsResponse)
    return Call("GET", path, lambda data: inner.parse(data).receipts)


def audit(*, limit: int = 100, before: int | None = None) -> Call[list[AuditEvent]]:
    """``GET /v1/audit`` (admin): state changes, newest first."""
    path = "/v1/audit" + _query(limit=check_limit(limit), before=before)
    inner = call("GET", path, AuditResponse)
    return Call("GET", path, lambda data: inner.parse(data).events)


def release_alias(alias: str) -> Call[ReleaseResponse]:
    """Free a deleted (reserved) alias (admin)."""
    return call("POST", f"/v1/admin/aliases/{alias_path(alias)}/release", ReleaseResponse)


def submit(body: Mapping[str, object]) -> Call[JobPublic]:
    """``POST /v1/jobs`` with a complete body (any job kind the server knows)."""
    return call("POST", "/v1/jobs", JobPublic, dict(body))


def submit_job(
    *,
    teacher: str,
    top_k: int,
    sequences: list[list[int]] | None = None,
    corpus: str | None = None,
) -> Call[JobPublic]:
    """Queue a ``teacher_scoring`` job over inline ``sequences`` or a server-side ``corpus``."""
    return submit(scoring_job_body(teacher, top_k, sequences, corpus))


def scoring_job_body(
    teacher: str,
    top_k: int,
    sequences: list[list[int]] | None,
    corpus: str | None,
) -> dict[str, object]:
    """The body of a ``teacher_scoring`` job: exactly one of ``sequences`` and ``corpus``."""
    if (sequences is None) == (corpus is None):
        raise InputError("give exactly one of sequences and corpus", rule="client.job_source")
    body: dict[str, object] = {
        "kind": JobKind.teacher_scoring.value,
        "teacher": teacher,
        "top_k": top_k,
    }
    if corpus is not None:
        body["corpus"] = {"path": corpus}
    else:
        body["sequences"] = sequences
    return body


def jobs_page(
    *, status: str | None = None, limit: int | None = None, cursor: str | None = None
) -> Call[JobsListResponse]:
    """One page of ``GET /v1/jobs``, newest first."""
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
    """Remove a finished job with its result (``409 job_conflict`` while it runs)."""
    return call("DELETE", f"/v1/jobs/{job_id_path(job_id)}", DeleteJobResponse)


def keys_call(base_url: str) -> Call[dict[str, Any]]:
    """``GET /v1/keys`` parsed strictly into ``{key_id: PublicKey}`` (``jobs.core.signing``)."""

    def parse(data: Any) -> dict[str, Any]:
        from kiln_registry.jobs.core.signing import parse_keys

        return dict(parse_keys(data, f"{base_url}/v1/keys"))

    return Call("GET", "/v1/keys", parse)


class _SigningKeys(Request[dict[str, Any]]):
    def blocking(self, client: BlockingClient) -> dict[str, Any]:
        return client._run(keys_call(client.base_url))

    async def awaiting(self, client: AwaitingClient) -> dict[str, Any]:
        return await client._run(keys_call(client.base_url))


def signing_keys() -> Request[dict[str, Any]]:
    """The registry's corpus-signing public keys by key id (``GET /v1/keys``)."""
    return _SigningKeys()


def wait_job(
    job_id: str,
    *,
    interval: float = 0.5,
    timeout: float | None = None,
    on_progress: ProgressCallback | None = None,
) -> Waiter:
    """Poll until the job succeeded, failed or was cancelled; ``on_progress`` on changes.

    ``on_progress`` may be a coroutine function on ``AsyncRegistryClient``.
    """
    return Waiter(job_id, interval, timeout, on_progress)


def download_result(
    job_id: str,
    output: Path,
    *,
    verify: bool = True,
    keys: dict[str, Any] | None = None,
    max_bytes: int = MAX_RESULT_BYTES,
) -> Download:
    """Stream the job's corpus into ``output`` (parents created), verified, atomically.

    With ``verify`` (the default) the corpus is checked against ``keys``
    (default: this registry's ``GET /v1/keys``) before it is renamed into
    place; a corpus that fails is never left at ``output``.
    """
    return Download(job_id, result_path(job_id), Path(output), verify, keys, max_bytes)


def result_path(job_id: str) -> str:
    return f"/v1/jobs/{job_id_path(job_id)}/result"


def next_cursor(page: BaseModel) -> str | None:
    """A page's ``next_cursor`` (absent on the last page, and on lists without paging)."""
    value = getattr(page, "next_cursor", None)
    return value if isinstance(value, str) else None
