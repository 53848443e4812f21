"""Concurrency and crash consistency of the registry database.

* Concurrent registrations of different aliases raced against concurrent
  deletes and re-registrations (one in-process registry, a probe limiter
  wide enough that nothing is turned away as busy): afterwards every alias is
  either absent or fully present (verified status, identity JSON whose
  SHA-256 is the stored digest, a passed receipt for that digest).  The
  one-alias race lives in ``tests/api/test_concurrency.py``.
* SIGKILL of a ``kiln serve`` subprocess at injected points of a
  registration: while the teacher stalls the second probe, while it stalls
  the cap probe, and at several delays after the cap probe was answered
  (racing the commit).  Each kill is followed by a restart on the same
  database, which must pass ``PRAGMA integrity_check`` and hold the alias
  completely or not at all.
* SIGKILL of ``kiln serve`` while it converts a legacy (pre-Alembic) SQLite
  registry and imports a legacy ``teachers.json`` at start-up, at the first
  sign of a write transaction and at delays after it; the restart finishes
  the migration and no planted secret survives.
* SIGKILL of ``kiln serve`` twice during a scoring job (after 3 and 15 of 40
  sequences), each followed by a restart: the database stays intact, the
  job's sequence set is complete, every score-cache row is whole, and the
  job finally succeeds (one attempt per start) with no ``.partial`` file.

No hooks in the product: the kill points are chosen from outside (teacher
requests seen, files appearing, job progress).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.domain.vocabulary import TERMINAL_JOB_STATUSES
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.core.models import JOB_STATUSES
from kiln_registry.model.tokenizer import student_vocab
from kiln_registry.probe.client import ProbeLimiter
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import reference  # noqa: F401  (session fixture)
from tests.api.support import RegistryServer, ServerProcess, remote, run_registry, write_config
from tests.backend import fetch, integrity, is_postgres
from tests.jobs.harness import Controlled, student_identity
from tests.probe.teacher_server import TeacherServer
from tests.reliability import faulty_teachers as ft
from tests.test_legacy_crash import LEGACY_ROWS, REGISTRY, SECRET, _legacy_db

Reference = tuple[ReferenceTeacher, TeacherIdentity]
ALIASES = 16
ROUNDS = 3
WAIT_S = 30.0


def _rows(database: Path, sql: str) -> list[Any]:
    """One read of the registry's database: the SQLite file as it lies (a plain sqlite3
    connection, no pragmas), or its PostgreSQL stand-in (tests/backend.py)."""
    if is_postgres():
        return fetch(database, sql)
    conn = sqlite3.connect(database, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def assert_consistent(database: Path) -> dict[str, str]:
    """Integrity, then every teacher row complete; returns alias -> status."""
    assert integrity(database) == "ok"
    if not is_postgres():  # PostgreSQL checks every foreign key as it writes
        assert _rows(database, "PRAGMA foreign_key_check") == []
    receipts = {(a, d) for a, d in _rows(database, "SELECT alias, identity_digest FROM "
                                         "probe_receipts WHERE outcome = 'passed'")}  # fmt: skip
    status: dict[str, str] = {}
    for alias, kind, state, identity, digest in _rows(
        database, "SELECT alias, kind, status, identity_json, identity_digest FROM teachers"
    ):
        status[alias] = state
        if kind != "remote" or state == "legacy_unverified":
            assert identity is None and digest is None, alias
            continue
        assert state == "verified", (alias, state)
        assert hashlib.sha256(identity.encode()).hexdigest() == digest, alias
        assert (alias, digest) in receipts, alias
    return status


# -- concurrent registrations and deletes ------------------------------------------------


async def _churn(url: str, teacher: str, seed: int) -> list[tuple[str, int]]:
    """Per alias: register, maybe delete, again; two snipers delete random aliases meanwhile."""
    rng = random.Random(seed)
    outcomes: list[tuple[str, int]] = []
    limits = httpx.Limits(max_connections=2 * ALIASES + 4)
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False, limits=limits) as http:

        async def call(method: str, alias: str) -> None:
            if method == "POST":
                response = await http.post("/v1/teachers", json=remote(alias, teacher))
            else:
                response = await http.delete(f"/v1/teachers/{alias}")
            outcomes.append((method, response.status_code))

        async def worker(alias: str) -> None:
            for _ in range(ROUNDS):
                await call("POST", alias)
                await asyncio.sleep(rng.random() * 0.02)
                if rng.random() < 0.6:
                    await call("DELETE", alias)

        async def sniper() -> None:
            for _ in range(ALIASES * ROUNDS // 2):
                await asyncio.sleep(rng.random() * 0.01)
                await call("DELETE", f"t{rng.randrange(ALIASES):02d}")

        await asyncio.gather(*(worker(f"t{i:02d}") for i in range(ALIASES)), sniper(), sniper())
    return outcomes


def test_concurrent_registrations_and_deletes_leave_whole_rows(
    tmp_path: Path,
    tiny_model: TinyModel,
    reference: Reference,  # noqa: F811
) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    teacher_server = ft.FaultyTeacher(ft.ScriptedTeacher(reference[1]))
    with teacher_server as teacher, run_registry(config) as registry:
        registry.ctx.probe_limiter = ProbeLimiter(max_in_flight=ALIASES * ROUNDS)
        outcomes = asyncio.run(_churn(registry.url, teacher.base_url, seed=9))
        _api_agrees(registry, tmp_path / "registry.db")
    allowed = {("POST", 200), ("POST", 409), ("DELETE", 200), ("DELETE", 404)}
    assert set(outcomes) <= allowed, set(outcomes) - allowed
    assert ("POST", 200) in outcomes and ("DELETE", 200) in outcomes, outcomes
    print(f"churn: {len(outcomes)} requests, {Counter(outcomes)}")


def _api_agrees(registry: RegistryServer, database: Path) -> None:
    status = assert_consistent(database)
    with registry.client() as http:
        listed = {t["spec"]["alias"] for t in http.get("/v1/teachers").json()["teachers"]}
        assert listed == set(status)
        for i in range(ALIASES):
            alias = f"t{i:02d}"
            entry = http.get(f"/v1/teachers/{alias}")
            if alias not in status:
                assert entry.status_code == 404
                continue
            revision = entry.json()["identity_revision"]
            receipts = http.get(f"/v1/teachers/{alias}/receipts").json()["receipts"]
            assert revision in [r["identity_revision"] for r in receipts]


# -- SIGKILL during registration ---------------------------------------------------------

# (request index the kill waits for, delay after it arrived, stall that request?)
KILL_POINTS = [
    (1, 0.2, True),  # the K=max_top_k probe is stalling
    (2, 0.2, True),  # the cap probe is stalling
    (2, 0.0, False),  # the cap probe was just answered: racing the commit
    (2, 0.03, False),
]


def _wait_for(predicate: Any, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def _kill_during_registration(
    server: ServerProcess, identity: TeacherIdentity, alias: str, point: tuple[int, float, bool]
) -> None:
    index, delay, stall = point
    faults = {index: ft.slow_loris(interval_s=0.5)} if stall else {}
    with ft.FaultyTeacher(ft.ScriptedTeacher(identity, faults=faults)) as teacher:
        client = threading.Thread(target=_post_quietly, args=(server.url, alias, teacher.base_url))
        client.start()
        _wait_for(lambda: len(teacher.requests) > index, f"request {index}")
        time.sleep(delay)
        server.kill()
        client.join(WAIT_S)


def _post_quietly(url: str, alias: str, teacher: str) -> None:
    with contextlib.suppress(httpx.TransportError):  # the server is killed under the request
        httpx.post(url + "/v1/teachers", json=remote(alias, teacher), timeout=WAIT_S,
                   trust_env=False)  # fmt: skip


@pytest.mark.slow
def test_sigkill_at_injected_points_of_a_registration(
    tmp_path: Path,
    tiny_model: TinyModel,
    reference: Reference,  # noqa: F811
) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    database = tmp_path / "registry.db"
    outcomes: list[str] = []
    for n, point in enumerate(KILL_POINTS):
        with ServerProcess(config, tmp_path / f"run{n}.log") as server:
            server.wait_ready()
            _kill_during_registration(server, reference[1], f"killed-{n}", point)
        status = assert_consistent(database)
        outcomes.append(status.get(f"killed-{n}", "absent"))
        if point[2]:  # killed mid-probe: nothing may have been written
            assert f"killed-{n}" not in status
    with ServerProcess(config, tmp_path / "final.log") as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as http:
            listed = {t["spec"]["alias"] for t in http.get("/v1/teachers").json()["teachers"]}
        server.stop()
    assert listed == {f"killed-{n}" for n, o in enumerate(outcomes) if o == "verified"}
    assert_consistent(database)
    print(f"registration kills: {len(KILL_POINTS)}, outcomes {outcomes}")


# -- SIGKILL during the legacy migration -------------------------------------------------

MIGRATION_DELAYS = [0.0, 0.05]


def _migration_state(database: Path) -> str:
    """``legacy`` (the untouched original), ``converted`` or ``imported``; never a mix."""
    tables = {r[0] for r in _rows(database, "SELECT name FROM sqlite_master WHERE type='table'")}
    if "alembic_version" not in tables:
        assert _rows(database, "SELECT * FROM teachers ORDER BY alias") == LEGACY_ROWS
        return "legacy"
    status = assert_consistent(database)
    converted = {row[0] for row in LEGACY_ROWS}
    imported = {f"j{alias}" for alias in REGISTRY}
    assert set(status) in (converted, converted | imported), len(status)
    assert set(status.values()) == {"legacy_unverified"}
    return "imported" if set(status) == converted | imported else "converted"


def _write_transaction_started(directory: Path) -> bool:
    """A non-empty rollback journal or WAL beside the database (either may vanish between
    the listing and the stat: SQLite deletes the journal when a transaction commits)."""
    for path in directory.glob("registry.db-*"):
        if not path.name.endswith(("-journal", "-wal")):
            continue
        try:
            if path.stat().st_size > 0:
                return True
        except FileNotFoundError:
            continue
    return False


def _legacy_setup(directory: Path, student: Path) -> Path:
    directory.mkdir()
    _legacy_db(directory / "registry.db")
    registry = directory / "teachers.json"
    registry.write_text(json.dumps({f"j{a}": v | {"alias": f"j{a}"} for a, v in REGISTRY.items()}))
    return write_config(directory, student=student, server={"legacy_registry": registry})


def _kill_at_first_write(config: Path, directory: Path, delay: float) -> None:
    # A legacy SQLite file is behind head: the operator asks for the conversion.
    with ServerProcess(config, directory / f"kill-{delay}.log", extra=("--upgrade",)) as server:
        _wait_for(
            lambda: _write_transaction_started(directory) or server.proc.poll() is not None,
            "the migration to start",
        )
        time.sleep(delay)
        server.kill()


@pytest.mark.slow
@pytest.mark.sqlite_only(reason="converts a legacy SQLite registry file")
@pytest.mark.parametrize("delay", MIGRATION_DELAYS)
def test_sigkill_during_the_legacy_migration(
    tmp_path: Path, tiny_model: TinyModel, delay: float
) -> None:
    config = _legacy_setup(tmp_path / "registry", tiny_model.path)
    directory = config.parent
    _kill_at_first_write(config, directory, delay)
    left = _migration_state(directory / "registry.db")
    with ServerProcess(config, directory / "restart.log", extra=("--upgrade",)) as server:
        server.wait_ready()
        server.stop()
    assert _migration_state(directory / "registry.db") == "imported"
    for file in directory.iterdir():
        if file.is_file():
            assert SECRET.encode() not in file.read_bytes(), file.name
    print(f"migration kill +{delay}s left the database {left}")


# -- SIGKILL during a job ----------------------------------------------------------------

JOB_SEQUENCES = [[i % 500 + 1, (i * 7) % 500 + 1, 3] for i in range(40)]
JOB_KILLS_AT = (3, 15)  # sequences done when the server is killed


def assert_jobs_consistent(database: Path) -> list[tuple[str, str]]:
    """Every job row valid and its sequence set complete; every cache row whole."""
    assert integrity(database) == "ok"
    jobs = _rows(database, "SELECT id, status, sequence_count FROM jobs")
    for job_id, status, count in jobs:
        assert status in JOB_STATUSES, status
        stored = _rows(database, f"SELECT count(*) FROM job_sequences WHERE job_id = '{job_id}'")
        assert stored == [(count,)], (job_id, stored, count)
    for rows, ids, lps, tokens in _rows(database, "SELECT row_count, length(topk_ids), "
                                        "length(topk_logprobs), length(token_logprobs) "
                                        "FROM score_cache"):  # fmt: skip
        assert rows > 0 and ids > 0 and lps > 0 and tokens > 0
    return [(job_id, status) for job_id, status, _ in jobs]


def _job_config(directory: Path, student: Path) -> Path:
    config = write_config(directory, student=student)
    with config.open("a", encoding="utf-8") as out:
        out.write(f'\n[jobs]\nconcurrency = 1\nresult_root = "{directory / "results"}"\n')
    return config


def _wait_done(url: str, job_id: str, done: int) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        job: dict[str, Any] = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
        if job["status"] in TERMINAL_JOB_STATUSES or job["progress"]["done"] >= done:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_during_a_job_then_restart(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = _job_config(tmp_path, tiny_model.path)
    database = tmp_path / "registry.db"
    identity = student_identity(student_vocab(tiny_model.path)[0])
    with TeacherServer(Controlled(identity, delay_s=0.03)) as teacher:
        job_id = ""
        for n, done in enumerate((*JOB_KILLS_AT, len(JOB_SEQUENCES))):
            with ServerProcess(config, tmp_path / f"job{n}.log") as server:
                server.wait_ready()
                if not job_id:
                    job_id = _submit_job(server.url, f"http://127.0.0.1:{teacher.port}")
                job = _wait_done(server.url, job_id, done)
                if done < len(JOB_SEQUENCES):
                    server.kill()
                else:
                    server.stop()
            states = assert_jobs_consistent(database)
            assert_consistent(database)
            assert [row_id for row_id, _ in states] == [job_id]
    assert job["status"] == "succeeded", job
    assert job["attempts"] == len(JOB_KILLS_AT) + 1
    assert not list((tmp_path / "results").glob(".*.partial"))
    print(f"job kills: {len(JOB_KILLS_AT)}, final {job['status']} after {job['attempts']} attempts")


def _submit_job(url: str, teacher: str) -> str:
    with httpx.Client(base_url=url, timeout=30, trust_env=False) as http:
        assert http.post("/v1/teachers", json=remote("t", teacher)).status_code == 200
        body = {"kind": "teacher_scoring", "teacher": "t", "top_k": 2, "sequences": JOB_SEQUENCES}
        submitted = http.post("/v1/jobs", json=body)
        assert submitted.status_code in (200, 201, 202), submitted.text
        return str(submitted.json()["id"])
