"""Which benchmarks exercise which source files: the table behind ``run_all.py --changed``.

Each benchmark (by its ``run_all`` name) lists the paths, relative to the
repository root, whose code it runs: a path ending in ``/`` covers every file
under it.  The table is explicit and errs towards too much: a change to any
listed path reruns that benchmark.  Besides its own entries, every benchmark
is touched by its script, ``bench/_harness.py`` where it uses it, and
``pyproject.toml`` (the dependency versions its figures depend on).
``tests/test_bench_table.py`` checks that every benchmark has an entry and
every listed path exists, so a moved module shows up there, not as a
benchmark that silently stops being rerun.

Standard library only; imported by ``run_all.py`` and that test.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

# What every request to `kiln serve` passes through (middleware, routes, database, settings).
SERVER: Final = (
    "kiln_registry/api/", "kiln_registry/auth/", "kiln_registry/serve/",
    "kiln_registry/observability/", "kiln_registry/db/", "kiln_registry/config/",
    "kiln_registry/domain/", "kiln_registry/cli/", "kiln_registry/credentials/",
    "kiln_registry/teachers/", "migrations/",
)  # fmt: skip
# A job against the reference teacher: the server, the queue, probing and the teacher itself.
JOB_PATH: Final = (
    *SERVER, "kiln_registry/jobs/", "kiln_registry/probe/", "kiln_registry/identity/",
    "kiln_registry/reference_teacher/", "kiln_registry/testing/", "bench/_harness.py",
)  # fmt: skip

SOURCES: Final[dict[str, tuple[str, ...]]] = {
    "identity": ("kiln_registry/identity/", "kiln_registry/model/", "kiln_registry/cli/"),
    "probe": ("kiln_registry/probe/", "kiln_registry/identity/", "kiln_registry/domain/"),
    "registry": (
        *SERVER,
        "kiln_registry/probe/",
        "kiln_registry/identity/",
        "kiln_registry/reference_teacher/",
        "kiln_registry/testing/",
    ),
    "staging": ("kiln_registry/launcher/", "kiln_registry/identity/"),
    "runtime": ("kiln_registry/launcher/", "kiln_registry/identity/"),
    "launch": (
        "kiln_registry/launcher/",
        "kiln_registry/identity/",
        "kiln_registry/vllm_options/",
        "kiln_registry/gateway/",
        "kiln_registry/model/",
    ),
    "jobs": JOB_PATH,
    "gateway": ("kiln_registry/gateway/", "kiln_registry/domain/"),
    "generation": JOB_PATH,
    "scaleout": JOB_PATH,
    "endpoint": (
        "kiln_registry/endpoint/",
        "kiln_registry/probe/",
        "kiln_registry/identity/",
        "kiln_registry/reference_teacher/",
        "kiln_registry/domain/",
        "kiln_registry/testing/",
    ),
    "flood": (*SERVER, "kiln_registry/jobs/"),
}
EVERY_BENCHMARK: Final = ("pyproject.toml",)


def covers(path: str, prefix: str) -> bool:
    """Whether ``prefix`` (a file, or a folder ending in ``/``) covers ``path``."""
    return path.startswith(prefix) if prefix.endswith("/") else path == prefix


def touched(name: str, script: str, changed: Iterable[str]) -> list[str]:
    """The ``changed`` paths that benchmark ``name`` (run by ``bench/<script>``) exercises."""
    prefixes = (*SOURCES[name], *EVERY_BENCHMARK, f"bench/{script}")
    return [path for path in changed if any(covers(path, p) for p in prefixes)]
