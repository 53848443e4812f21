"""Scoring jobs over teacher replica sets (issue 17, item 4), all real parts.

Real reference teachers on loopback (the session's tiny model), each behind a
``Switching`` ASGI wrapper that counts completion requests and, once armed,
serves a second real reference teacher after the N-th one: the same weights
with another ``max_model_len``, so every later answer carries a different
(valid) identity fingerprint: a replica that flips its identity mid-job.
Nothing is stubbed.  A job over three replicas writes the same corpus as the
same job against one teacher (byte for byte, once the job id and alias are
set aside); a replica that flips mid-job or is down is fenced and the job
completes on the others; when every replica fails the job fails closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import serve_app
from tests.jobs.harness import Registry, make_config, running_registry

SERVED = "tiny-ref"
SEQS = [[3 + i, 40 + i, 90 + 2 * i, 7 + (i % 5)][: 2 + i % 3] for i in range(12)]
NEVER = 1 << 30
JOB_TIMEOUT_S = 180.0


class Switching:
    """ASGI: ``first`` answers completion requests up to ``after``, ``second`` after that."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second
        self.after = NEVER
        self.count = 0
        self._lock = threading.Lock()

    def arm(self, more: int) -> None:
        """Switch after ``more`` further completion requests."""
        with self._lock:
            self.after = self.count + more

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = self.first
        if scope["type"] == "http" and scope["path"].endswith("/completions"):
            with self._lock:
                self.count += 1
                if self.count > self.after:
                    app = self.second
        await app(scope, receive, send)


class Holding:
    """ASGI: records every completion prompt; holds the one equal to ``hold`` until released,
    then has ``held_app`` (default ``app``) answer it."""

    def __init__(self, app: Any, hold: list[int], held_app: Any = None) -> None:
        self.app, self.hold = app, hold
        self.held_app = app if held_app is None else held_app
        self.prompts: list[list[int]] = []
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/completions"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        prompt = json.loads(body)["prompt"]
        self.prompts.append(prompt)
        app = self.app
        if prompt == self.hold:
            self.hold, app = [], self.held_app
            assert await asyncio.to_thread(self.release.wait, 120), "never released"
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return dict(await receive())
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)


@dataclass
class Teachers:
    same: ReferenceTeacher
    other: ReferenceTeacher  # the same weights, another identity (max_model_len)


@pytest.fixture(scope="module")
def teachers(tiny_model: TinyModel) -> Teachers:
    same, _ = load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=8, max_model_len=64
    )
    other, _ = load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=8, max_model_len=128
    )
    return Teachers(same, other)


@dataclass
class World:
    reg: Registry
    teachers: Teachers
    stack: contextlib.ExitStack

    def replica(self) -> tuple[str, Switching]:
        app = Switching(
            create_reference_app(self.teachers.same, api_key_env=None),
            create_reference_app(self.teachers.other, api_key_env=None),
        )
        return self.stack.enter_context(serve_app(app)), app

    def register(self, alias: str, urls: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"alias": alias, "kind": "remote", "provider": "vllm",
                                "model_id": SERVED}  # fmt: skip
        body.update({"url": urls[0]} if len(urls) == 1 else {"urls": urls})
        response = self.reg.http.post("/v1/teachers", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def run(self, alias: str) -> dict[str, Any]:
        submitted = self.reg.submit(alias, 4, sequences=SEQS)
        assert submitted.status_code == 201, submitted.text
        return self.reg.wait(submitted.json()["id"], timeout=JOB_TIMEOUT_S)

    def corpus(self, job: dict[str, Any], alias: str) -> bytes:
        """The corpus without its trailer, the job id and alias replaced by placeholders."""
        assert job["status"] == "succeeded", job
        body = self.reg.http.get(f"/v1/jobs/{job['id']}/result").content
        lines = body.splitlines(keepends=True)[:-1]  # the signature trailer signs the job id
        row = f'"job_id":"{job["id"]}","teacher":"{alias}"'.encode()
        assert all(row in line for line in lines[1:])
        return b"".join(line.replace(row, b'"job_id":"J","teacher":"T"') for line in lines)


@pytest.fixture
def world(tmp_path: Path, tiny_model: TinyModel, teachers: Teachers) -> Iterator[World]:
    # No score cache: the second job must really score again.
    config = make_config(tmp_path, tiny_model.path, concurrency=2, cache=False)
    with contextlib.ExitStack() as stack, running_registry(config) as reg:
        yield World(reg, teachers, stack)


def _replicas(world: World, alias: str) -> list[dict[str, Any]]:
    entry = world.reg.http.get(f"/v1/teachers/{alias}").json()
    return list(entry["replicas"])


def test_a_job_over_three_replicas_matches_the_job_on_one_teacher(world: World) -> None:
    urls, apps = zip(*(world.replica() for _ in range(3)), strict=True)
    single_url, _ = world.replica()
    world.register("one", [single_url])
    world.register("set", list(urls))
    expected = world.corpus(world.run("one"), "one")
    before = [app.count for app in apps]
    job = world.run("set")
    assert world.corpus(job, "set") == expected
    # Spread: every replica answered scoring requests beyond its 3 job probes.
    assert all(app.count - seen > 3 for app, seen in zip(apps, before, strict=True))
    assert {r["status"] for r in _replicas(world, "set")} == {"verified"}


def test_a_replica_that_flips_its_identity_mid_job_is_fenced(world: World) -> None:
    (good_a, _), (good_b, _), (flip_url, flipper) = (world.replica() for _ in range(3))
    single_url, _ = world.replica()
    world.register("one", [single_url])
    world.register("set", [good_a, good_b, flip_url])
    expected = world.corpus(world.run("one"), "one")
    flipper.arm(3 + 2)  # the job's three probes, two scoring answers, then another identity
    job = world.run("set")
    assert world.corpus(job, "set") == expected  # nothing from after the flip was kept
    assert flipper.count > flipper.after  # it did flip mid-job
    fenced = _replicas(world, "set")[2]
    assert fenced["status"] == "unavailable"
    assert f"fenced by job {job['id']}" in fenced["status_message"]
    assert "fingerprint" in fenced["status_message"]
    assert [r["status"] for r in _replicas(world, "set")[:2]] == ["verified", "verified"]


def test_a_replica_down_at_the_start_is_fenced_and_the_job_completes(
    world: World, teachers: Teachers
) -> None:
    good, _ = world.replica()
    single_url, _ = world.replica()
    with serve_app(create_reference_app(teachers.same, api_key_env=None)) as brief:
        world.register("set", [brief, good])
    world.register("one", [single_url])
    expected = world.corpus(world.run("one"), "one")
    job = world.run("set")
    assert world.corpus(job, "set") == expected
    down, up = _replicas(world, "set")
    assert down["status"] == "unavailable" and up["status"] == "verified"
    assert f"fenced by job {job['id']}" in down["status_message"]


def test_every_replica_failing_fails_the_job_closed(world: World) -> None:
    (url_a, flip_a), (url_b, flip_b) = (world.replica() for _ in range(2))
    world.register("set", [url_a, url_b])
    flip_a.arm(3 + 1)
    flip_b.arm(3 + 1)
    job = world.run("set")
    assert job["status"] == "failed", job
    error = job["error"]
    assert error["rule"] == "job.replicas_exhausted"
    assert "replica 0" in error["message"] and "replica 1" in error["message"]
    result = world.reg.http.get(f"/v1/jobs/{job['id']}/result")
    assert result.status_code != 200
    assert {r["status"] for r in _replicas(world, "set")} == {"unavailable"}
    # A new job is refused before any request: no replica is verified any more.
    again = world.run("set")
    assert again["status"] == "failed" and again["error"]["rule"] == "job.replicas_exhausted"


def _prompt(seq: list[int]) -> list[int]:
    return [*seq, seq[-1]]  # the causal final-row probe (jobs.scoring.target.probe_prompt)


def test_a_result_of_a_fenced_replica_not_yet_written_is_requested_again(
    world: World, teachers: Teachers
) -> None:
    """Row 0 is held at replica 1 while replica 0 answers row 1 (kept back: rows are
    written in order) and then flips; once replica 0 is fenced, row 1 is redone."""
    flip_url, flipper = world.replica()
    held = Holding(create_reference_app(teachers.same, api_key_env=None), _prompt(SEQS[0]))
    held_url = world.stack.enter_context(serve_app(held))
    single_url, _ = world.replica()
    world.register("one", [single_url])
    world.register("set", [flip_url, held_url])
    expected = world.corpus(world.run("one"), "one")
    flipper.arm(3 + 1)  # its probes, one good answer (row 1), then another identity
    submitted = world.reg.submit("set", 4, sequences=SEQS)
    assert submitted.status_code == 201, submitted.text
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while _replicas(world, "set")[0]["status"] != "unavailable":
        assert time.monotonic() < deadline, "replica 0 was never fenced"
        time.sleep(0.05)
    assert _prompt(SEQS[1]) not in held.prompts  # row 1's kept-back answer is replica 0's
    held.release.set()
    job = world.reg.wait(submitted.json()["id"], timeout=JOB_TIMEOUT_S)
    assert world.corpus(job, "set") == expected
    assert _prompt(SEQS[1]) in held.prompts  # redone on the standing replica


def test_a_redo_asked_after_every_replica_failed_reports_the_exhaustion(
    world: World, teachers: Teachers
) -> None:
    """Row 0 is held at replica 1; replica 0 answers row 1, then both flip on row 2 (the
    job runs out of replicas); row 0 then comes back with the pinned identity from a
    replica fenced since. Its redo is never sent, and the job fails with the exhaustion,
    not with the abandoned redo (a race CI once hit on PostgreSQL)."""
    flip_url, flipper = world.replica()
    second = Switching(
        create_reference_app(teachers.same, api_key_env=None),
        create_reference_app(teachers.other, api_key_env=None),
    )
    held = Holding(
        second, _prompt(SEQS[0]), held_app=create_reference_app(teachers.same, api_key_env=None)
    )
    held_url = world.stack.enter_context(serve_app(held))
    world.register("set", [flip_url, held_url])
    flipper.arm(3 + 1)  # its probes, row 1, then another identity
    second.arm(3)  # its probes, then another identity (the held row 0 is answered apart)
    submitted = world.reg.submit("set", 4, sequences=SEQS)
    assert submitted.status_code == 201, submitted.text
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while {r["status"] for r in _replicas(world, "set")} != {"unavailable"}:
        assert time.monotonic() < deadline, "the replicas were never fenced"
        time.sleep(0.05)
    held.release.set()
    job = world.reg.wait(submitted.json()["id"], timeout=JOB_TIMEOUT_S)
    assert job["status"] == "failed", job
    assert job["error"]["rule"] == "job.replicas_exhausted", job["error"]
    assert "replica 0" in job["error"]["message"] and "replica 1" in job["error"]["message"]
