"""What one running registry needs, built once by ``create_app``.

``RegistryContext`` holds the configuration, the database handles, the
loaded student's vocabulary view, the probe limiter and the metrics.  The
outbound HTTP client is created in the app's lifespan (never at import
time) and attached here.  Nothing in this module touches the network.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import httpx
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from kiln_registry.config import KilnConfig
from kiln_registry.probe.client import ProbeLimiter
from kiln_registry.probe.verify import StudentView

PROBE_TIMEOUT_S = 10.0
JOB_PROBE_TIMEOUT_S = 60.0


@dataclass
class Metrics:
    """Counters exported at ``/metrics`` in Prometheus text format."""

    registrations: dict[str, int] = field(default_factory=dict)
    probes: dict[str, int] = field(default_factory=dict)
    probe_seconds_sum: float = 0.0
    probe_seconds_count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_registration(self, outcome: str) -> None:
        with self._lock:
            self.registrations[outcome] = self.registrations.get(outcome, 0) + 1

    def count_probe(self, outcome: str, seconds: float) -> None:
        with self._lock:
            self.probes[outcome] = self.probes.get(outcome, 0) + 1
            self.probe_seconds_sum += seconds
            self.probe_seconds_count += 1


@dataclass
class RegistryContext:
    config: KilnConfig
    engine: Engine
    sessions: sessionmaker[Session]
    student: StudentView
    database_revision: str
    probe_limiter: ProbeLimiter = field(default_factory=ProbeLimiter)
    metrics: Metrics = field(default_factory=Metrics)
    http: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        if self.http is None:
            raise RuntimeError("the registry's HTTP client is not started")
        return self.http
