"""Prometheus metrics of one teacher endpoint, in its own ``CollectorRegistry``.

* ``kiln_endpoint_requests_total{route,status}``: every request served
  (``route`` is one of the endpoint's fixed routes or ``other``);
* ``kiln_endpoint_prompt_tokens_scored_total``: prompt tokens whose rows
  were relayed (checked answers only);
* ``kiln_endpoint_refusals_total{rule}``: requests refused and answers
  withheld, by rule (``endpoint.field_refused``, ``endpoint.fingerprint`` ...);
* ``kiln_endpoint_fenced_replicas`` and ``kiln_endpoint_live_replicas``;
* ``kiln_endpoint_upstream_seconds``: one relayed request's time at the teacher.

Rules come from code and are capped (``observability.metrics.BoundedLabel``).
Imports the standard library and prometheus_client.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kiln_registry.observability.metrics import HTTP_BUCKETS, BoundedLabel

ROUTES: Final = frozenset({"/health", "/v1/models", "/v1/completions", "/metrics"})


class EndpointMetrics:
    """The counters, gauges and histogram of one endpoint (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        reg = self.registry
        self._requests = Counter(
            "kiln_endpoint_requests", "Requests served by route and status.",
            ("route", "status"), registry=reg,
        )  # fmt: skip
        self._tokens = Counter(
            "kiln_endpoint_prompt_tokens_scored",
            "Prompt tokens whose logprob rows were checked and relayed.",
            registry=reg,
        )
        self._refusals = Counter(
            "kiln_endpoint_refusals", "Refused requests and withheld answers by rule.",
            ("rule",), registry=reg,
        )  # fmt: skip
        self.fenced = Gauge("kiln_endpoint_fenced_replicas", "Replicas fenced.", registry=reg)
        self.live = Gauge("kiln_endpoint_live_replicas", "Replicas serving now.", registry=reg)
        self._upstream = Histogram(
            "kiln_endpoint_upstream_seconds", "Time of one relayed request at the teacher.",
            buckets=HTTP_BUCKETS, registry=reg,
        )  # fmt: skip
        self._rules = BoundedLabel()

    def count_request(self, route: str, status: int) -> None:
        self._requests.labels(route if route in ROUTES else "other", str(status)).inc()

    def count_refusal(self, rule: str | None) -> None:
        self._refusals.labels(self._rules(rule)).inc()

    def count_scored(self, tokens: int) -> None:
        if tokens:
            self._tokens.inc(tokens)

    def observe_upstream(self, seconds: float) -> None:
        self._upstream.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
