"""A throw-away job kind plugged into ``jobs.kinds.KINDS`` from this test module.

``final_argmax`` is defined here only: its submission validates and stores
token sequences, its pipeline (an ``OrderedPipeline`` whose requests go
through ``JobTeachers.call``) asks the real reference teacher for the top-1
token after each whole sequence, and its result file is one JSON line per
sequence.  It is submitted through the service layer (the table's
``submit``), run by the registry's own workers and runner, and read back
with ``service.result_file``; its answers equal the teacher-scoring job's
last-row top-1 over the same sequences.  Nothing else in the package knows
the kind.

The database's CHECK constraint on ``jobs.kind`` (changed only by a
migration when a real kind is added) is set aside with SQLite's
``PRAGMA ignore_check_constraints`` on every connection the test's
registry opens, hence ``sqlite_only``; everything else is the product's.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.settings import KilnConfig
from kiln_registry.jobs import kinds
from kiln_registry.jobs.core import service
from kiln_registry.jobs.core.endpoints import Endpoint, JobTeachers
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.ordered_pipeline import OrderedPipeline
from kiln_registry.jobs.core.repository import JobRepository, SequenceItem
from kiln_registry.jobs.core.state import ClaimedJob
from kiln_registry.jobs.scoring.sources import inline_sequences
from kiln_registry.jobs.scoring.target import ScoringTarget, score_sequence
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher
from tests.jobs.harness import make_config, running_registry

KIND = "final_argmax"
SEQS = [[3 + i, 40 + i, 90 + 2 * i][: 2 + i % 2] for i in range(6)]


@dataclass(frozen=True)
class ArgmaxSubmission:
    teacher: str
    sequences: list[list[int]]


def submit_argmax(
    config: KilnConfig, sessions: sessionmaker[Session], sub: ArgmaxSubmission,
    owner: str | None,
) -> JobRow:  # fmt: skip
    pin = service.read_pin(sessions, sub.teacher)
    loaded = inline_sequences(sub.sequences, pin.identity, 1)

    def write(session: Session, job_id: str) -> JobRow:
        source = service.JobInput(len(loaded.sequences), loaded.token_count)
        row = service.job_row(job_id, pin, KIND, 1, source)
        JobRepository(session).insert(row, [(s.seq_id, s.tokens, s.sha256) for s in
                                            loaded.sequences])  # fmt: skip
        return row

    submitter = service.Submitter(config.jobs, owner)
    return service.insert_pinned(sessions, sub.teacher, pin, write, submitter,
                                 loaded.token_count)  # fmt: skip


class LinesWriter:
    """One JSON line per row into this claim's partial file; published by rename."""

    def __init__(self, final: Path, tag: str) -> None:
        self.final = final
        self.partial = final.with_name(f".{final.name}.{tag}.partial")
        self._handle = self.partial.open("wb")
        self._sha = hashlib.sha256()

    def write(self, line: bytes) -> None:
        self._handle.write(line)
        self._sha.update(line)

    def seal(self) -> tuple[str, int]:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        size = self._handle.tell()
        self._handle.close()
        return self._sha.hexdigest(), size

    def publish(self) -> None:
        os.replace(self.partial, self.final)

    def discard(self) -> None:
        self._handle.close()
        self.partial.unlink(missing_ok=True)


class ArgmaxPipeline(OrderedPipeline[SequenceItem, int, LinesWriter]):
    page_size: ClassVar[int] = 100
    noun: ClassVar[str] = "sequences"

    def __init__(self, claimed: ClaimedJob, teachers: JobTeachers) -> None:
        super().__init__(claimed, use_cache=False)
        self.teachers = teachers
        job = claimed.job
        self.targets = [
            ScoringTarget(wire=e.open_wire(), model_id=job.teacher_model_id, secret=e.secret,
                          identity=claimed.identity, k=1)
            for e in teachers.endpoints
        ]  # fmt: skip

    def _open_writer(self, final: Path) -> LinesWriter:
        return LinesWriter(final, self.claim_tag)

    def _rows(self, session: Session, after: int) -> list[SequenceItem]:
        return JobRepository(session).sequences(self.claimed.job.id, after=after, limit=100)

    async def _request(self, row: SequenceItem) -> int:
        tokens = np.frombuffer(row.token_ids, dtype="<i4")

        async def on(endpoint: Endpoint) -> int:
            scored = await score_sequence(self.targets[endpoint.slot], tokens)
            return int(scored.topk_ids[-1][0])

        return await self.teachers.call(row.idx, on)

    def _write(self, writer: LinesWriter, row: SequenceItem, result: int) -> None:
        writer.write(json.dumps({"id": row.seq_id, "top1": result}).encode() + b"\n")


async def argmax_pipeline(claimed: ClaimedJob, teachers: JobTeachers) -> ArgmaxPipeline:
    return ArgmaxPipeline(claimed, teachers)


def _refuse(path: Path, keys: Any, on_progress: Any) -> Any:
    raise AssertionError("final_argmax results are not Kiln corpora")


SPEC = kinds.JobKindSpec(
    kind=KIND, submission=lambda body: body, submit=submit_argmax, pipeline=argmax_pipeline,
    result_headers=lambda path: {}, owns_corpus=lambda path: False, verify=_refuse,
)  # fmt: skip


def _ignore_checks(dbapi_connection: Any, record: Any) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA ignore_check_constraints = ON")


@pytest.fixture
def plugged(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(kinds.KINDS, KIND, SPEC)
    event.listen(Engine, "connect", _ignore_checks)
    try:
        yield
    finally:
        event.remove(Engine, "connect", _ignore_checks)


def _wait(sessions: sessionmaker[Session], job_id: str) -> JobRow:
    deadline = time.monotonic() + 60.0
    while True:
        row = service.get_job(sessions, job_id)
        if row.status in ("succeeded", "failed", "cancelled"):
            return row
        assert time.monotonic() < deadline, f"job stuck: {row.status}"
        time.sleep(0.05)


@pytest.mark.sqlite_only(reason="sets the jobs.kind CHECK constraint aside with SQLite's pragma")
def test_a_throw_away_job_kind_runs_through_the_table(
    plugged: None, tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    config = make_config(tmp_path, tiny_model.path, concurrency=2, cache=False)
    with running_registry(config) as reg:
        reg.register("ref", reference_teacher.url, REFERENCE_MODEL_ID)
        sessions = reg.ctx.sessions
        spec = kinds.job_kind(KIND)
        row = spec.submit(config, sessions, spec.submission(ArgmaxSubmission("ref", SEQS)), None)
        assert row.kind == KIND and row.status == "queued"
        done = _wait(sessions, row.id)
        assert done.status == "succeeded", (done.error_code, done.error_message)
        _, path = service.result_file(sessions, row.id)
        got = [json.loads(line) for line in path.read_text().splitlines()]
        # The same sequences scored by the teacher-scoring kind: its last row's top-1.
        scoring = reg.submit("ref", 1, sequences=SEQS)
        assert scoring.status_code == 201, scoring.text
        assert reg.wait(scoring.json()["id"])["status"] == "succeeded"
        corpus = reg.http.get(f"/v1/jobs/{scoring.json()['id']}/result").content
        rows = [json.loads(line) for line in corpus.decode().splitlines()[1:-1]]
    assert got == [{"id": r["id"], "top1": r["topk_ids"][-1][0]} for r in rows]
    with pytest.raises(Exception, match="unknown job kind 'no_such_kind'"):
        kinds.job_kind("no_such_kind")
