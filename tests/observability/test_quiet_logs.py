"""The default log level stays readable (issue 30, item 10), checked on a real `kiln serve`.

A registration's cap probe gets the HTTP 400 it expects from the teacher: that
exchange (httpx's per-request line) is written at DEBUG, never at INFO.  An open
dashboard refreshes every second with ``X-Kiln-Refresh: 1``: its successful reads
are written at DEBUG and summed up in one INFO line per minute
(``RefreshSummary``, checked here with its clock injected: no test waits a
minute), while every other request (and a refused refresh) keeps its INFO line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from kiln_registry.observability.access import ACCESS_LOGGER, RefreshSummary
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import ServerProcess, write_config
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher

REFRESH = {"x-kiln-refresh": "1"}
DASHBOARD_READS = ["/v1/teachers?limit=50", "/v1/teachers/t/receipts?limit=1", "/v1/jobs?limit=50"]


def _serve_and_browse(tmp_path: Path, model: Path, teacher: str, level: str) -> list[Any]:
    config = write_config(
        tmp_path, student=model, server={"log_format": "json", "log_level": level}
    )
    with ServerProcess(config, tmp_path / "serve.log") as server:
        server.wait_ready(deadline_s=120)  # a loaded CI machine starts slowly
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as http:
            body = {"alias": "t", "kind": "remote", "provider": "vllm",
                    "model_id": REFERENCE_MODEL_ID, "url": teacher}  # fmt: skip
            assert http.post("/v1/teachers", json=body).status_code == 200
            for _ in range(5):  # five seconds of an open dashboard
                for path in DASHBOARD_READS:
                    assert http.get(path, headers=REFRESH).status_code == 200
            missing = "/v1/jobs/job-" + "0" * 24
            assert http.get(missing, headers=REFRESH).status_code == 404
            assert http.get("/v1/jobs?limit=50").status_code == 200  # not a page refresh
        server.stop()
    return [json.loads(line) for line in server.output().splitlines()]


def _access(lines: list[Any], level: str) -> list[tuple[str, int]]:
    return [
        (line["route"], line["status"])
        for line in lines
        if line["logger"] == ACCESS_LOGGER and line["level"] == level.lower() and "route" in line
    ]


def test_at_info_the_cap_probe_and_dashboard_refreshes_stay_out_of_the_log(
    tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    lines = _serve_and_browse(tmp_path, tiny_model.path, reference_teacher.url, "info")
    assert not [line for line in lines if line["logger"].startswith("httpx")], lines
    assert all("400 Bad Request" not in line["message"] for line in lines)
    assert [a for a in _access(lines, "INFO") if a[0] != "/health"] == [
        ("/v1/teachers", 200),  # the registration
        ("/v1/jobs/{job_id}", 404),  # a refused refresh is not hidden
        ("/v1/jobs", 200),  # the same read without the refresh header
    ]


def test_at_debug_both_are_there(
    tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    lines = _serve_and_browse(tmp_path, tiny_model.path, reference_teacher.url, "debug")
    cap = [line for line in lines if line["logger"] == "httpx" and "400 Bad Request" in
           line["message"]]  # fmt: skip
    assert cap and all(line["level"] == "debug" for line in cap), cap
    refreshes = _access(lines, "DEBUG")
    assert len(refreshes) == 5 * len(DASHBOARD_READS)
    assert set(refreshes) == {("/v1/teachers", 200), ("/v1/teachers/{alias}/receipts", 200),
                              ("/v1/jobs", 200)}  # fmt: skip


def test_refreshes_are_summed_up_once_per_window() -> None:
    now = [0.0]
    summary = RefreshSummary(window_s=60.0, clock=lambda: now[0])
    for second in range(60):
        now[0] = float(second)
        summary.add("GET", "/v1/jobs")
        summary.add("GET", "/v1/teachers")
        assert summary.due() is None
    now[0] = 60.0
    line = summary.due()
    assert line == (
        "page refreshes answered in the last 60 s: 60 GET /v1/jobs, 60 GET /v1/teachers"
        " (each one is logged at DEBUG)"
    )
    assert summary.due() is None  # counted afresh
    now[0] = 130.0
    assert summary.due() is None  # a window with no refresh writes nothing
