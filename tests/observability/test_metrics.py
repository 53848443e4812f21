"""``/metrics`` scraped after real requests, registrations and jobs, parsed by prometheus_client.

A real registry (lifespan on, so the job workers run) on loopback with the
reference teacher: alias lookups (the first rendered by the route, the rest
answered by the cached fast path), a 404, an unknown method, a registration,
a conflict, two scoring jobs (the second answered from the score cache).  The
exposition must parse, carry the documented families with their types, count
every request under its route template (never the alias) and agree with the
jobs' own progress counters.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from kiln_registry.observability.metrics import (
    MAX_LABEL_VALUES,
    BoundedLabel,
    RegistryMetrics,
    StateSnapshot,
)
from kiln_registry.testing.tiny_models import TinyModel
from tests.jobs.conftest import REFERENCE_MODEL_ID, ReferenceTeacher
from tests.jobs.harness import make_config, running_registry
from tests.observability.support import metric_samples, metric_types

ALIAS = "obs-alias-7f3a@tiny"
LOOKUP = ("kiln_http_requests_total", (("method", "GET"), ("route", "/v1/teachers/{alias}")))
SEQUENCES = [[5, 9, 11, 40], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 9, 11, 40, 41]]
FAMILIES = {
    "kiln_http_requests": "counter",
    "kiln_http_request_duration_seconds": "histogram",
    "kiln_registrations": "counter",
    "kiln_probes": "counter",
    "kiln_probe_duration_seconds": "histogram",
    "kiln_job_sequences_scored": "counter",
    "kiln_job_cache_hits": "counter",
    "kiln_job_cache_misses": "counter",
    "kiln_job_scoring_duration_seconds": "histogram",
    "kiln_teachers": "gauge",
    "kiln_jobs": "gauge",
    "kiln_job_queue_depth": "gauge",
    "kiln_job_worker_leases": "gauge",
}


def _requests(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], route: str,
              method: str, status: int) -> float:  # fmt: skip
    key = (("method", method), ("route", route), ("status", str(status)))
    return samples.get(("kiln_http_requests_total", key), 0.0)


def _run_jobs(http: httpx.Client, reg_wait: object) -> list[dict[str, object]]:
    jobs = []
    for _ in range(2):
        body = {"kind": "teacher_scoring", "teacher": ALIAS, "top_k": 4, "sequences": SEQUENCES}
        submitted = http.post("/v1/jobs", json=body)
        assert submitted.status_code == 201, submitted.text
        jobs.append(reg_wait(submitted.json()["id"]))  # type: ignore[operator]
    return jobs


def test_metrics_after_requests_registrations_and_jobs(
    tmp_path: Path, tiny_model: TinyModel, reference_teacher: ReferenceTeacher
) -> None:
    config = make_config(tmp_path, tiny_model.path, concurrency=2)
    with running_registry(config) as reg:
        reg.register(ALIAS, reference_teacher.url, REFERENCE_MODEL_ID)
        again = {"alias": ALIAS, "kind": "remote", "provider": "vllm",
                 "model_id": REFERENCE_MODEL_ID, "url": reference_teacher.url}  # fmt: skip
        assert reg.http.post("/v1/teachers", json=again).status_code == 409
        for _ in range(5):
            assert reg.http.get(f"/v1/teachers/{ALIAS}").status_code == 200
        assert reg.http.get("/v1/teachers/no-such-alias").status_code == 404
        assert reg.http.request("PURGE", "/v1/teachers").status_code == 405
        assert reg.http.get("/not/a/route/secret-looking-path").status_code == 404
        jobs = _run_jobs(reg.http, reg.wait)
        response = reg.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    types = metric_types(response.text)
    assert {name: types.get(name) for name in FAMILIES} == FAMILIES
    samples = metric_samples(response.text)
    # Every lookup is counted, the four answered by the cached fast path included.
    assert _requests(samples, "/v1/teachers/{alias}", "GET", 200) == 5
    assert _requests(samples, "/v1/teachers/{alias}", "GET", 404) == 1
    assert _requests(samples, "/v1/teachers", "POST", 200) == 1
    assert _requests(samples, "/v1/teachers", "POST", 409) == 1
    assert _requests(samples, "/v1/teachers", "other", 405) == 1
    assert _requests(samples, "unmatched", "GET", 404) == 1
    latency = ("kiln_http_request_duration_seconds_count", LOOKUP[1])
    assert samples[latency] == 6
    labels = {value for _, key in samples for _, value in key}
    assert ALIAS not in labels and "no-such-alias" not in labels
    assert not any("secret-looking" in value for value in labels)
    _check_domain_metrics(samples, jobs)


def _check_domain_metrics(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], jobs: list[dict[str, object]]
) -> None:
    assert [job["status"] for job in jobs] == ["succeeded", "succeeded"]
    progress = [job["progress"] for job in jobs]
    assert [p["cache_hits"] for p in progress] == [0, 4]  # type: ignore[index]
    registered = ("kiln_registrations_total", (("outcome", "registered"), ("rule", "none")))
    exists = ("kiln_registrations_total", (("outcome", "teacher_alias_exists"), ("rule", "none")))
    assert samples[registered] == 1 and samples[exists] == 1
    # One registration probe and one per job, all passed; each timed.
    assert samples[("kiln_probes_total", (("outcome", "passed"), ("rule", "none")))] == 3
    assert samples[("kiln_probe_duration_seconds_count", ())] == 3
    assert samples[("kiln_job_sequences_scored_total", ())] == 8
    assert samples[("kiln_job_cache_misses_total", ())] == 4
    assert samples[("kiln_job_cache_hits_total", ())] == 4
    assert samples[("kiln_job_scoring_duration_seconds_count", ())] == 4
    assert samples[("kiln_jobs", (("status", "succeeded"),))] == 2
    assert samples[("kiln_jobs", (("status", "queued"),))] == 0
    assert samples[("kiln_job_queue_depth", ())] == 0
    assert samples[("kiln_job_worker_leases", ())] == 0
    assert samples[("kiln_teachers", (("status", "verified"),))] == 1
    assert samples[("kiln_teachers", (("status", "unavailable"),))] == 0


def test_every_registry_counts_in_its_own_collector_registry() -> None:
    first, second = RegistryMetrics(), RegistryMetrics()  # no "duplicated timeseries" error
    first.count_registration("registered")
    first.observe_request("GET", "/health", 200, 0.001)
    one = metric_samples(first.render(StateSnapshot()).decode())
    two = metric_samples(second.render(StateSnapshot()).decode())
    assert one[("kiln_registrations_total", (("outcome", "registered"), ("rule", "none")))] == 1
    assert ("kiln_registrations_total", (("outcome", "registered"), ("rule", "none"))) not in two
    health = (("method", "GET"), ("route", "/health"), ("status", "200"))
    assert one[("kiln_http_requests_total", health)] == 1
    assert ("kiln_http_requests_total", health) not in two


def test_labels_from_outcomes_and_rules_are_bounded() -> None:
    label = BoundedLabel()
    assert label("teacher_alias_exists") == "teacher_alias_exists"
    assert label("probe.fingerprint_pinned") == "probe.fingerprint_pinned"
    assert label(None) == "none"
    assert label('bad "label"\n') == "other"  # never a value outside [a-z0-9_.]
    assert label("x" * 81) == "other"
    for n in range(MAX_LABEL_VALUES):
        label(f"rule_{n}")
    assert label("one_more_rule") == "other"  # capped: at most MAX_LABEL_VALUES series
    assert label("teacher_alias_exists") == "teacher_alias_exists"  # known values stay
