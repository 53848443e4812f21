"""``bench/touches.py``: every benchmark has sources, every source exists, and selection works."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


@pytest.fixture(scope="module", autouse=True)
def bench_on_path() -> Iterator[None]:
    sys.path.insert(0, str(BENCH))  # bench/ scripts import their neighbours by name
    try:
        yield
    finally:
        sys.path.remove(str(BENCH))


def test_every_benchmark_has_existing_sources() -> None:
    import run_all
    import touches

    names = {bench.name for bench in run_all.BENCHMARKS}
    assert set(touches.SOURCES) == names
    for bench in run_all.BENCHMARKS:
        assert (BENCH / bench.argv[0]).is_file()
        for prefix in (*touches.SOURCES[bench.name], *touches.EVERY_BENCHMARK):
            path = REPO / prefix
            # A folder entry ends in "/" and names a folder; a file entry names a file.
            assert path.is_dir() if prefix.endswith("/") else path.is_file(), prefix


def test_touched_maps_changed_files_to_benchmarks() -> None:
    import touches

    job_change = ["kiln_registry/jobs/ordered_pipeline.py", "docs/development.md"]
    assert touches.touched("jobs", "bench_jobs.py", job_change) == job_change[:1]
    assert touches.touched("gateway", "bench_gateway.py", job_change) == []
    assert touches.touched("gateway", "bench_gateway.py", ["bench/bench_gateway.py"])
    assert touches.touched("identity", "bench_identity.py", ["pyproject.toml"])
    # A folder entry covers what lies under it, not a file that only shares its prefix.
    assert not touches.covers("kiln_registry/jobsx.py", "kiln_registry/jobs/")
    assert not touches.covers("bench/_harness.pyc", "bench/_harness.py")


def _git(repo: Path, *argv: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *argv],
                   cwd=repo, check=True, capture_output=True, timeout=60)  # fmt: skip


def test_changed_selects_from_git(tmp_path: Path) -> None:
    """Committed, uncommitted and untracked changes since REV each select their benchmarks."""
    import run_all

    repo = tmp_path / "repo"
    for name in ("kiln_registry/gateway/app.py", "kiln_registry/jobs/runner.py", "README.md"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("v1\n", encoding="utf-8")
    _git(repo, "init", "-q", "-b", "master")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    assert run_all.select_changed("HEAD", repo) == []
    (repo / "README.md").write_text("v2\n", encoding="utf-8")
    assert run_all.select_changed("HEAD", repo) == []  # docs alone rerun nothing
    (repo / "kiln_registry/gateway/app.py").write_text("v2\n", encoding="utf-8")
    assert run_all.select_changed("HEAD", repo) == [
        "gateway",
        "launch",
    ]  # the launch runs the gateway
    _git(repo, "commit", "-q", "-am", "gateway")
    (repo / "kiln_registry/jobs/pipeline.py").write_text("new\n", encoding="utf-8")
    assert run_all.select_changed("HEAD", repo) == ["jobs", "generation", "scaleout", "flood"]
    assert "gateway" in run_all.select_changed("HEAD~1", repo)
    # A branch compares with where it left REV: REV's own later commits select nothing.
    _git(repo, "checkout", "-q", "-b", "side", "HEAD~1")
    assert run_all.select_changed("HEAD", repo) == ["jobs", "generation", "scaleout", "flood"]
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "jobs")
    assert run_all.select_changed("master", repo) == ["jobs", "generation", "scaleout", "flood"]


def test_changed_refuses_an_unknown_revision() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--changed", "no-such-revision", "--dry-run"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "give --changed a revision git knows" in done.stderr
