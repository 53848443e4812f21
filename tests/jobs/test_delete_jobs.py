"""``DELETE /v1/jobs/{id}`` (issue 15, attack 7): a finished job goes with its rows and result.

A job still queued, probing or running is refused with ``409 job_conflict``
(rule ``job.delete_active``, hint: cancel it first); the delete is audited.
A crash between the commit and the unlink leaves a tombstone that the next
start finishes, or undoes when the delete never committed (the tombstones are
written by the test where a crash would leave them: a crash cannot be
produced between two statements for real).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from sqlalchemy import func, select

from kiln_registry.auth.models import AuditEventRow
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.models import JobRow, JobSequenceRow
from kiln_registry.jobs.core.retention import tombstone
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher
from tests.jobs.harness import Controlled, make_config, running_registry, student_identity
from tests.probe.teacher_server import TeacherServer

SEQUENCES = [[5, 9, 11, 40], [7, 8]]


def _kiln(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _rows(reg_ctx: object, job_id: str) -> tuple[int, int]:
    with unit_of_work(reg_ctx.sessions) as session:  # type: ignore[attr-defined]
        jobs = session.scalar(select(func.count()).where(JobRow.id == job_id))
        seqs = session.scalar(select(func.count()).where(JobSequenceRow.job_id == job_id))
    return int(jobs or 0), int(seqs or 0)


def test_a_finished_job_is_deleted_with_its_sequences_and_result(
    tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    config = make_config(tmp_path, tiny_model.path)
    with running_registry(config) as reg:
        reg.register("ref@tiny", reference_teacher.url, REFERENCE_MODEL_ID)
        job = reg.wait(reg.submit("ref@tiny", 2, sequences=SEQUENCES).json()["id"])
        assert job["status"] == "succeeded", job
        result = next((tmp_path / "results").glob(f"{job['id']}.jsonl"))
        assert _rows(reg.ctx, job["id"]) == (1, 2)
        # A generation job's detached signature sits beside its corpus; it goes too.
        result.with_name(result.name + ".sig").write_bytes(b"signature line\n")
        deleted = reg.http.delete(f"/v1/jobs/{job['id']}")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"status": "deleted", "id": job["id"]}
        second = reg.wait(reg.submit("ref@tiny", 2, sequences=SEQUENCES).json()["id"])
        cli = _kiln("jobs", "delete", second["id"], "--server", reg.url)
        assert cli.returncode == 0 and f"deleted {second['id']}" in cli.stdout, cli.stderr
        gone = _kiln("jobs", "delete", second["id"], "--server", reg.url)
        assert gone.returncode == 2 and "job_not_found" in gone.stderr, gone.stderr
        assert _rows(reg.ctx, job["id"]) == (0, 0)
        assert not result.exists() and list((tmp_path / "results").iterdir()) == []
        assert reg.http.get(f"/v1/jobs/{job['id']}").status_code == 404
        assert reg.http.get(f"/v1/jobs/{job['id']}/result").status_code == 404
        again = reg.http.delete(f"/v1/jobs/{job['id']}")
        assert again.status_code == 404 and again.json()["error"]["code"] == "job_not_found"
        assert reg.http.delete("/v1/jobs/not-a-job").status_code in (400, 404)
        with unit_of_work(reg.ctx.sessions) as session:
            audit = session.scalars(
                select(AuditEventRow).where(AuditEventRow.action == "job.delete")
            ).all()
            assert [(a.target, a.outcome) for a in audit][:1] == [(job["id"], "ok")]


def test_an_active_job_is_refused_until_cancelled(
    tmp_path: Path, tiny_model: TinyModel, student_vocab_sha256: str
) -> None:
    gate = threading.Event()
    teacher = Controlled(student_identity(student_vocab_sha256), gate=gate)
    config = make_config(tmp_path, tiny_model.path)
    with TeacherServer(teacher) as server, running_registry(config) as reg:
        try:
            reg.register("t@ctl", f"http://127.0.0.1:{server.port}", "teacher-tiny")
            job_id = reg.submit("t@ctl", 2, sequences=SEQUENCES).json()["id"]
            reg.wait(job_id, ("running",))
            refused = reg.http.delete(f"/v1/jobs/{job_id}")
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert error["code"] == "job_conflict" and error["rule"] == "job.delete_active"
            assert "cancel" in error["hint"]
            assert _rows(reg.ctx, job_id) == (1, 2)
            assert reg.http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
        finally:
            gate.set()
        assert reg.wait(job_id)["status"] == "cancelled"
        assert reg.http.delete(f"/v1/jobs/{job_id}").status_code == 200
        assert _rows(reg.ctx, job_id) == (0, 0)


def test_an_interrupted_delete_is_finished_or_undone_at_start(
    tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    config = make_config(tmp_path, tiny_model.path)
    results = tmp_path / "results"
    with running_registry(config) as reg:
        reg.register("ref@tiny", reference_teacher.url, REFERENCE_MODEL_ID)
        job = reg.wait(reg.submit("ref@tiny", 2, sequences=SEQUENCES).json()["id"])
        assert job["status"] == "succeeded", job
    kept = results / f"{job['id']}.jsonl"
    body = kept.read_bytes()
    # The delete had renamed the file but never committed: the job keeps its result.
    kept.rename(tombstone(kept))
    # A delete that committed but crashed before the unlink: the tombstones go.
    orphan = results / ("job-" + "f" * 24 + ".jsonl")
    tombstone(orphan).write_bytes(b"stale")
    tombstone(orphan.with_name(orphan.name + ".sig")).write_bytes(b"stale signature")
    with running_registry(config) as reg:
        assert reg.http.get(f"/v1/jobs/{job['id']}/result").content == body
        assert sorted(p.name for p in results.iterdir()) == [kept.name]
