"""A job's end is never recorded before its fences: a fence whose request was cancelled
(another request's failure ended the job) still writes before the pool is left.

Two real replicas' endpoints (``resolve_teacher_endpoint``, loopback, no credential) in
a real ``JobTeachers``; the requests are plain coroutines that fail as a flipped teacher
does, and the fence hook is a real function on a real thread, replica 0's slow (what
a busy database gives).  No mocks.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time

from kiln_registry.credentials.resolve import resolve_teacher_endpoint
from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.jobs.core.endpoints import EXHAUSTED_RULE, Endpoint, JobTeachers


def test_a_cancelled_requests_fence_is_written_before_the_pool_is_left() -> None:
    recorded: list[int] = []
    lock = threading.Lock()

    def on_fence(idx: int, reason: str) -> None:
        time.sleep(0.3 if idx == 0 else 0.0)
        with lock:
            recorded.append(idx)

    async def flipped(endpoint: Endpoint) -> None:
        await asyncio.sleep(0)
        raise ProbeFailed("system_fingerprint differs", rule="probe.fingerprint_changed")

    async def scenario() -> list[str | None]:
        proved = [
            (idx, resolve_teacher_endpoint(url, None, credentials={}, server_host="127.0.0.1"))
            for idx, url in enumerate(["http://127.0.0.1:9", "http://127.0.0.1:10"])
        ]
        teachers = JobTeachers(
            proved, alias="set", tls=ssl.create_default_context(), max_idle=1, on_fence=on_fence
        )
        rules: list[str | None] = []
        async with teachers:
            try:
                async with asyncio.TaskGroup() as group:  # the job's requests in flight
                    group.create_task(teachers.call(1, flipped))
                    group.create_task(teachers.call(2, flipped))
            except* ProbeFailed as failed:
                rules = [exc.rule for exc in failed.exceptions if isinstance(exc, ProbeFailed)]
            with lock:
                assert recorded == [1]  # replica 0's write is still running
        with lock:  # left the pool: every fence is written (the loop's threads still run)
            assert sorted(recorded) == [0, 1]
        return rules

    assert asyncio.run(scenario()) == [EXHAUSTED_RULE]
