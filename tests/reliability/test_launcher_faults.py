"""Launcher faults beyond the launcher's own tests: concurrency, a disk filled mid-copy, SIGKILL.

The launch side is ``tests/launcher/test_cleanup.py``'s ``Stager``: a real
process that creates a private runtime cache and stages a snapshot with the
launcher's staging API, prints ``copying``/``staged`` and sleeps.  (The whole
``kiln-teacher`` launch with a stand-in vLLM hashes the interpreter's
runtime, about a minute here, so it is not repeated in this suite.)
Cleanup is the real ``kiln-teacher cleanup --json`` subprocess.

* Four launches share one snapshot root and one cache root, two of them
  throttled so they are still copying; SIGKILL one that is copying and one
  that finished; cleanup removes exactly the killed ones' children, the live
  ones keep theirs, and the throttled survivor still completes.
* Two concurrent launches on a tiny tmpfs (both roots on it) that the test
  fills while they copy: each fails with ``staging.no_space`` and leaves no
  ``.building-*`` child (the first failure frees its partial copy, so the
  other may then finish; that is accepted); cleanup removes the orphaned
  children; the file system gets all its space back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.launcher.mounts import entries, tmpfs
from tests.launcher.test_cleanup import Stager

KILN_TEACHER = Path(sys.executable).with_name("kiln-teacher")
CHUNK = 1 << 20
OUTCOME_WAIT_S = 60.0
TMPFS_SIZE = "72m"  # one tiny model plus the default 64 MiB headroom, not much more


@pytest.fixture
def stagers() -> Iterator[list[Stager]]:
    started: list[Stager] = []
    yield started
    for stager in started:
        stager.kill()


def _cleanup(snaps: Path, caches: Path) -> dict[str, Any]:
    done = subprocess.run(
        [str(KILN_TEACHER), "cleanup", f"--snapshot-root={snaps}", f"--cache-root={caches}",
         "--json"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(snaps.parent)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _children_of(stager: Stager, *roots: Path) -> set[str]:
    tag = f"-{stager.proc.pid}-"
    return {str(root / name) for root in roots for name in entries(root) if tag in name}


def _roots(base: Path) -> tuple[Path, Path]:
    snaps, caches = base / "snaps", base / "caches"
    snaps.mkdir(mode=0o700)
    caches.mkdir(mode=0o700)
    return snaps, caches


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_concurrent_launches_then_sigkill_and_cleanup(
    tmp_path: Path, tiny_model: TinyModel, stagers: list[Stager]
) -> None:
    snaps, caches = _roots(tmp_path)
    fast = [Stager(tiny_model.path, snaps, caches) for _ in range(2)]
    slow = [Stager(tiny_model.path, snaps, caches, rate="1") for _ in range(2)]
    stagers += fast + slow
    for stager in fast:
        stager.wait_for("staged")
    for stager in slow:
        stager.wait_for("copying")
    assert len(entries(caches)) == 4 and len(entries(snaps)) == 4  # distinct children
    victims, survivors = [slow[0], fast[0]], [slow[1], fast[1]]
    doomed = set().union(*(_children_of(v, snaps, caches) for v in victims))
    kept = set().union(*(_children_of(s, snaps, caches) for s in survivors))
    for victim in victims:
        victim.kill()
    report = _cleanup(snaps, caches)
    assert sorted(report["removed"]) == sorted(doomed)
    assert set(report["live"]) == kept
    assert set(_children_of(fast[1], snaps, caches)) <= kept
    _, ready, _ = slow[1].wait_for("staged")
    assert (snaps / ready / "model" / "config.json").is_file()
    for survivor in survivors:
        survivor.kill()
    assert len(_cleanup(snaps, caches)["removed"]) == 4
    assert entries(snaps) == [] and entries(caches) == []


def _fill(point: Path) -> int:
    """Write zeros to ``point/filler`` until the file system is full; return bytes written."""
    written = 0
    fd = os.open(point / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            written += os.write(fd, b"\0" * CHUNK)
    except OSError as exc:
        assert exc.errno == 28, exc  # ENOSPC
    finally:
        os.close(fd)
    return written


def _outcome(stager: Stager, snaps: Path) -> tuple[str, str]:
    """``("failed", stderr)`` once the process exited, ``("staged", "")`` once its ready-* exists.

    (Read from the file system rather than with ``Stager.wait_for``, which
    spins until its deadline on an exited process: select reports end-of-file
    as readable.)
    """
    deadline = time.monotonic() + OUTCOME_WAIT_S
    while time.monotonic() < deadline:
        if stager.proc.poll() is not None:
            return "failed", stager.stderr()
        if any("/ready-" in child for child in _children_of(stager, snaps)):
            return "staged", ""
        time.sleep(0.05)
    raise AssertionError("the stager neither failed nor staged")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_disk_filled_while_two_launches_copy(
    tmp_path: Path, tiny_model: TinyModel, stagers: list[Stager]
) -> None:
    with tmpfs(tmp_path / "tiny-disk", size=TMPFS_SIZE) as point:
        free_before = os.statvfs(point).f_bavail
        snaps, caches = _roots(point)
        racing = [Stager(tiny_model.path, snaps, caches, rate="1") for _ in range(2)]
        stagers += racing
        for stager in racing:
            stager.wait_for("copying")
        assert _fill(point) > 0
        results = [_outcome(stager, snaps) for stager in racing]
        outcomes = [outcome for outcome, _ in results]
        # Both were mid-copy.  The first to fail removes its partial copy, which
        # may free enough for the other to finish: that outcome is legitimate.
        assert "failed" in outcomes, results
        for stager, (outcome, stderr) in zip(racing, results, strict=True):
            if outcome == "failed":
                assert "staging.no_space" in stderr, stderr
                assert not _children_of(stager, snaps), entries(snaps)  # no .building-* left
            stager.kill()
        report = _cleanup(snaps, caches)
        assert len(report["removed"]) == 2 + outcomes.count("staged"), report
        assert entries(snaps) == [] and entries(caches) == []
        (point / "filler").unlink()
        snaps.rmdir()
        caches.rmdir()
        assert os.statvfs(point).f_bavail == free_before
