"""What one running registry needs, built once at start-up (``server.build_context``).

``RegistryContext`` holds the configuration, the database handles (a
writer session factory whose transactions BEGIN IMMEDIATE, a reader one
whose transactions BEGIN DEFERRED so a GET never waits for the write lock,
and the coherent cache of rendered entries),
the loaded student's vocabulary view, the probe limiters (registrations:
``registration_limiter``, fair across callers; jobs: their own), the metrics and,
under ``kiln serve``, the local-teacher manager (typed by
``teachers.context.LocalTeacherManager``; ``close()`` drains it).
The outbound HTTP client is created in the app's lifespan (never at import
time) and attached here.  Nothing in this module touches the network.  It
satisfies ``teachers.context.TeacherServices``, what the teachers layer needs.

Imports: SQLAlchemy, httpx (the type only), ``kiln_registry.config.settings``,
``kiln_registry.db``, ``kiln_registry.probe``, ``observability.metrics`` and
``teachers.context`` (protocols); never FastAPI.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.api.entry_cache import EntryCache
from kiln_registry.config.settings import KilnConfig
from kiln_registry.db.data_version import open_version_reader
from kiln_registry.db.engine import BEGIN_OPTION, session_factory
from kiln_registry.db.repository import unit_of_work
from kiln_registry.jobs.environment import JOB_PROBES
from kiln_registry.observability.metrics import RegistryMetrics
from kiln_registry.probe.client import ProbeLimiter
from kiln_registry.probe.verify import StudentView
from kiln_registry.teachers.context import LocalTeacherManager

REGISTRATION_PROBES = 4
REGISTRATION_PROBES_PER_CALLER = 2
REGISTRATION_ADMIN_RESERVED = 1
REGISTRATION_WAITING = 32
REGISTRATION_WAITING_PER_CALLER = 4
REGISTRATION_WAIT_S = 30.0


def registration_limiter() -> ProbeLimiter:
    """Registration and re-probe slots, fair across callers (issue 27, item 7).

    Four slots, one of them reserved for admin tokens; one caller (a token, else a
    client address) holds at most two.  A probe with no free slot waits in a queue of
    at most 32 (4 per caller) for up to 30 s; each freed slot goes to the waiting
    caller with the fewest probes in flight, then the one served longest ago.  Past the
    queue or the wait: ``503 teacher_identity_probe_busy`` with ``Retry-After``.
    """
    return ProbeLimiter(
        REGISTRATION_PROBES,
        REGISTRATION_PROBES_PER_CALLER,
        admin_reserved=REGISTRATION_ADMIN_RESERVED,
        max_waiting=REGISTRATION_WAITING,
        max_waiting_per_caller=REGISTRATION_WAITING_PER_CALLER,
        max_wait_s=REGISTRATION_WAIT_S,
    )


def reader_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose transactions BEGIN DEFERRED: readers never take the write lock."""
    return session_factory(engine.execution_options(**{BEGIN_OPTION: "DEFERRED"}))


@dataclass
class RegistryContext:
    config: KilnConfig
    engine: Engine
    sessions: sessionmaker[Session]
    student: StudentView
    database_revision: str
    readers: sessionmaker[Session] | None = None
    # Registrations and re-probes: per caller (token, else address) at most half the
    # slots, freed slots go fairly to waiting callers, one slot is an admin's (issue 27).
    probe_limiter: ProbeLimiter = field(default_factory=registration_limiter)
    # Jobs have their own capacity, so registrations can never starve them (or the reverse).
    job_probe_limiter: ProbeLimiter = field(default_factory=lambda: ProbeLimiter(JOB_PROBES))
    # Its own CollectorRegistry: every app in one process counts alone (issue 18).
    metrics: RegistryMetrics = field(default_factory=RegistryMetrics)
    http: httpx.AsyncClient | None = None
    entries: EntryCache | None = None
    # Set by ``serve.startup.build_context``: the process groups of local aliases.
    local_teachers: LocalTeacherManager | None = None

    def __post_init__(self) -> None:
        if self.readers is None:
            self.readers = reader_factory(self.engine)
        if self.entries is None:
            self.entries = EntryCache(open_version_reader(self.engine))

    def entry_cache(self) -> EntryCache:
        assert self.entries is not None  # set in __post_init__
        return self.entries

    def close(self) -> None:
        """Drain every local teacher, then release the database handles (on exit)."""
        try:
            if self.local_teachers is not None:
                self.local_teachers.shutdown()
        finally:
            self.entry_cache().close()
            self.engine.dispose()

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """One write transaction (BEGIN IMMEDIATE): commit on success, roll back on error."""
        with unit_of_work(self.sessions) as session:
            yield session

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """One read transaction (BEGIN DEFERRED); a WAL reader never waits for a writer."""
        assert self.readers is not None  # set in __post_init__
        with unit_of_work(self.readers) as session:
            yield session

    def client(self) -> httpx.AsyncClient:
        if self.http is None:
            raise RuntimeError("the registry's HTTP client is not started")
        return self.http
