"""Faults over real loopback HTTP: changed fingerprints, replaced aliases, retries, cancellation.

Teachers are ``tests/probe/teacher_server.TeacherServer`` instances whose
answers the test controls (``harness.Controlled``).  A "blocker" job on its
own teacher holds the only device until the test opens its gate, so a second
job stays queued while the test changes the world between its submission and
its start.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.core.lease_repository import DeviceLeases
from kiln_registry.jobs.core.signing import parse_keys
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.jobs.scoring import cache as score_cache
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.harness import Controlled, Registry, make_config, running_registry, student_identity
from tests.probe.teacher_server import HASH_A, TeacherServer

SEQS = [[3, 4, 5], [6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16], [17, 18, 19]]
OTHER_INFERENCE = "e" * 64
BLOCKER_INFERENCE = "d" * 64


@dataclass
class World:
    reg: Registry
    tmp: Path
    vocab: str
    stack: ExitStack

    def teacher(self, handler: Controlled) -> str:
        server = self.stack.enter_context(TeacherServer(handler))
        return f"http://127.0.0.1:{server.port}"

    def blocker(self) -> tuple[str, threading.Event]:
        """Register and start a job that holds the device until the event is set."""
        gate = threading.Event()
        identity = student_identity(self.vocab, inference=BLOCKER_INFERENCE)
        url = self.teacher(Controlled(identity, gate=gate))
        self.reg.register("blocker", url, "teacher-tiny")
        response = self.reg.submit("blocker", 2, sequences=[[1, 2]])
        job_id = response.json()["id"]
        self.reg.wait(job_id, ("running",))
        return job_id, gate

    def counts(self, digest: str) -> tuple[int, int]:
        with unit_of_work(self.reg.ctx.sessions) as session:
            return score_cache.count(session, digest), DeviceLeases(session, ("cpu",)).count()


@pytest.fixture
def world(tmp_path: Path, tiny_model: TinyModel, student_vocab_sha256: str) -> Iterator[World]:
    config = make_config(tmp_path, tiny_model.path, concurrency=1)
    with ExitStack() as stack, running_registry(config) as reg:
        yield World(reg, tmp_path, student_vocab_sha256, stack)


@contextmanager
def _held(world: World) -> Iterator[None]:
    blocker, gate = world.blocker()
    try:
        yield
    finally:
        gate.set()
        assert world.reg.wait(blocker)["status"] == "succeeded"


def test_fingerprint_changed_between_submission_and_start_fails_before_lease_and_cache(
    world: World,
) -> None:
    pinned = student_identity(world.vocab)
    changed = student_identity(world.vocab, inference=OTHER_INFERENCE)
    state = {"fp": pinned.fingerprint()}
    url = world.teacher(Controlled(pinned, fingerprint=lambda i: state["fp"]))
    world.reg.register("t", url, "teacher-tiny")
    with _held(world):
        job_id = world.reg.submit("t", 4, sequences=SEQS).json()["id"]
        assert world.reg.job(job_id)["status"] == "queued"
        state["fp"] = changed.fingerprint()
    job = world.reg.wait(job_id)
    assert job["status"] == "failed"
    assert job["error"]["rule"] == "probe.fingerprint_pinned"
    assert job["timestamps"]["spec_checked_at"] and not job["timestamps"]["probed_at"]
    assert not job["timestamps"]["leased_at"] and job["device"] is None
    assert world.counts(pinned.digest()) == (0, 0)
    assert world.counts(changed.digest()) == (0, 0)


def test_fingerprint_changed_between_the_two_probes(world: World) -> None:
    pinned = student_identity(world.vocab)
    changed = student_identity(world.vocab, inference=OTHER_INFERENCE).fingerprint()
    seen: list[int] = []

    def fingerprint(index: int) -> str:
        seen.append(index)
        return changed if index == 4 else pinned.fingerprint()  # 3 = discover, 4 = max_top_k

    world.reg.register(
        "t", world.teacher(Controlled(pinned, fingerprint=fingerprint)), "teacher-tiny"
    )
    job = world.reg.wait(world.reg.submit("t", 4, sequences=SEQS).json()["id"])
    assert job["status"] == "failed" and job["error"]["rule"] == "probe.fingerprint_changed"
    assert not job["timestamps"]["probed_at"] and job["progress"]["requests"] == 0
    assert world.counts(pinned.digest()) == (0, 0)
    receipts = world.reg.http.get("/v1/teachers/t/receipts").json()["receipts"]
    assert receipts[0]["outcome"] == "failed"


def test_fingerprint_changed_mid_job_fails_and_discards_uncommitted_results(world: World) -> None:
    pinned = student_identity(world.vocab)
    changed = student_identity(world.vocab, inference=OTHER_INFERENCE).fingerprint()
    # Requests 0-2 register, 3-5 are the job's probes, 6.. score; the third score changes.
    handler = Controlled(pinned, fingerprint=lambda i: changed if i >= 8 else pinned.fingerprint())
    world.reg.register("t", world.teacher(handler), "teacher-tiny")
    job = world.reg.wait(world.reg.submit("t", 4, sequences=SEQS).json()["id"])
    # A scoring answer is checked against the pinned identity: "changed" is that rule.
    assert job["status"] == "failed" and job["error"]["rule"] == "probe.fingerprint_changed"
    assert job["progress"]["requests"] == 3 and job["result"] is None
    assert job["timestamps"]["leased_at"] is not None
    assert not list((world.tmp / "results").iterdir())  # no corpus, no partial file
    cached, leases = world.counts(pinned.digest())
    assert cached <= 2 and leases == 0
    assert world.reg.http.get(f"/v1/jobs/{job['id']}/result").json()["error"]["code"] == (
        "job_conflict"
    )


def test_alias_deleted_or_replaced_after_submission_fails_phase_a(world: World) -> None:
    pinned = student_identity(world.vocab)
    url = world.teacher(Controlled(pinned))
    for alias in ("replaced", "deleted"):
        world.reg.register(alias, url, "teacher-tiny")
    with _held(world):
        replaced = world.reg.submit("replaced", 2, sequences=SEQS).json()["id"]
        deleted = world.reg.submit("deleted", 2, sequences=SEQS).json()["id"]
        for alias in ("replaced", "deleted"):
            assert world.reg.http.delete(f"/v1/teachers/{alias}").status_code == 200
        # A deleted alias stays reserved until an admin releases it (issue 15).
        assert world.reg.http.post("/v1/admin/aliases/replaced/release").status_code == 200
        world.reg.register("replaced", url, "teacher-tiny")  # same teacher, new registration
    for job_id, rule in ((replaced, "job.teacher_replaced"), (deleted, "job.teacher_deleted")):
        job = world.reg.wait(job_id)
        assert job["status"] == "failed" and job["error"]["rule"] == rule
        assert "deleted or replaced after submission" in job["error"]["message"]
        assert job["timestamps"]["spec_checked_at"] is None
    assert world.counts(pinned.digest()) == (0, 0)


def test_503_and_dropped_connections_are_retried_other_statuses_are_not(world: World) -> None:
    pinned = student_identity(world.vocab)
    drops = {6: 503, 7: -1, 9: 503}  # -1: the connection ends mid-body
    flaky = Controlled(pinned, status_for=drops.get)
    world.reg.register("flaky", world.teacher(flaky), "teacher-tiny")
    job = world.reg.wait(world.reg.submit("flaky", 3, sequences=SEQS).json()["id"])
    assert job["status"] == "succeeded", job
    assert job["progress"]["retries"] == 3 and job["progress"]["requests"] == len(SEQS) + 3

    broken = Controlled(pinned, status_for=lambda i: 500 if i == 6 else None)
    world.reg.register("broken", world.teacher(broken), "teacher-tiny")
    job = world.reg.wait(world.reg.submit("broken", 2, sequences=SEQS).json()["id"])
    assert job["status"] == "failed" and job["error"]["rule"] == "probe.http_status"
    assert job["progress"]["retries"] == 0


def test_cancel_running_and_queued_jobs(world: World) -> None:
    pinned = student_identity(world.vocab)
    world.reg.register("slow", world.teacher(Controlled(pinned, delay_s=0.05)), "teacher-tiny")
    running = world.reg.submit("slow", 2, sequences=[[i, i + 1] for i in range(1, 200)]).json()
    queued = world.reg.submit("slow", 2, sequences=SEQS).json()
    world.reg.wait(running["id"], ("running",))
    assert world.reg.http.post(f"/v1/jobs/{queued['id']}/cancel").json()["status"] == "cancelled"
    assert world.reg.http.post(f"/v1/jobs/{running['id']}/cancel").json()["cancel_requested"]
    job = world.reg.wait(running["id"])
    assert job["status"] == "cancelled" and 0 < job["progress"]["done"] < 199
    assert world.counts(pinned.digest())[1] == 0
    assert not [p for p in (world.tmp / "results").iterdir() if running["id"] in p.name]
    again = world.reg.http.post(f"/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_cached_rerun_serves_the_same_identity_only(world: World) -> None:
    pinned = student_identity(world.vocab)
    other = student_identity(world.vocab, inference=OTHER_INFERENCE)
    first = Controlled(pinned)
    world.reg.register("a", world.teacher(first), "teacher-tiny")
    world.reg.register("b", world.teacher(Controlled(other)), "teacher-tiny")
    one = world.reg.wait(world.reg.submit("a", 4, sequences=SEQS).json()["id"])
    two = world.reg.wait(world.reg.submit("a", 4, sequences=SEQS).json()["id"])
    assert two["progress"]["cache_hits"] == len(SEQS) and two["progress"]["requests"] == 0
    assert len(first.prompts) == 3 * 2 + len(SEQS)  # registration + two jobs probe; one scoring
    body_one = world.reg.http.get(f"/v1/jobs/{one['id']}/result").text.splitlines()
    body_two = world.reg.http.get(f"/v1/jobs/{two['id']}/result").text.splitlines()
    # Same rows; each corpus carries its own signed trailer (the job id is in the rows).
    strip = [line.replace(one["id"], "JOB") for line in body_one[:-1]]
    assert strip == [line.replace(two["id"], "JOB") for line in body_two[:-1]]
    assert body_two[-1].startswith('{"kiln.corpus-trailer.v1":') and body_two[-1] != body_one[-1]
    cached = world.tmp / "cached.jsonl"
    cached.write_bytes(world.reg.http.get(f"/v1/jobs/{two['id']}/result").content)
    keys = parse_keys(world.reg.http.get("/v1/keys").json(), "GET /v1/keys")
    assert verify_corpus(cached, keys).sequences == len(SEQS)
    three = world.reg.wait(world.reg.submit("b", 4, sequences=SEQS).json()["id"])
    assert three["progress"]["cache_hits"] == 0 and three["progress"]["scored"] == len(SEQS)
    other_k = world.reg.wait(world.reg.submit("a", 3, sequences=SEQS).json()["id"])
    assert other_k["progress"]["cache_hits"] == 0
    assert HASH_A in body_one[0]
