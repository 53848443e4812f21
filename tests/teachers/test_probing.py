"""The probing seam's receipts: scrubbed for every caller, the job's id added (issue 16).

The job queue stored ``report.to_dict()`` as it was; its receipts now go
through the same scrubbing as the registry's (``teachers.probing``).
"""

from __future__ import annotations

import json

import pytest

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe.report import ProbeReport, attach_report
from kiln_registry.teachers.probing import failure_receipt, receipt_of

SECRET = "sk-reflected-0123456789"
KEY_ENV = "KILN_TEST_TEACHER_KEY"


def _report(outcome: str = "failed") -> ProbeReport:
    return ProbeReport(
        url="https://teacher.example.com/v1/completions",
        model_id="m",
        authenticated=True,
        outcome=outcome,
        failure_message=f"the teacher answered {SECRET!r}",
    )


def test_receipt_is_scrubbed_and_carries_extra_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    receipt = receipt_of(_report(), frozenset({KEY_ENV}), job_id="job-1")
    text = json.dumps(receipt.body)
    assert SECRET not in text and "[redacted]" in text
    assert receipt.body["job_id"] == "job-1" and not receipt.passed


def test_failure_receipt_reads_the_attached_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    error = ProbeFailed("the probe failed", rule="probe.test")
    assert failure_receipt(error, frozenset({KEY_ENV})) is None  # nothing attached
    attach_report(error, _report())
    receipt = failure_receipt(error, frozenset({KEY_ENV}), job_id="job-2")
    assert receipt is not None and SECRET not in json.dumps(receipt.body)
    assert receipt.body["job_id"] == "job-2"
