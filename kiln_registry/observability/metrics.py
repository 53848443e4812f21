"""Prometheus metrics of one registry, kept with ``prometheus_client``.

``RegistryMetrics`` owns its own ``CollectorRegistry`` (never the process-wide
default), so every app built in one process (tests build many) counts alone.
It holds:

* ``kiln_http_requests_total{method,route,status}`` and
  ``kiln_http_request_duration_seconds{method,route}`` (a histogram), fed by
  ``observability.access`` for every request, cached lookups included;
* ``kiln_registrations_total{outcome,rule}``, ``kiln_probes_total{outcome,rule}``
  and ``kiln_probe_duration_seconds`` (registrations, re-probes and job probes);
* ``kiln_job_sequences_scored_total`` (written to a corpus),
  ``kiln_job_cache_hits_total``, ``kiln_job_cache_misses_total`` (scored by the
  teacher) and ``kiln_job_scoring_duration_seconds`` (one sequence's requests);
* gauges read from the database at scrape time (``StateSnapshot``):
  ``kiln_teachers{status}``, ``kiln_jobs{status}``, ``kiln_job_queue_depth``
  ``kiln_job_worker_leases`` (device leases held by running jobs),
  ``kiln_job_workers_live`` (worker processes with a fresh heartbeat) and
  ``kiln_job_oldest_queued_age_seconds``.

No label is controlled by a caller without a bound: ``route`` is the router's
path template (``/v1/teachers/{alias}``, never the alias), ``method`` is one
of the HTTP methods or ``other``, ``status`` is the integer status, and
``outcome``/``rule`` (error codes and dotted rules, which come from code) must
match ``LABEL_TEXT`` and are capped at ``MAX_LABEL_VALUES`` distinct values
per label (then ``other``).  Imports the standard library and prometheus_client.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# The text exposition format generate_latest writes (Prometheus 0.0.4).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
HTTP_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LABEL_TEXT: Final = re.compile(r"[a-z0-9_.]{1,80}")
MAX_LABEL_VALUES: Final = 128
OTHER: Final = "other"
HTTP_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                       2.5, 5.0, 10.0, 30.0)  # fmt: skip
PROBE_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
SCORING_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                          30.0, 60.0)  # fmt: skip


def method_label(method: str) -> str:
    """The request method, or ``other`` for anything outside the standard set."""
    return method if method in HTTP_METHODS else OTHER


class BoundedLabel:
    """Label values that come from code (error codes, rules): checked, then capped."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        if not value:
            return "none"
        if value in self._seen:
            return value
        if not LABEL_TEXT.fullmatch(value):
            return OTHER
        with self._lock:
            if len(self._seen) >= self._limit:
                return OTHER
            self._seen.add(value)
        return value


@dataclass(frozen=True)
class StateSnapshot:
    """Database-derived gauges, read once per scrape (in a worker thread)."""

    teachers: Mapping[str, int] = field(default_factory=dict)
    jobs: Mapping[str, int] = field(default_factory=dict)
    worker_leases: int = 0
    live_workers: int = 0
    oldest_queued_age_s: float = 0.0


class _StateCollector(Collector):
    """Exports the snapshot ``RegistryMetrics.render`` was handed."""

    def __init__(self) -> None:
        self.snapshot = StateSnapshot()

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration; the families are built per scrape

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        teachers = GaugeMetricFamily(
            "kiln_teachers", "Registered teachers by status.", labels=["status"]
        )
        for status, count in sorted(snap.teachers.items()):
            teachers.add_metric([status], count)
        yield teachers
        jobs = GaugeMetricFamily("kiln_jobs", "Jobs by status.", labels=["status"])
        for status, count in sorted(snap.jobs.items()):
            jobs.add_metric([status], count)
        yield jobs
        yield GaugeMetricFamily(
            "kiln_job_queue_depth",
            "Jobs waiting for a worker (status queued).",
            value=snap.jobs.get("queued", 0),
        )
        yield GaugeMetricFamily(
            "kiln_job_worker_leases",
            "Device leases held by running jobs.",
            value=snap.worker_leases,
        )
        yield GaugeMetricFamily(
            "kiln_job_workers_live",
            "Job worker processes whose heartbeat is younger than [jobs] lease_timeout_s.",
            value=snap.live_workers,
        )
        yield GaugeMetricFamily(
            "kiln_job_oldest_queued_age_seconds",
            "How long the oldest queued job has waited (0 when none is queued).",
            value=snap.oldest_queued_age_s,
        )


HttpChildren = tuple[Counter, Histogram]


class RegistryMetrics:
    """The metrics of one registry app, in its own ``CollectorRegistry``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        reg = self.registry
        self._requests = Counter(
            "kiln_http_requests",
            "HTTP requests by method, route template and status.",
            ("method", "route", "status"),
            registry=reg,
        )
        self._latency = Histogram(
            "kiln_http_request_duration_seconds",
            "Time from a request's start to its last response byte.",
            ("method", "route"),
            buckets=HTTP_BUCKETS,
            registry=reg,
        )
        self._registrations = Counter(
            "kiln_registrations", "Teacher registrations by outcome and rule.",
            ("outcome", "rule"), registry=reg,
        )  # fmt: skip
        self._probes = Counter(
            "kiln_probes", "Identity probes (registration, re-probe, job) by outcome and rule.",
            ("outcome", "rule"), registry=reg,
        )  # fmt: skip
        self._probe_seconds = Histogram(
            "kiln_probe_duration_seconds", "Time spent in identity probes.",
            buckets=PROBE_BUCKETS, registry=reg,
        )  # fmt: skip
        self._job_metrics()
        self._state = _StateCollector()
        reg.register(self._state)
        self._http: dict[tuple[str, str, int], HttpChildren] = {}
        self._outcomes = BoundedLabel()
        self._rules = BoundedLabel()
        self._render_lock = threading.Lock()

    def _job_metrics(self) -> None:
        reg = self.registry
        self._scored = Counter(
            "kiln_job_sequences_scored", "Sequences written to job corpora (cached or not).",
            registry=reg,
        )  # fmt: skip
        self._hits = Counter(
            "kiln_job_cache_hits", "Sequences answered from the score cache.", registry=reg
        )
        self._misses = Counter(
            "kiln_job_cache_misses", "Sequences scored by the teacher (not cached).", registry=reg
        )
        self._scoring = Histogram(
            "kiln_job_scoring_duration_seconds",
            "Time to score one sequence with the teacher, retries included.",
            buckets=SCORING_BUCKETS,
            registry=reg,
        )

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count and time one request (``route`` is a template or a fixed name)."""
        key = (method, route, status)
        children = self._http.get(key)
        if children is None:
            children = self._http_children(key)
        children[0].inc()
        children[1].observe(seconds)

    def _http_children(self, key: tuple[str, str, int]) -> HttpChildren:
        method, route, status = key
        children = (
            self._requests.labels(method, route, str(status)),
            self._latency.labels(method, route),
        )
        self._http[key] = children
        return children

    def count_registration(self, outcome: str, rule: str | None = None) -> None:
        self._registrations.labels(self._outcomes(outcome), self._rules(rule)).inc()

    def count_probe(self, outcome: str, seconds: float, rule: str | None = None) -> None:
        self._probes.labels(self._outcomes(outcome), self._rules(rule)).inc()
        self._probe_seconds.observe(seconds)

    def probe_counts(self) -> dict[str, int]:
        """Probes by outcome (summed over rules), as ``kiln_probes_total`` reports them."""
        counts: dict[str, int] = {}
        for family in self._probes.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    outcome = sample.labels["outcome"]
                    counts[outcome] = counts.get(outcome, 0) + int(sample.value)
        return counts

    def count_sequence(self, cached: bool, seconds: float | None = None) -> None:
        """One sequence written to a corpus: from the cache, or scored in ``seconds``."""
        self._scored.inc()
        if cached:
            self._hits.inc()
            return
        self._misses.inc()
        if seconds is not None:
            self._scoring.observe(seconds)

    def render(self, snapshot: StateSnapshot) -> bytes:
        """The exposition text with ``snapshot``'s gauges (blocking: call from a thread)."""
        with self._render_lock:
            self._state.snapshot = snapshot
            return generate_latest(self.registry)
