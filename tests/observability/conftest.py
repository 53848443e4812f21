"""Fixtures of the observability tests: the session's reference teacher (tests/jobs)."""

from tests.jobs.conftest import reference_teacher  # noqa: F401  (session fixture)
