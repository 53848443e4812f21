"""Shared helpers of the observability tests: parse ``/metrics`` with prometheus_client."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, tuple[tuple[str, str], ...]]


def metric_samples(text: str) -> dict[Sample, float]:
    """Every sample of an exposition text, keyed by name and sorted labels.

    The parser raises on malformed text, so calling this also checks the format.
    """
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric_types(text: str) -> dict[str, str]:
    """Family name -> type (counter, gauge, histogram) of an exposition text."""
    return {family.name: family.type for family in text_string_to_metric_families(text)}
