"""What the teachers layer needs from the running registry, as protocols.

``TeacherServices`` is the part of ``api.context.RegistryContext`` the
teachers layer uses (configuration, database transactions, student view,
probe limiter, metrics counters, HTTP client, the local-teacher manager), so
nothing here imports the API or observability layers.  ``LocalTeacherManager`` is what the registry
needs of ``local.process_groups.LocalTeachers``: the context's slot is typed
by it, so the context never imports the launcher.

Imports SQLAlchemy and httpx (types only), the configuration, identity and
probe types, and (for type checking only) the protocols of
``local.launch_spec``; never the API layer or FastAPI.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import httpx
from sqlalchemy.orm import Session

from kiln_registry.config.settings import KilnConfig, LocalTeacherConfig
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.client import ProbeLimiter
from kiln_registry.probe.verify import StudentView

if TYPE_CHECKING:  # the launcher is imported only where a teacher is launched
    from kiln_registry.local.launch_spec import RunningTeacher, StatusSink


class LocalTeacherManager(Protocol):
    """The process groups of local aliases (``local.process_groups.LocalTeachers``)."""

    @property
    def profiles(self) -> dict[str, LocalTeacherConfig]: ...

    def profile(self, name: str) -> LocalTeacherConfig: ...

    def check_runtime(self) -> None: ...

    def is_running(self, alias: str) -> bool: ...

    def reserve(self, alias: str, profile_name: str) -> None: ...

    def reserve_generated(self, alias: str, name: str, profile: LocalTeacherConfig) -> None: ...

    def launch(
        self, alias: str, *, expected: TeacherIdentity | None, status: StatusSink
    ) -> list[RunningTeacher]: ...

    def release(self, alias: str) -> None: ...

    def stop(self, alias: str) -> bool: ...

    def shutdown(self) -> None: ...


class TeacherCounters(Protocol):
    """The ``/metrics`` counters a teacher operation updates (``RegistryMetrics``)."""

    def count_registration(self, outcome: str, rule: str | None = None) -> None: ...

    def count_probe(self, outcome: str, seconds: float, rule: str | None = None) -> None: ...


class TeacherServices(Protocol):
    """The running registry as the teachers layer sees it (``RegistryContext``)."""

    @property
    def config(self) -> KilnConfig: ...

    @property
    def student(self) -> StudentView: ...

    @property
    def probe_limiter(self) -> ProbeLimiter: ...

    @property
    def metrics(self) -> TeacherCounters: ...

    @property
    def local_teachers(self) -> LocalTeacherManager | None: ...

    def client(self) -> httpx.AsyncClient: ...

    def writing(self) -> AbstractContextManager[Session]: ...

    def reading(self) -> AbstractContextManager[Session]: ...
