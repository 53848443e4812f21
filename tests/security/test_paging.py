"""Issue 15 attack 7: every list answer is a bounded page with an opaque cursor.

``GET /v1/teachers``, ``/v1/teachers/{alias}/receipts``, ``/v1/jobs`` and
``/v1/audit`` each take ``limit`` (1..1000) and ``cursor`` and answer
``next_cursor`` while more follow; a cursor of another list is refused.
(``/v1/keys`` is one fixed document, not a list.)
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from kiln_registry.api.paging import encode_cursor, encode_key
from kiln_registry.db.models import TIMESTAMP_FORMAT
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import RegistryServer, error_of
from tests.jobs.harness import Controlled, student_identity
from tests.probe.teacher_server import TeacherServer


def test_teachers_are_listed_in_pages(registry: RegistryServer) -> None:
    aliases = [f"t{n:02d}" for n in range(7)]
    with registry.client() as http:
        for alias in reversed(aliases):
            body = {"alias": alias, "kind": "fixture", "model_id": "m"}
            assert http.post("/v1/teachers", json=body).status_code == 200
        seen: list[str] = []
        cursor = None
        for _ in range(10):
            params: dict[str, str | int] = {"limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = http.get("/v1/teachers", params=params).json()
            assert len(page["teachers"]) <= 3
            seen += [t["spec"]["alias"] for t in page["teachers"]]
            cursor = page.get("next_cursor")
            if cursor is None:
                break
        assert seen == aliases
        whole = http.get("/v1/teachers").json()
        assert "next_cursor" not in whole and len(whole["teachers"]) == 7  # Kiln's shape


@pytest.mark.parametrize(
    "cursor",
    [
        "not-base64!",
        base64.urlsafe_b64encode(b'{"x":1}').decode(),
        base64.urlsafe_b64encode(b'{"after":"\\ud800"}').decode(),
        "A" * 5000,
    ],
)
def test_bad_cursors_are_400(registry: RegistryServer, cursor: str) -> None:
    with registry.client() as http:
        response = http.get("/v1/teachers", params={"cursor": cursor})
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] in ("invalid_request",)


def test_limits_are_bounded(registry: RegistryServer) -> None:
    with registry.client() as http:
        for limit in (0, 1001, 2**63):
            assert http.get("/v1/teachers", params={"limit": limit}).status_code == 400


def _pages(http: httpx.Client, path: str, key: str, limit: int) -> list[list[dict[str, Any]]]:
    """Every page of a list route, following ``next_cursor``."""
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    for _ in range(100):
        params: dict[str, str | int] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        response = http.get(path, params=params)
        assert response.status_code == 200, response.text
        doc = response.json()
        assert len(doc[key]) <= limit
        pages.append(doc[key])
        cursor = doc.get("next_cursor")
        if cursor is None:
            return pages
    raise AssertionError("paging did not end")


def _job(job_id: str, created_at: str) -> JobRow:
    return JobRow(
        id=job_id, kind="teacher_scoring", status="failed", teacher_alias="t",
        teacher_kind="remote", teacher_url="http://127.0.0.1:1", teacher_credential_id=None,
        teacher_model_id="m", teacher_created_at=created_at, identity_json="{}",
        identity_digest="a" * 64, top_k=2, source="inline", corpus_path=None,
        corpus_sha256=None, sequence_count=1, token_count=1, device=None, claim_token=None,
        cancel_requested=0, attempts=0, scored_count=0, cache_hits=0, requests_sent=0,
        retries=0, created_at=created_at, updated_at=created_at, finished_at=created_at,
    )  # fmt: skip


def test_jobs_are_listed_in_pages(registry: RegistryServer) -> None:
    # Two jobs share a creation time: the cursor orders by (created_at, id).
    # Recent: the default `[jobs] retain_days` (30) sweeps finished jobs older than that.
    now = datetime.now(UTC)
    stamps = [
        (now - timedelta(minutes=m)).strftime(TIMESTAMP_FORMAT) for m in (9, 9, 8, 7, 6, 5, 4)
    ]
    ids = [f"job-{n:024x}" for n in range(len(stamps))]
    with unit_of_work(registry.ctx.sessions) as session:
        for job_id, stamp in zip(ids, stamps, strict=True):
            JobRepository(session).insert(_job(job_id, stamp), [])
    with registry.client() as http:
        pages = _pages(http, "/v1/jobs", "jobs", 2)
        assert len(pages) == 4
        assert [j["id"] for page in pages for j in page] == ids[::-1]
        failed = _pages(http, "/v1/jobs?status=failed", "jobs", 3)
        assert sum(len(p) for p in failed) == len(ids)
        whole = http.get("/v1/jobs").json()
        assert "next_cursor" not in whole and len(whole["jobs"]) == len(ids)


def test_audit_events_are_listed_in_pages(registry: RegistryServer) -> None:
    with registry.client() as http:
        for n in range(5):
            body = {"alias": f"a{n}", "kind": "fixture", "model_id": "m"}
            assert http.post("/v1/teachers", json=body).status_code == 200
        pages = _pages(http, "/v1/audit", "events", 2)
        events = [e for page in pages for e in page]
        assert [e["target"] for e in events] == [f"a{n}" for n in reversed(range(5))]
        assert [e["id"] for e in events] == sorted((e["id"] for e in events), reverse=True)


def test_receipts_are_listed_in_pages(registry: RegistryServer, tiny_model: TinyModel) -> None:
    identity = student_identity(student_vocab(tiny_model.path)[0])
    with TeacherServer(Controlled(identity)) as teacher, registry.client() as http:
        body = {"alias": "r", "kind": "remote", "provider": "vllm", "model_id": "teacher-tiny",
                "url": f"http://127.0.0.1:{teacher.port}"}  # fmt: skip
        assert http.post("/v1/teachers", json=body).status_code == 200
        for _ in range(4):
            assert http.post("/v1/teachers/r/probe").status_code == 200
        pages = _pages(http, "/v1/teachers/r/receipts", "receipts", 2)
        receipts = [r for page in pages for r in page]
        assert len(receipts) == len({r["id"] for r in receipts}) >= 5
        assert [r["id"] for r in receipts] == sorted((r["id"] for r in receipts), reverse=True)
        whole = http.get("/v1/teachers/r/receipts", params={"limit": 1000}).json()
        assert "next_cursor" not in whole and len(whole["receipts"]) == len(receipts)


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/audit", "/v1/teachers/r/receipts"])
def test_every_list_refuses_bad_or_foreign_cursors(registry: RegistryServer, path: str) -> None:
    foreign = {"/v1/jobs": encode_key("audit", 5), "/v1/audit": encode_key("jobs", "x", "y"),
               "/v1/teachers/r/receipts": encode_key("receipts:other", "x", 1)}[path]  # fmt: skip
    bad = ["not-base64!", "A" * 5000, foreign, encode_cursor("t1"),
           base64.urlsafe_b64encode(b'{"list":"audit","after":[-1]}').decode()]  # fmt: skip
    with registry.client() as http:
        for cursor in bad:
            response = http.get(path, params={"cursor": cursor})
            assert response.status_code == 400, (cursor, response.text)
        for limit in (0, 1001):
            assert http.get(path, params={"limit": limit}).status_code == 400


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_hostile_cursors_are_400_on_every_list(registry: RegistryServer) -> None:
    """Issue 27 item 11: a deeply nested cursor was a RecursionError (500); now strict 400s."""
    hostile = [
        _b64(b"[" * 1530),  # the reported one
        _b64(b'{"after":' + b"[" * 1000 + b"}"),
        _b64(b'{"list":"audit","after":' + b"{" * 1200 + b"}"),
        _b64(b'{"list":"audit","after":[[1]]}'),  # valid JSON, one level too deep
        _b64(b'{"after":"t1","extra":1}'),  # keys this registry never writes
        _b64(b'{"list":"jobs","after":["x","y"],"more":{}}'),
        _b64(b'"just a string"'),
        _b64(b'{"after":"t1"} trailing'),
        encode_cursor("t1") + "=",  # a character past the alphabet's framing
        encode_cursor("t1").replace("e", "\u0435"),  # a look-alike letter: not the alphabet
        " " + encode_cursor("t1"),
        "",
    ]
    lists = ["/v1/teachers", "/v1/jobs", "/v1/audit", "/v1/teachers/r/receipts"]
    with registry.client() as http:
        for path in lists:
            for cursor in hostile:
                response = http.get(path, params={"cursor": cursor})
                assert response.status_code == 400, (path, cursor[:40], response.text)
                assert error_of(response)["code"] == "invalid_request"
                assert error_of(response)["rule"] == "page.cursor"
        # The cursors this registry issues still page.
        assert http.get("/v1/teachers", params={"cursor": encode_cursor("t1")}).status_code == 200
        page = http.get("/v1/audit", params={"cursor": encode_key("audit", 5)})
        assert page.status_code == 200
