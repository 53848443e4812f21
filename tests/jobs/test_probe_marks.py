"""A job that fails its probe marks the teacher unavailable as a failed re-probe does
(issue 30, item 7), over real loopback HTTP with the registry's own workers.

The teacher changes its fingerprint after registration; the job's probe fails, the
alias becomes ``unavailable`` with the re-probe's status message, the audit log holds
the re-probe's event (``teacher.probe`` on the alias), and the next submission is
refused up front.  A passing re-probe restores ``verified``.  A job that pinned an
older registration of the alias never marks the newer one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.db.repository import TeacherRepository, unit_of_work
from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.teachers.job_probes import PinnedRegistration, mark_failed_probe
from kiln_registry.teachers.reprobe import REPROBE_FAILED
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.harness import Controlled, Registry, make_config, running_registry, student_identity
from tests.probe.teacher_server import TeacherServer

SEQS = [[3, 4, 5], [6, 7, 8]]
OTHER_INFERENCE = "e" * 64


@pytest.fixture
def reg(tmp_path: Path, tiny_model: TinyModel) -> Iterator[Registry]:
    with running_registry(make_config(tmp_path, tiny_model.path, concurrency=1)) as registry:
        yield registry


def _probe_events(reg: Registry) -> list[dict[str, Any]]:
    events = reg.http.get("/v1/audit").json()["events"]
    return [
        {k: e.get(k) for k in ("action", "target", "outcome", "status")}
        for e in events
        if e["action"] == "teacher.probe"
    ]


def _entry(reg: Registry, alias: str) -> dict[str, Any]:
    return dict(reg.http.get(f"/v1/teachers/{alias}").json())


def test_a_failed_job_probe_marks_the_teacher_as_a_failed_reprobe_does(
    reg: Registry, student_vocab_sha256: str
) -> None:
    pinned = student_identity(student_vocab_sha256)
    changed = student_identity(student_vocab_sha256, inference=OTHER_INFERENCE)
    state = {"fp": pinned.fingerprint()}
    with TeacherServer(Controlled(pinned, fingerprint=lambda i: state["fp"])) as srv:
        reg.register("t", f"http://127.0.0.1:{srv.port}", "teacher-tiny")
        state["fp"] = changed.fingerprint()  # the teacher behind the alias changed
        job = reg.wait(reg.submit("t", 4, sequences=SEQS).json()["id"])
        assert job["status"] == "failed" and job["error"]["rule"] == "probe.fingerprint_pinned"
        entry = _entry(reg, "t")
        assert entry["status"] == "unavailable" and entry["usable"] is False
        by_job = entry["status_message"]
        assert by_job.startswith(f"{REPROBE_FAILED} (teacher_identity_probe_failed: "), by_job
        # The next job is refused up front, saying why.
        refused = reg.submit("t", 4, sequences=SEQS)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "teacher_identity_required"
        assert REPROBE_FAILED in refused.json()["error"]["message"]
        # A failed re-probe writes the same message and the same audit event.
        assert reg.http.post("/v1/teachers/t/probe").status_code >= 400
        by_reprobe = _entry(reg, "t")["status_message"]
        assert by_reprobe == by_job
        events = _probe_events(reg)
        assert len(events) == 2 and events[0] == events[1], events
        assert events[0]["target"] == "t" and events[0]["outcome"] in ("refused", "failed")
        # A passing re-probe restores the alias.
        state["fp"] = pinned.fingerprint()
        assert reg.http.post("/v1/teachers/t/probe").status_code == 200
        assert _entry(reg, "t")["status"] == "verified"


def test_a_job_on_an_older_registration_never_marks_the_newer_one(
    reg: Registry, student_vocab_sha256: str
) -> None:
    # The race (alias deleted and registered again between a job's phase (a) and its
    # probe) cannot be timed for real; the mark's own guard is checked on the real
    # database with the pin such a job would hold.
    identity = student_identity(student_vocab_sha256)
    with TeacherServer(Controlled(identity)) as srv:
        reg.register("t", f"http://127.0.0.1:{srv.port}", "teacher-tiny")
    with unit_of_work(reg.ctx.sessions) as session:
        row = TeacherRepository(session).get("t")
        assert row is not None and row.identity_digest is not None
        current = (row.created_at, row.identity_digest)
    failure = ProbeFailed("discover probe (K=1): the teacher answered HTTP 500", rule="x.y")
    stale = [
        PinnedRegistration("t", "2000-01-01T00:00:00.000000Z", current[1], None),  # older row
        PinnedRegistration("t", current[0], "0" * 64, None),  # another identity
    ]
    for pin in stale:
        with unit_of_work(reg.ctx.sessions) as session:
            assert not mark_failed_probe(session, pin, failure, secret_names=frozenset())
    assert _entry(reg, "t")["status"] == "verified" and _probe_events(reg) == []
    with unit_of_work(reg.ctx.sessions) as session:
        pin = PinnedRegistration("t", *current, owner=None)
        assert mark_failed_probe(session, pin, failure, secret_names=frozenset())
    assert _entry(reg, "t")["status"] == "unavailable"
    assert _probe_events(reg) == [
        {"action": "teacher.probe", "target": "t", "outcome": "failed", "status": 502}
    ]
