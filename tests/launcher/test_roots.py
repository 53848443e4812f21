"""Private parents (owner, mode, ancestry, rootless overflow UID), distinct roots, and
owner records, on real directories and real processes."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.roots import (
    OWNER_NAME,
    OwnerRecord,
    check_distinct_roots,
    current_owner,
    owner_alive,
    parse_uid_map,
    process_start_ticks,
    read_owner_record,
    rootless_overflow_uid,
    secure_private_root,
    write_owner_record,
)
from kiln_registry.launcher.staging import stage_snapshot
from tests.launcher.mounts import entries, open_fds, write_tree

OTHER_UID = 1000


def secure(path: Path) -> int:
    """Open the private root, return its st_mode, close it."""
    fd = secure_private_root(path, what="snapshot root")
    try:
        return os.fstat(fd).st_mode
    finally:
        os.close(fd)


def refused(path: Path, rule: str) -> LauncherError:
    with pytest.raises(LauncherError) as caught:
        secure_private_root(path, what="snapshot root")
    assert caught.value.rule == rule, str(caught.value)
    assert "snapshot root" in str(caught.value)
    return caught.value


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root (CI runs tests as root)")


def test_missing_root_and_ancestors_are_created_private(tmp_path: Path) -> None:
    fds = open_fds()
    target = tmp_path / "a" / "b" / "snaps"
    fd = secure_private_root(target, what="snapshot root")
    try:
        assert os.path.samestat(os.fstat(fd), target.stat())
    finally:
        os.close(fd)
    for path in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert open_fds() == fds


def test_existing_private_root_is_accepted_and_left_unchanged(tmp_path: Path) -> None:
    target = tmp_path / "snaps"
    target.mkdir(mode=0o700)
    (target / "keep").write_text("x")
    mode = secure(target)
    assert stat.S_IMODE(mode) == 0o700 and entries(target) == ["keep"]


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o711, 0o1700, 0o500])
def test_root_with_any_other_mode_is_refused(tmp_path: Path, mode: int) -> None:
    target = tmp_path / "snaps"
    target.mkdir()
    os.chmod(target, mode)
    error = refused(target, "roots.mode")
    assert f"{mode:04o}" in str(error) and "0700" in str(error)


@pytest.mark.root
def test_root_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    needs_root()
    target = tmp_path / "snaps"
    target.mkdir(mode=0o700)
    os.chown(target, OTHER_UID, OTHER_UID)
    refused(target, "roots.owner")


def test_root_that_is_a_symlink_or_a_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    refused(tmp_path / "link", "roots.not_directory")
    (tmp_path / "file").write_text("x")
    refused(tmp_path / "file", "roots.not_directory")


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_group_or_world_writable_ancestry_is_refused(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    refused(shared / "snaps", "roots.ancestry_writable")
    assert entries(shared) == [], "nothing is created under an unsafe ancestor"


def test_sticky_shared_ancestry_is_accepted(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    assert stat.S_IMODE(secure(shared / "snaps")) == 0o700


@pytest.mark.root
def test_ancestry_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    needs_root()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    refused(theirs / "snaps", "roots.ancestry_owner")


def test_symlinked_ancestry_is_checked_at_its_real_path(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "alias").symlink_to(real)
    secure(tmp_path / "alias" / "snaps")
    assert (real / "snaps").is_dir()
    os.chmod(real, 0o777)
    refused(tmp_path / "alias" / "other", "roots.ancestry_writable")


@pytest.mark.parametrize(
    ("text", "euid", "expected"),
    [
        ("         0       1000          1\n", 0, 65534),
        ("1000 1000 1\n", 1000, 65534),
        ("0 0 4294967295\n", 0, None),  # the initial namespace: no exception
        ("0 1000 1\n1 100000 65536\n", 0, None),  # more than one entry
        ("0 1000 2\n", 0, None),  # count other than 1
        ("0 1000 1\n", 5, None),  # maps another UID than ours
        ("zero 1000 1\n", 0, None),
        ("", 0, None),
    ],
)
def test_rootless_overflow_uid_needs_one_single_id_mapping_of_our_uid(
    text: str, euid: int, expected: int | None
) -> None:
    assert rootless_overflow_uid(text, euid, 65534) == expected


def test_parse_uid_map() -> None:
    assert parse_uid_map("0 1000 1\n") == (0, 1000, 1)
    assert parse_uid_map("0 1000\n") is None


ROOTLESS_CHILD = textwrap.dedent(
    """
    import os, sys
    from kiln_registry.launcher.roots import secure_private_root
    print(open("/proc/self/uid_map").read().split(), os.stat(sys.argv[1]).st_uid)
    os.close(secure_private_root(sys.argv[1] + "/snaps", what="snapshot root"))
    print("accepted")
    """
)


@pytest.mark.root
def test_overflow_uid_ancestry_is_accepted_only_in_a_rootless_namespace(tmp_path: Path) -> None:
    needs_root()
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux unshare is not installed")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    refused(theirs / "snaps", "roots.ancestry_owner")  # the initial namespace
    # Inside the namespace root has no power over UID 1000's directory: make the parent now.
    (theirs / "snaps").mkdir(mode=0o700)
    argv = [unshare, "--user", "--map-root-user", sys.executable, "-c", ROOTLESS_CHILD, str(theirs)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if "Operation not permitted" in done.stderr and "unshare" in done.stderr:
        pytest.skip(f"user namespaces are not permitted here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    # Inside: a single-entry map of our UID, and the host UID 1000 shows as the overflow UID.
    assert done.stdout.splitlines() == ["['0', '0', '1'] 65534", "accepted"]


def test_distinct_roots_are_accepted(tmp_path: Path) -> None:
    names = ("model", "adapter", "snaps", "caches")
    check_distinct_roots(*(tmp_path / n for n in names))
    check_distinct_roots(tmp_path / "model", None, tmp_path / "snaps", None)


@pytest.mark.parametrize(
    ("model", "adapter", "snaps", "caches", "rule"),
    [
        ("m", None, "m", "c", "roots.equal"),
        ("m", "a", "s", "s", "roots.equal"),
        ("m", "m/adapter", "s", "c", "roots.nested"),
        ("m", None, "m/snaps", "c", "roots.nested"),
        ("s/model", None, "s", "c", "roots.nested"),
        ("m", None, "s", "s/cache", "roots.nested"),
        ("m", "a", "s", "alias-of-m", "roots.equal"),
        ("m", "a", "s", "alias-of-m/x", "roots.nested"),
    ],
)
def test_equal_or_nested_roots_are_refused(
    tmp_path: Path, model: str, adapter: str | None, snaps: str, caches: str, rule: str
) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "alias-of-m").symlink_to(tmp_path / "m")
    with pytest.raises(LauncherError) as caught:
        check_distinct_roots(
            tmp_path / model,
            None if adapter is None else tmp_path / adapter,
            tmp_path / snaps,
            tmp_path / caches,
        )
    assert caught.value.rule == rule


def test_snapshot_root_inside_the_model_is_refused_before_it_is_created(tmp_path: Path) -> None:
    model = write_tree(tmp_path / "model", {"config.json": b"{}"})
    with pytest.raises(LauncherError) as caught:
        stage_snapshot(model, None, model / "snaps", limiter=ReadRateLimiter(None))
    assert caught.value.rule == "roots.nested"
    assert entries(model) == ["config.json"]


def test_owner_record_round_trip_and_refusals(tmp_path: Path) -> None:
    child = tmp_path / "child"
    child.mkdir()
    fd = os.open(child, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_owner_record(fd) is None
        owner = current_owner()
        write_owner_record(fd, owner)
        assert read_owner_record(fd) == owner
        assert stat.S_IMODE((child / OWNER_NAME).stat().st_mode) == 0o400
        renamed = owner.to_bytes().replace(b'"pid"', b'"PID"')
        for bad in (b"{", b"[]", b'{"pid":1}', renamed, b" " * 5000):
            (child / OWNER_NAME).unlink()
            (child / OWNER_NAME).write_bytes(bad)
            assert read_owner_record(fd) is None
    finally:
        os.close(fd)


def test_owner_liveness_uses_pid_start_time_and_boot(tmp_path: Path) -> None:
    me = current_owner()
    assert owner_alive(me)
    assert not owner_alive(OwnerRecord(me.pid, me.start_ticks + 1, me.boot_id))  # PID reused
    assert not owner_alive(OwnerRecord(me.pid, me.start_ticks, "another-boot"))
    gone = subprocess.Popen(["true"])
    gone.wait(30)
    assert process_start_ticks(gone.pid) is None


def test_start_ticks_survive_a_command_name_with_parentheses(tmp_path: Path) -> None:
    odd = tmp_path / "x) 1 2 (y"
    shutil.copy("/bin/sleep", odd)
    child = subprocess.Popen([str(odd), "30"])
    try:
        ticks = process_start_ticks(child.pid)
        assert isinstance(ticks, int) and ticks >= current_owner().start_ticks
        assert owner_alive(OwnerRecord(child.pid, ticks, current_owner().boot_id))
    finally:
        child.kill()
        child.wait(30)
