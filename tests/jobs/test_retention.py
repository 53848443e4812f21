"""``[jobs] retain_days`` (issue 15, attack 7): expired finished jobs go, with their results.

Store level: ``sweep_expired`` on a real migrated SQLite file deletes only
finished jobs (succeeded, failed, cancelled) whose end is older than the
cutoff, result files included.  Registry level: the job workers sweep at
start.  Config: the key is strict (range, type, spelling).  Ages are set by
writing old timestamps into the rows (a test cannot wait days).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config.loader import load_config
from kiln_registry.db.engine import session_factory, upgrade_to_head
from kiln_registry.db.models import utc_timestamp
from kiln_registry.db.opening import open_database
from kiln_registry.db.repository import unit_of_work
from kiln_registry.domain.errors import ConfigError
from kiln_registry.jobs.core.models import JobRow
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.core.retention import SWEEP_BATCH, sweep_expired
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import write_config
from tests.backend import open_registry_database
from tests.jobs.harness import make_config, running_registry


def _ago(days: float) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _job(job_id: str, status: str, finished_days_ago: float | None, result: Path | None) -> JobRow:
    now = utc_timestamp()
    finished = None if finished_days_ago is None else _ago(finished_days_ago)
    return JobRow(
        id=job_id, kind="teacher_scoring", status=status, teacher_alias="t",
        teacher_kind="remote", teacher_url="http://127.0.0.1:1", teacher_credential_id=None,
        teacher_model_id="m", teacher_created_at=now, identity_json="{}",
        identity_digest="a" * 64, top_k=2, source="inline", corpus_path=None,
        corpus_sha256=None, sequence_count=1, token_count=1, device=None, claim_token=None,
        cancel_requested=0, attempts=0, scored_count=0, cache_hits=0, requests_sent=0,
        retries=0, created_at=_ago(30), updated_at=finished or now, finished_at=finished,
        result_path=None if result is None else str(result),
    )  # fmt: skip


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    (tmp_path / "db").mkdir()
    eng = open_registry_database(tmp_path / "db" / "registry.db")  # make_config's database
    upgrade_to_head(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def _ids(sessions: sessionmaker[Session]) -> set[str]:
    with unit_of_work(sessions) as session:
        return set(session.scalars(select(JobRow.id)))


def _insert(sessions: sessionmaker[Session], rows: list[JobRow]) -> None:
    with unit_of_work(sessions) as session:
        for row in rows:
            JobRepository(session).insert(row, [("0", b"\x01\0\0\0", "x")])


def test_only_expired_finished_jobs_are_swept(
    tmp_path: Path, tiny_model: TinyModel, sessions: sessionmaker[Session]
) -> None:
    config = make_config(tmp_path, tiny_model.path, retain_days=7)
    results = tmp_path / "results"
    results.mkdir()
    old_result, new_result = results / "job-old-ok.jsonl", results / "job-new-ok.jsonl"
    old_result.write_bytes(b"old")
    new_result.write_bytes(b"new")
    _insert(sessions, [
        _job("job-old-ok", "succeeded", 8, old_result),
        _job("job-old-failed", "failed", 30, None),
        _job("job-old-cancelled", "cancelled", 7.01, None),
        _job("job-new-ok", "succeeded", 6.9, new_result),
        _job("job-queued", "queued", None, None),
        _job("job-running", "running", None, None),
    ])  # fmt: skip
    assert sweep_expired(config, sessions) == 3
    assert _ids(sessions) == {"job-new-ok", "job-queued", "job-running"}
    assert sorted(p.name for p in results.iterdir()) == ["job-new-ok.jsonl"]
    assert sweep_expired(config, sessions) == 0


def test_retain_days_defaults_to_30_days(
    tmp_path: Path, tiny_model: TinyModel, sessions: sessionmaker[Session]
) -> None:
    """Issue 27 item 8: growth is bounded without any setting."""
    config = make_config(tmp_path, tiny_model.path)
    assert config.jobs.retain_days == 30
    _insert(sessions, [_job("job-ancient", "succeeded", 31, None),
                       _job("job-recent", "succeeded", 29, None)])  # fmt: skip
    assert sweep_expired(config, sessions) == 1
    assert _ids(sessions) == {"job-recent"}


def test_a_sweep_goes_through_more_than_one_batch(
    tmp_path: Path, tiny_model: TinyModel, sessions: sessionmaker[Session]
) -> None:
    config = make_config(tmp_path, tiny_model.path, retain_days=1)
    count = SWEEP_BATCH * 2 + 3
    _insert(sessions, [_job(f"job-{n:024x}", "failed", 2, None) for n in range(count)])
    assert sweep_expired(config, sessions) == count
    assert _ids(sessions) == set()


def test_the_workers_sweep_at_start(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = make_config(tmp_path, tiny_model.path, retain_days=1)
    engine = open_database(config.server)
    try:
        upgrade_to_head(engine)
        old, young = (
            _job("job-" + "e" * 24, "succeeded", 3, None),
            _job("job-" + "d" * 24, "cancelled", 0.5, None),
        )
        _insert(session_factory(engine), [old, young])
    finally:
        engine.dispose()
    with running_registry(config) as reg:
        for _ in range(500):
            if reg.http.get("/v1/jobs/job-" + "e" * 24).status_code == 404:
                break
            time.sleep(0.02)
        assert reg.http.get("/v1/jobs/job-" + "e" * 24).status_code == 404
        assert reg.http.get("/v1/jobs/job-" + "d" * 24).status_code == 200


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("retain_days = 0", "retain_days"),
        ("retain_days = 36501", "retain_days"),
        ('retain_days = "30"', "retain_days"),
        ("retain_days = 7.5", "retain_days"),
        ("retain_day = 7", "retain_day"),
    ],
)
def test_retain_days_is_strict(
    tmp_path: Path, tiny_model: TinyModel, line: str, needle: str
) -> None:
    path = write_config(tmp_path, student=tiny_model.path)
    path.write_text(path.read_text(encoding="utf-8") + f"\n[jobs]\n{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert needle in str(refused.value)


def test_retain_days_is_accepted(tmp_path: Path, tiny_model: TinyModel) -> None:
    path = write_config(tmp_path, student=tiny_model.path)
    path.write_text(path.read_text(encoding="utf-8") + "\n[jobs]\nretain_days = 30\n")
    assert load_config(path).jobs.retain_days == 30
