"""Stale-child cleanup after real SIGKILLs, with live owners, PID reuse, links and mounts.

Real launcher-side processes stage a snapshot and a private cache and then
sleep; the test kills one with SIGKILL and checks that cleanup removes only
that process's children and nothing else under the two private parents.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import InputError, LauncherError
from kiln_registry.launcher.cleanup import (
    cleanup_main,
    find_stale_children,
    remove_stale,
    scan_children,
)
from kiln_registry.launcher.roots import OwnerRecord, current_owner, write_owner_record
from kiln_registry.testing.tiny_models import TinyModel
from tests.launcher.mounts import entries, tmpfs, write_tree

STAGER = textwrap.dedent(
    """
    import sys, time
    from kiln_registry.identity.hashing import ReadRateLimiter
    from kiln_registry.launcher.staging import create_private_cache, stage_snapshot
    model, snaps, caches, rate = sys.argv[1:5]
    cache = create_private_cache(caches)
    def progress(phase, done, total):
        if phase == "copy" and done == 0:
            print("copying", flush=True)
    limiter = ReadRateLimiter(None if rate == "none" else int(rate))
    staged = stage_snapshot(model, None, snaps, limiter=limiter, progress=progress)
    print("staged", staged.name, cache.name, flush=True)
    time.sleep(120)
    """
)


class Stager:
    """A real process that stages a snapshot and a cache, then sleeps until killed."""

    def __init__(self, model: Path, snaps: Path, caches: Path, rate: str = "none") -> None:
        argv = [sys.executable, "-c", STAGER, str(model), str(snaps), str(caches), rate]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.buffer = b""

    def wait_for(self, word: str, timeout: float = 60.0) -> list[str]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            for line in self.buffer.split(b"\n")[:-1]:
                if line.startswith(word.encode()):
                    return line.decode().split()
            left = deadline - time.monotonic()
            exited = self.proc.poll() is not None and not select.select([fd], [], [], 0)[0]
            if left <= 0 or exited:
                raise AssertionError(f"stager never printed {word!r}: {self.stderr()}")
            if select.select([fd], [], [], min(left, 0.5))[0]:
                self.buffer += os.read(fd, 4096)

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    snaps, caches = tmp_path / "snaps", tmp_path / "caches"
    snaps.mkdir(mode=0o700)
    caches.mkdir(mode=0o700)
    return snaps, caches


@pytest.fixture
def stagers() -> Iterator[list[Stager]]:
    started: list[Stager] = []
    yield started
    for stager in started:
        stager.kill()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(30)
    return proc.pid


def make_child(parent: Path, kind: str, pid: int, owner: OwnerRecord | None) -> Path:
    child = parent / f"{kind}-{pid}-{secrets.token_hex(16)}"
    child.mkdir(mode=0o700)
    (child / "payload").write_bytes(b"x")
    if owner is not None:
        fd = os.open(child, os.O_RDONLY | os.O_DIRECTORY)
        try:
            write_owner_record(fd, owner)
        finally:
            os.close(fd)
    return child


def run_cleanup(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    status = cleanup_main([*argv, "--json"], env={})
    out = capsys.readouterr().out
    return status, json.loads(out)


@pytest.mark.timeout(120)
def test_sigkill_leaves_children_that_cleanup_removes_alone(
    tiny_model: TinyModel,
    roots: tuple[Path, Path],
    stagers: list[Stager],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    snaps, caches = roots
    victim = Stager(tiny_model.path, snaps, caches)
    survivor = Stager(tiny_model.path, snaps, caches)
    stagers += [victim, survivor]
    _, victim_ready, victim_cache = victim.wait_for("staged")
    _, survivor_ready, survivor_cache = survivor.wait_for("staged")
    victim.kill()
    # Things that look similar but are not stale launcher children must survive.
    outside = write_tree(tmp_path / "outside", {"keep": b"keep"})
    decoy = f".building-{victim.proc.pid}-{secrets.token_hex(16)}"
    (snaps / decoy).symlink_to(outside)
    (snaps / "notes.txt").write_text("mine")
    (snaps / f"ready-{victim.proc.pid}-short").mkdir()
    (snaps / f"cache-{victim.proc.pid}-{secrets.token_hex(16)}").mkdir()  # wrong parent

    before = {snaps: entries(snaps), caches: entries(caches)}
    status, report = run_cleanup(capsys, f"--snapshot-root={snaps}", "--cache-root", str(caches))
    assert status == 0
    assert sorted(report["removed"]) == sorted(
        [str(snaps / victim_ready), str(caches / victim_cache)]
    )
    assert sorted(report["live"]) == sorted(
        [str(snaps / survivor_ready), str(caches / survivor_cache)]
    )
    assert [s["path"] for s in report["skipped"]] == [str(snaps / decoy)]
    assert entries(snaps) == sorted(set(before[snaps]) - {victim_ready})
    assert entries(caches) == [survivor_cache]
    assert (outside / "keep").read_bytes() == b"keep"
    assert (snaps / survivor_ready / "model" / "config.json").is_file()

    survivor.kill()
    status, report = run_cleanup(capsys, f"--snapshot-root={snaps}", f"--cache-root={caches}")
    assert status == 0 and len(report["removed"]) == 2
    assert entries(caches) == []
    assert survivor_ready not in entries(snaps)


@pytest.mark.timeout(120)
def test_sigkill_during_copy_leaves_a_building_child_that_cleanup_removes(
    tiny_model: TinyModel, roots: tuple[Path, Path], stagers: list[Stager]
) -> None:
    snaps, caches = roots
    stager = Stager(tiny_model.path, snaps, caches, rate="1")  # 1 MiB/s: about a second copying
    stagers.append(stager)
    stager.wait_for("copying")
    stager.kill()
    (building,) = entries(snaps)
    assert building.startswith(f".building-{stager.proc.pid}-")
    stale = find_stale_children(snaps, caches)
    assert sorted(c.kind for c in stale) == ["building", "cache"]
    assert all(c.pid == stager.proc.pid and "gone" in c.reason for c in stale)
    result = remove_stale(stale)
    assert sorted(result.removed) == sorted(c.path for c in stale) and not result.failed
    assert entries(snaps) == [] and entries(caches) == []


def test_dry_run_lists_without_removing(
    roots: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    snaps, caches = roots
    child = make_child(caches, "cache", dead_pid(), None)
    assert cleanup_main([f"--snapshot-root={snaps}", f"--cache-root={caches}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"would remove {child} (no owner record, and PID")
    assert child.is_dir()
    _, report = run_cleanup(capsys, f"--cache-root={caches}", "--dry-run")
    assert report["dry_run"] is True and report["removed"] == []
    assert [c["path"] for c in report["stale"]] == [str(child)]


def test_owner_records_decide_staleness(roots: tuple[Path, Path]) -> None:
    snaps, caches = roots
    me = current_owner()
    live = make_child(snaps, "ready", me.pid, me)
    reused = make_child(snaps, "ready", me.pid, OwnerRecord(me.pid, me.start_ticks + 7, me.boot_id))
    rebooted = make_child(caches, "cache", me.pid, OwnerRecord(me.pid, me.start_ticks, "old-boot"))
    unrecorded_live = make_child(snaps, ".building", me.pid, None)
    gone = dead_pid()
    unrecorded_dead = make_child(caches, "cache", gone, None)
    mismatched = make_child(snaps, "ready", gone, me)
    scan = scan_children(snaps, caches)
    assert sorted(c.path for c in scan.stale) == sorted([reused, rebooted, unrecorded_dead])
    assert sorted(scan.live) == sorted([live, unrecorded_live])
    assert [s.path for s in scan.skipped] == [mismatched]
    reasons = {c.path: c.reason for c in scan.stale}
    assert "another process" in reasons[reused] and "gone" in reasons[unrecorded_dead]
    result = remove_stale(scan.stale)
    assert len(result.removed) == 3 and not result.failed
    assert sorted(entries(snaps) + entries(caches)) == sorted(
        p.name for p in (live, unrecorded_live, mismatched)
    )


def test_remove_stale_rechecks_and_refuses_foreign_names(roots: tuple[Path, Path]) -> None:
    snaps, caches = roots
    me = current_owner()
    child = make_child(caches, "cache", me.pid, OwnerRecord(me.pid, me.start_ticks + 1, me.boot_id))
    (stale,) = find_stale_children(snaps, caches)
    # The record now says the owner is alive: removal must not proceed.
    os.unlink(child / ".kiln-owner")
    fd = os.open(child, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_owner_record(fd, me)
    finally:
        os.close(fd)
    result = remove_stale([stale])
    assert result.removed == () and "no longer stale" in result.failed[0].reason
    assert child.is_dir()
    with pytest.raises(LauncherError) as caught:
        remove_stale([type(stale)(caches, "notes", "cache", me.pid, "x")])
    assert caught.value.rule == "cleanup.name"


@pytest.mark.root
def test_mount_points_are_never_entered(
    roots: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snaps, caches = roots
    gone = dead_pid()
    mounted_child = caches / f"cache-{gone}-{secrets.token_hex(16)}"
    stale_child = make_child(snaps, "ready", gone, None)
    inner = stale_child / "inner"
    inner.mkdir()
    with tmpfs(mounted_child, size="1m"), tmpfs(inner, size="1m"):
        (mounted_child / "other-fs").write_bytes(b"keep")
        (inner / "other-fs").write_bytes(b"keep")
        status, report = run_cleanup(capsys, f"--snapshot-root={snaps}", f"--cache-root={caches}")
        assert status == 2
        assert [s["path"] for s in report["skipped"]] == [str(mounted_child)]
        (failed,) = report["failed"]
        assert failed["path"] == str(stale_child) and "another file system" in failed["reason"]
        assert (mounted_child / "other-fs").read_bytes() == b"keep"
        assert (inner / "other-fs").read_bytes() == b"keep"
    status, report = run_cleanup(capsys, f"--snapshot-root={snaps}", f"--cache-root={caches}")
    # Unmounted, the empty directory named like a dead launcher's cache is stale too.
    assert status == 0 and sorted(report["removed"]) == [str(mounted_child), str(stale_child)]
    assert entries(caches) == [] and entries(snaps) == []


@pytest.mark.root
def test_children_owned_by_another_uid_are_left_alone(roots: tuple[Path, Path]) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    snaps, caches = roots
    child = make_child(snaps, "ready", dead_pid(), None)
    os.chown(child, 1000, 1000)
    scan = scan_children(snaps, caches)
    assert scan.stale == [] and "owned by UID 1000" in scan.skipped[0].reason


def test_unsafe_or_missing_parents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, report = run_cleanup(capsys, f"--snapshot-root={tmp_path / 'missing'}")
    assert status == 0 and report["stale"] == [] and not (tmp_path / "missing").exists()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    child = make_child(shared, "cache", dead_pid(), None)
    with pytest.raises(LauncherError) as caught:
        cleanup_main([f"--cache-root={shared}"], env={})
    assert caught.value.rule == "roots.mode" and child.is_dir()


@pytest.mark.parametrize(
    "argv",
    [["--bogus"], ["--dry-run", "--dry-run"], ["--cache-root"], ["--cache-root="], ["--json=1"]],
)
def test_bad_flags_are_refused(argv: list[str]) -> None:
    with pytest.raises(InputError) as caught:
        cleanup_main(argv, env={"HOME": "/nonexistent"})
    assert caught.value.rule == "cleanup.flag"


def test_help_and_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cleanup_main(["--help"]) == 0
    assert "usage: kiln-teacher cleanup" in capsys.readouterr().out
    assert cleanup_main(["--json"], env={"HOME": str(tmp_path)}) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["snapshot_root"] == f"{tmp_path}/.cache/kiln/teacher-snapshots"
    assert report["cache_root"] == f"{tmp_path}/.cache/kiln/vllm-runtime-caches"
    env = {"HOME": str(tmp_path), "KILN_VLLM_SNAPSHOT_ROOT": str(tmp_path / "env-snaps")}
    assert cleanup_main(["--json"], env=env) == 0
    assert json.loads(capsys.readouterr().out)["snapshot_root"] == str(tmp_path / "env-snaps")
    assert cleanup_main([f"--cache-root={tmp_path / 'c'}", "--json"], env=env) == 0
    assert json.loads(capsys.readouterr().out)["snapshot_root"] is None
    for bad in ({}, {"HOME": "relative"}, {"HOME": "/h", "KILN_VLLM_SNAPSHOT_ROOT": ""}):
        with pytest.raises(InputError):
            cleanup_main([], env=bad)
