"""The queue's storage on a real migrated SQLite file: claims, leases, the score cache."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.db.engine import session_factory, upgrade_to_head
from kiln_registry.db.models import utc_timestamp
from kiln_registry.db.repository import unit_of_work
from kiln_registry.domain.errors import InputError, JobConflict
from kiln_registry.jobs.core.lease_repository import DeviceLeases
from kiln_registry.jobs.core.models import JobRow, ScoreCacheRow
from kiln_registry.jobs.core.repository import JobRepository
from kiln_registry.jobs.scoring import cache
from kiln_registry.jobs.scoring.cache import ScoredSequence
from tests.backend import open_registry_database


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = open_registry_database(tmp_path / "registry.db")  # either backend
    upgrade_to_head(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def _job(job_id: str) -> JobRow:
    now = utc_timestamp()
    return JobRow(
        id=job_id, kind="teacher_scoring", status="queued", teacher_alias="t",
        teacher_kind="remote", teacher_url="http://127.0.0.1:1", teacher_credential_id=None,
        teacher_model_id="m", teacher_created_at=now, identity_json="{}",
        identity_digest="a" * 64, top_k=2, source="inline", corpus_path=None,
        corpus_sha256=None, sequence_count=1, token_count=1, device=None, claim_token=None,
        cancel_requested=0, attempts=0, scored_count=0, cache_hits=0, requests_sent=0,
        retries=0, created_at=now, updated_at=now,
    )  # fmt: skip


def test_concurrent_claims_never_share_a_job(sessions: sessionmaker[Session]) -> None:
    with unit_of_work(sessions) as session:
        for i in range(20):
            JobRepository(session).insert(_job(f"job-{i:024x}"), [("0", b"\x01\0\0\0", "x")])
    claimed: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        while True:
            with unit_of_work(sessions) as session:
                row = JobRepository(session).claim_next(f"token-{n}")
                if row is None:
                    return
                with lock:
                    claimed.append(row.id)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(claimed) == [f"job-{i:024x}" for i in range(20)]


def test_claims_are_token_bound_and_recovery_requeues(sessions: sessionmaker[Session]) -> None:
    with unit_of_work(sessions) as session:
        repo = JobRepository(session)
        repo.insert(_job("job-a"), [])
        row = repo.claim_next("tok")
        assert row is not None and row.status == "probing" and row.attempts == 1
        assert not repo.update_claimed("job-a", "other", scored_count=5)
        assert repo.update_claimed("job-a", "tok", status="running")
    with unit_of_work(sessions) as session:
        assert JobRepository(session).requeue_expired() == []  # the lease is still live
        session.execute(update(JobRow).values(lease_expires_at="2000-01-01T00:00:00.000000Z"))
    with unit_of_work(sessions) as session:
        assert JobRepository(session).requeue_expired() == ["job-a"]
    with unit_of_work(sessions) as session:
        repo = JobRepository(session)
        again = repo.require("job-a")
        assert (again.status, again.claim_token) == ("queued", None)
        assert not repo.update_claimed("job-a", "tok", scored_count=1)  # the old claim is void
        repo.request_cancel("job-a")
        assert repo.require("job-a").status == "cancelled"
        with pytest.raises(InputError):
            repo.list_jobs(limit=0)


def test_leases_are_exclusive_per_device(sessions: sessionmaker[Session]) -> None:
    results: list[str | None] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        with unit_of_work(sessions) as session:
            device = DeviceLeases(session, ("cuda:0", "cuda:1")).acquire(f"job-{n}", f"t{n}")
        with lock:
            results.append(device)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(d for d in results if d) == ["cuda:0", "cuda:1"]
    assert results.count(None) == 4
    with unit_of_work(sessions) as session:
        leases = DeviceLeases(session, ("cuda:0", "cuda:1"))
        holder = leases.held()["cuda:0"]
        assert leases.release(holder, "wrong-token") == 0
        assert leases.release(holder, "t" + holder.split("-")[1]) == 1
        assert leases.free_count() == 1
        assert leases.release_orphans() == 1  # job-N rows do not exist: the lease is an orphan
        assert DeviceLeases(session, ("cuda:0",), host="other-host").free_count() == 1


def _scores(n: int, k: int) -> ScoredSequence:
    ids = np.arange(n * k, dtype=np.int32).reshape(n, k)
    lps = -np.linspace(0.5, 3.0, n * k, dtype=np.float32).reshape(n, k)
    return ScoredSequence(ids, np.sort(lps, axis=1)[:, ::-1].copy(), -np.ones(n - 1, np.float32))


def test_cache_round_trip_is_keyed_by_identity_k_and_tokens(
    sessions: sessionmaker[Session],
) -> None:
    a, b = "a" * 64, "b" * 64
    with unit_of_work(sessions) as session:
        cache.store(session, a, 2, [("s1", _scores(3, 2)), ("s2", _scores(1, 2))])
        cache.store(session, a, 2, [("s1", _scores(5, 2))])  # an existing key keeps its row
    with unit_of_work(sessions) as session:
        found = cache.lookup(session, a, 2, ["s1", "s2", "s3"])
        assert sorted(found) == ["s1", "s2"]
        assert np.array_equal(found["s1"].topk_ids, _scores(3, 2).topk_ids)
        assert found["s1"].topk_logprobs.dtype == np.float32 and found["s2"].row_count == 1
        assert cache.lookup(session, b, 2, ["s1"]) == {}
        assert cache.lookup(session, a, 3, ["s1"]) == {}
        stats = cache.stats(session)
        assert [(s.identity_digest, s.top_k, s.rows) for s in stats] == [(a, 2, 2)]
        assert stats[0].bytes == (3 * 2 * 8 + 2 * 4) + (1 * 2 * 8)
    with unit_of_work(sessions) as session:
        assert cache.prune(session, "sha256:" + a) == 2 and cache.count(session) == 0
    with pytest.raises(InputError):
        cache.check_identity_digest("not-a-digest")


def test_a_corrupt_cache_row_is_refused_not_used(
    sessions: sessionmaker[Session], engine: Engine
) -> None:
    with unit_of_work(sessions) as session:
        cache.store(session, "a" * 64, 2, [("s1", _scores(3, 2))])
    with engine.begin() as conn:
        conn.execute(update(ScoreCacheRow).values(topk_ids=b"\x00"))  # one byte: not <i4
    with unit_of_work(sessions) as session, pytest.raises(JobConflict) as caught:
        cache.lookup(session, "a" * 64, 2, ["s1"])
    assert caught.value.rule == "cache.corrupt"
