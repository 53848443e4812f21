"""Two ``kiln serve`` replicas on one PostgreSQL database (issue 17, item 2).

Any replica serves any request; the entry cache of each stays coherent with
what the other committed (the ``kiln_data_version`` row); fifty concurrent
registrations of one alias spread over both replicas create exactly one row;
a replica SIGKILLed in the middle of a registration leaves nothing behind.
All real: a PostgreSQL server (tests/pg_server.py), ``kiln serve``
subprocesses and the reference teacher on loopback.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.model import ReferenceTeacher
from tests.api.support import REPO, ServerProcess, remote
from tests.helpers import serve_app
from tests.pg_server import PostgresServer
from tests.scaleout.support import pg_config, replicas

CONCURRENT = 50
RETRY_LIMIT = 200


def _configs(tmp_path: Path, url: str, student: Path, n: int = 2) -> list[Path]:
    return [pg_config(tmp_path / f"r{i}", url=url, student=student) for i in range(n)]


def _rows(server: PostgresServer, url: str, alias: str) -> int:
    with server.admin(url.rsplit("/", 1)[-1]) as conn:
        found = conn.execute("SELECT count(*) FROM teachers WHERE alias = %s", (alias,)).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.slow
def test_a_change_committed_on_one_replica_is_seen_by_the_next_read_on_the_other(
    tmp_path: Path, tiny_model: Any, teacher_url: str, pg_database: str
) -> None:
    with replicas(_configs(tmp_path, pg_database, tiny_model.path), tmp_path / "logs") as (a, b):
        created = httpx.post(a.url + "/v1/teachers", json=remote("shared", teacher_url), timeout=60)
        assert created.status_code == 200, created.text
        for _ in range(3):  # the second and third reads come from b's entry cache
            seen = httpx.get(b.url + "/v1/teachers/shared", timeout=10)
            assert seen.status_code == 200
            assert seen.json() == created.json()
        assert httpx.delete(a.url + "/v1/teachers/shared", timeout=10).status_code == 200
        for replica in (b, a):
            gone = httpx.get(replica.url + "/v1/teachers/shared", timeout=10)
            assert gone.status_code == 404, gone.text
        # Deleted aliases stay reserved: replica b refuses to hand the name out again.
        again = httpx.post(b.url + "/v1/teachers", json=remote("shared", teacher_url), timeout=60)
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "teacher_alias_reserved"


async def _register_until_decided(urls: list[str], body: dict[str, Any]) -> Counter[int]:
    """Each of ``CONCURRENT`` callers posts to its replica until it gets 200 or 409."""
    limits = httpx.Limits(max_connections=CONCURRENT + 5)
    async with httpx.AsyncClient(timeout=60, trust_env=False, limits=limits) as http:

        async def one(index: int) -> int:
            for _ in range(RETRY_LIMIT):
                response = await http.post(urls[index % len(urls)] + "/v1/teachers", json=body)
                if response.status_code != 503:  # the probe limiter is busy: retry
                    return response.status_code
                await asyncio.sleep(0.05)
            return 503

        return Counter(await asyncio.gather(*(one(i) for i in range(CONCURRENT))))


@pytest.mark.slow
def test_fifty_registrations_of_one_alias_over_two_replicas_create_one_row(
    tmp_path: Path,
    tiny_model: Any,
    teacher_url: str,
    pg_database: str,
    postgres_server: PostgresServer,
) -> None:
    with replicas(_configs(tmp_path, pg_database, tiny_model.path), tmp_path / "logs") as pair:
        outcomes = asyncio.run(
            _register_until_decided([p.url for p in pair], remote("raced", teacher_url))
        )
        assert outcomes == Counter({200: 1, 409: CONCURRENT - 1}), outcomes
        assert _rows(postgres_server, pg_database, "raced") == 1
        for process in pair:
            assert httpx.get(process.url + "/v1/teachers/raced", timeout=10).status_code == 200


class HeldTeacher:
    """ASGI wrapper: completion requests wait until ``release`` (the probe hangs)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.arrived = threading.Event()
        self.release = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/completions":
            self.arrived.set()
            while not self.release.is_set():
                await asyncio.sleep(0.02)
        await self.app(scope, receive, send)


@pytest.mark.slow
def test_a_replica_killed_mid_registration_leaves_nothing_and_the_other_serves(
    tmp_path: Path,
    tiny_model: Any,
    reference: tuple[ReferenceTeacher, Any],
    pg_database: str,
    postgres_server: PostgresServer,
) -> None:
    held = HeldTeacher(create_reference_app(reference[0], api_key_env=None))
    with (
        serve_app(held) as slow_url,
        replicas(_configs(tmp_path, pg_database, tiny_model.path), tmp_path / "logs") as (a, b),
    ):
        body = remote("interrupted", slow_url)
        outcome: dict[str, object] = {}

        def post() -> None:
            try:
                outcome["status"] = httpx.post(a.url + "/v1/teachers", json=body, timeout=30)
            except httpx.TransportError as exc:
                outcome["error"] = exc

        caller = threading.Thread(target=post)
        caller.start()
        assert held.arrived.wait(30), "the registration's probe never reached the teacher"
        a.kill()  # SIGKILL while the probe is in flight
        caller.join(30)
        assert "error" in outcome, outcome
        assert _rows(postgres_server, pg_database, "interrupted") == 0
        assert httpx.get(b.url + "/v1/teachers/interrupted", timeout=10).status_code == 404
        held.release.set()
        again = httpx.post(b.url + "/v1/teachers", json=body, timeout=60)
        assert again.status_code == 200, again.text
        assert _rows(postgres_server, pg_database, "interrupted") == 1


@pytest.mark.slow
def test_a_replica_restarts_on_the_shared_database(
    tmp_path: Path, tiny_model: Any, teacher_url: str, pg_database: str
) -> None:
    configs = _configs(tmp_path, pg_database, tiny_model.path)
    with replicas(configs[:1], tmp_path / "logs") as (a,):
        httpx.post(a.url + "/v1/teachers", json=remote("kept", teacher_url), timeout=60)
    started = time.monotonic()
    with ServerProcess(configs[1], tmp_path / "logs" / "later.log") as later:
        later.wait_ready()
        assert httpx.get(later.url + "/v1/teachers/kept", timeout=10).status_code == 200
    assert time.monotonic() - started >= 0


def _tokens(config: Path, *args: str) -> str:
    argv = [
        sys.executable,
        "-m",
        "kiln_registry.cli.main",
        "tokens",
        *args,
        "--config",
        str(config),
    ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


@pytest.mark.slow
def test_a_token_revoked_on_the_shared_database_is_refused_by_every_replica(
    tmp_path: Path, tiny_model: Any, pg_database: str
) -> None:
    configs = [
        pg_config(
            tmp_path / f"r{i}",
            url=pg_database,
            student=tiny_model.path,
            server={"auth": "required"},
        )
        for i in range(2)
    ]
    token = _tokens(configs[0], "create", "--name", "reader", "--scope", "read")
    with replicas(configs, tmp_path / "logs") as pair:
        headers = {"authorization": f"Bearer {token}"}
        for process in pair:  # both replicas load the token (and cache it)
            listed = httpx.get(process.url + "/v1/teachers", headers=headers, timeout=10)
            assert listed.status_code == 200, listed.text
        _tokens(configs[1], "revoke", "reader")
        for process in pair:
            refused = httpx.get(process.url + "/v1/teachers", headers=headers, timeout=10)
            assert refused.status_code == 401, refused.text
