"""Hypothesis profiles of the fuzz suite and the report of cases run per target.

``KILN_FUZZ_PROFILE`` selects the profile, read here at collection time (the
autouse fixture in ``tests/conftest.py`` clears ``KILN_*`` before each test):

* ``ci`` (the default): derandomized (a fixed seed per test), no example
  database, a bounded example count, so the suite is reproducible and fast;
* ``thorough``: twenty times the examples, a fresh random seed every run and
  the example database under ``.hypothesis/`` (failures are replayed first).

The active profile is registered as ``kiln-fuzz``; the targets use it through
``strategies.fuzz_settings`` and never change hypothesis' global default, so
other test directories keep their own settings.  At the end of a session the
terminal summary lists the cases each target ran and how they ended; with
``KILN_FUZZ_REPORT=<path>`` the same figures are written there as JSON.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.reliability.strategies import ACTIVE_PROFILE, TALLIES

PROFILE_ENV = "KILN_FUZZ_PROFILE"
REPORT_ENV = "KILN_FUZZ_REPORT"
CI_EXAMPLES = 100
THOROUGH_FACTOR = 20
# A hang guard, not a performance target: one example takes milliseconds.
EXAMPLE_DEADLINE = timedelta(seconds=5)

settings.register_profile(
    "kiln-fuzz-ci",
    max_examples=CI_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=EXAMPLE_DEADLINE,
    print_blob=True,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
settings.register_profile(
    "kiln-fuzz-thorough",
    max_examples=CI_EXAMPLES * THOROUGH_FACTOR,
    derandomize=False,
    deadline=EXAMPLE_DEADLINE,
    print_blob=True,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)

PROFILE = os.environ.get(PROFILE_ENV, "ci")
if PROFILE not in ("ci", "thorough"):
    raise pytest.UsageError(f"{PROFILE_ENV} must be 'ci' or 'thorough', not {PROFILE!r}")
settings.register_profile(ACTIVE_PROFILE, parent=settings.get_profile(f"kiln-fuzz-{PROFILE}"))
REPORT_PATH = os.environ.get(REPORT_ENV)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLIES:
        return
    terminalreporter.section(f"fuzz cases run (profile {PROFILE})")
    for target, tally in sorted(TALLIES.items()):
        terminalreporter.write_line(
            f"{target:<28} {tally.cases:>7} cases  {tally.accepted:>6} accepted"
            f"  {tally.cases - tally.accepted:>6} refused  {len(tally.refused):>3} rules"
        )
    if REPORT_PATH:
        report = {
            "profile": PROFILE,
            "targets": {
                target: {
                    "cases": tally.cases,
                    "accepted": tally.accepted,
                    "refused": dict(sorted(tally.refused.items())),
                }
                for target, tally in sorted(TALLIES.items())
            },
        }
        Path(REPORT_PATH).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
