"""Snapshot staging on real trees: the sealed layout, identities from staged paths,
reflink on a loop-mounted XFS image, copy on ext4, verification, removal, private cache."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kiln_registry.domain.errors import LauncherError
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.snapshot_manifest import SNAPSHOT_MANIFEST_NAME
from kiln_registry.launcher import fsops
from kiln_registry.launcher.roots import OWNER_NAME, read_owner_record
from kiln_registry.launcher.staging import (
    StagedSnapshot,
    StagingLimits,
    create_private_cache,
    remove_private_cache,
    remove_snapshot,
    stage_snapshot,
    verify_snapshot,
)
from kiln_registry.model.inspect import inspect_model
from kiln_registry.testing.tiny_models import TinyModel
from tests.launcher.mounts import entries, loop_image, open_fds, tmpfs, write_tree

READY = re.compile(r"ready-(\d+)-[0-9a-f]{32}")


def unlimited() -> ReadRateLimiter:
    return ReadRateLimiter(None)


def modes(root: Path) -> dict[str, int]:
    """Relative path -> permission bits of every entry below ``root`` (not following links)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def inspect(model: Path, adapter: Path | None) -> dict[str, object]:
    return inspect_model(model, adapter, limiter=unlimited(), use_transformers=False).to_json()


@pytest.fixture
def staged_tiny(
    tiny_model: TinyModel, tiny_adapter: Path, tmp_path: Path
) -> Iterator[StagedSnapshot]:
    staged = stage_snapshot(tiny_model.path, tiny_adapter, tmp_path / "snaps", limiter=unlimited())
    yield staged
    remove_snapshot(staged)


def test_stage_model_and_adapter_seals_a_verified_ready_snapshot(
    tiny_model: TinyModel, tiny_adapter: Path, tmp_path: Path
) -> None:
    fds = open_fds()
    events: list[tuple[str, int, int]] = []
    root = tmp_path / "snaps"
    staged = stage_snapshot(
        tiny_model.path,
        tiny_adapter,
        root,
        limiter=unlimited(),
        progress=lambda *e: events.append(e),
    )
    source = inspect_model(
        tiny_model.path, tiny_adapter, limiter=unlimited(), use_transformers=False
    )
    match = READY.fullmatch(staged.name)
    assert match and int(match[1]) == os.getpid()
    assert entries(root) == [staged.name] and staged.path == root / staged.name
    assert staged.manifest == source.snapshot_manifest
    assert (staged.path / SNAPSHOT_MANIFEST_NAME).read_bytes() == staged.manifest
    assert staged.snapshot_content_sha256 == source.snapshot_content_sha256
    assert [f.path for f in staged.files] == [
        f["path"] for f in json.loads(staged.manifest)["files"]
    ]
    assert staged.bytes_staged == source.bytes_hashed
    assert staged.reflinked_files + staged.copied_files == source.files_hashed
    # Identities computed from the staged paths equal those of the sources.
    assert inspect(staged.model_path, staged.adapter_path) == inspect(tiny_model.path, tiny_adapter)
    found = modes(staged.path)
    assert {p for p, m in found.items() if m == 0o500} == {"model", "adapter"}
    assert all(m == 0o400 for p, m in found.items() if p not in ("model", "adapter"))
    assert stat.S_IMODE(staged.path.stat().st_mode) == 0o500
    assert {name for name, *_ in events} == {"copy", "seal-verify", "verify"}
    assert events[0] == ("copy", 0, staged.bytes_staged)
    assert events[-1] == ("verify", staged.bytes_staged, staged.bytes_staged)
    verify_snapshot(staged, limiter=unlimited())
    remove_snapshot(staged)
    remove_snapshot(staged)  # idempotent
    assert entries(root) == [] and staged.root_fd == -1
    assert open_fds() == fds


def test_owner_record_names_this_process(staged_tiny: StagedSnapshot) -> None:
    fd = os.open(staged_tiny.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        record = read_owner_record(fd)
    finally:
        os.close(fd)
    assert record is not None and record.pid == os.getpid()


def test_empty_directories_empty_files_and_unicode_names(tmp_path: Path) -> None:
    model = write_tree(
        tmp_path / "model",
        {"config.json": b"{}", "empty.bin": b"", "sub/é ü.txt": b"x" * 5000},
        dirs=("a/b/c", "z"),
    )
    staged = stage_snapshot(model, None, tmp_path / "snaps", limiter=unlimited(), workers=3)
    try:
        document = json.loads(staged.manifest)
        assert document["has_adapter"] is False and staged.adapter_path is None
        assert document["directories"] == ["model", "model/a", "model/a/b", "model/a/b/c",
                                           "model/sub", "model/z"]  # fmt: skip
        assert [(f["path"], f["bytes"]) for f in document["files"]] == [
            ("model/config.json", 2), ("model/empty.bin", 0), ("model/sub/é ü.txt", 5000)
        ]  # fmt: skip
        assert (staged.model_path / "sub" / "é ü.txt").read_bytes() == b"x" * 5000
        assert entries(staged.path) == sorted([OWNER_NAME, "model", SNAPSHOT_MANIFEST_NAME])
    finally:
        remove_snapshot(staged)


def test_every_pass_goes_through_the_shared_limiter(tmp_path: Path) -> None:
    model = write_tree(tmp_path / "model", {"a.bin": os.urandom(3 << 20), "b.bin": b"b" * 10})
    limiter = unlimited()
    staged = stage_snapshot(model, None, tmp_path / "snaps", limiter=limiter)
    try:
        # Source (read while copying, or hashed after a reflink), destination hash,
        # sealed re-hash, verify after rename; then the pre-spawn verify.
        assert limiter.total_bytes == 4 * staged.bytes_staged
        verify_snapshot(staged, limiter=limiter)
        assert limiter.total_bytes == 5 * staged.bytes_staged
    finally:
        remove_snapshot(staged)


def _writable(path: Path) -> None:
    os.chmod(path, 0o700 if path.is_dir() else 0o600)


@pytest.mark.parametrize(
    ("tamper", "rule"),
    [
        (lambda s: (s.model_path / "config.json").write_bytes(b"{}"), "staging.verify_mismatch"),
        (lambda s: (s.model_path / "extra.bin").write_bytes(b""), "staging.verify_mode"),
        (lambda s: os.chmod(s.model_path / "config.json", 0o600), "staging.verify_mode"),
        (lambda s: (s.path / "stray").mkdir(), "staging.verify_extra"),
        (lambda s: (s.path / SNAPSHOT_MANIFEST_NAME).write_bytes(b"{}"), "staging.verify_manifest"),
        (
            lambda s: os.link(s.model_path / "config.json", s.path.parent / "x"),
            "staging.verify_mode",
        ),
    ],
    ids=["content", "extra-file", "mode", "extra-top-level", "manifest", "hard-link"],
)
def test_verify_snapshot_refuses_a_tampered_tree(
    staged_tiny: StagedSnapshot, tamper: Callable[[StagedSnapshot], object], rule: str
) -> None:
    if os.geteuid() != 0:
        for path in (
            staged_tiny.path,
            staged_tiny.model_path,
            staged_tiny.model_path / "config.json",
        ):
            _writable(path)
    tamper(staged_tiny)
    with pytest.raises(LauncherError) as caught:
        verify_snapshot(staged_tiny, limiter=unlimited())
    assert caught.value.rule == rule, str(caught.value)
    (staged_tiny.path.parent / "x").unlink(missing_ok=True)


def test_content_change_of_equal_length_is_a_mismatch(staged_tiny: StagedSnapshot) -> None:
    target = staged_tiny.model_path / "config.json"
    data = bytearray(target.read_bytes())
    data[0] ^= 1
    os.chmod(target, 0o600)
    target.write_bytes(bytes(data))
    os.chmod(target, 0o400)
    with pytest.raises(LauncherError) as caught:
        verify_snapshot(staged_tiny, limiter=unlimited())
    assert caught.value.rule == "staging.verify_mismatch"


def test_remove_snapshot_unlinks_links_without_following_them(
    staged_tiny: StagedSnapshot, tmp_path: Path
) -> None:
    outside = write_tree(tmp_path / "outside", {"keep.txt": b"keep"})
    os.chmod(staged_tiny.model_path, 0o700)
    os.symlink(outside, staged_tiny.model_path / "link-dir")
    os.symlink(outside / "keep.txt", staged_tiny.model_path / "link-file")
    remove_snapshot(staged_tiny)
    assert not staged_tiny.path.exists()
    assert (outside / "keep.txt").read_bytes() == b"keep"


@pytest.mark.root
def test_remove_snapshot_does_not_cross_into_another_file_system(
    staged_tiny: StagedSnapshot, tmp_path: Path
) -> None:
    point = staged_tiny.model_path / "mounted"
    os.chmod(staged_tiny.model_path, 0o700)
    point.mkdir()
    with tmpfs(point, size="1m"):
        (point / "other-fs.txt").write_bytes(b"keep")
        with pytest.raises(LauncherError) as caught:
            remove_snapshot(staged_tiny)
        assert caught.value.rule == "remove.cross_device"
        assert (point / "other-fs.txt").read_bytes() == b"keep"
    parent_fd = os.open(staged_tiny.path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsops.remove_tree_at(parent_fd, staged_tiny.name, dev=staged_tiny.dev, shown="leftover")
    finally:
        os.close(parent_fd)


def cached_files(root: Path) -> set[str]:
    """Files below ``root`` whose first byte is in the page cache (``RWF_NOWAIT`` reads)."""
    found = set()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_size):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
            found.add(str(path.relative_to(root)))
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    return found


def warm_clean_copy(source: Path, destination: Path) -> set[str]:
    """Copy a tree, write it back (dropping needs clean pages) and read it; the files cached."""
    shutil.copytree(source, destination)
    os.sync()
    for path in destination.rglob("*"):
        if path.is_file():
            path.read_bytes()
    return cached_files(destination)


@pytest.fixture(scope="module")
def xfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with loop_image(tmp_path_factory.mktemp("xfs"), "xfs", size_mib=320) as point:
        yield point


@pytest.mark.root
def test_reflink_path_on_xfs(xfs: Path, tiny_model: TinyModel, tiny_adapter: Path) -> None:
    model = xfs / "src" / "model"
    adapter = xfs / "src" / "adapter"
    warmed = warm_clean_copy(tiny_model.path, model)
    assert warmed
    assert warm_clean_copy(tiny_adapter, adapter)
    limiter = unlimited()
    staged = stage_snapshot(model, adapter, xfs / "snaps", limiter=limiter)
    try:
        count = len(staged.files)
        assert (staged.reflinked_files, staged.copied_files) == (count, 0)
        # Staging dropped the sources' cached pages; the snapshot's are cached.
        assert cached_files(xfs / "src") == set()
        assert cached_files(staged.path) >= {f"model/{name}" for name in warmed}
        # Reflink path: source hash, destination hash, sealed re-hash, verify.
        assert limiter.total_bytes == 4 * staged.bytes_staged
        assert inspect(staged.model_path, staged.adapter_path) == inspect(model, adapter)
        verify_snapshot(staged, limiter=limiter)
    finally:
        remove_snapshot(staged)
        shutil.rmtree(xfs / "src")
    assert entries(xfs / "snaps") == []


@pytest.mark.root
def test_copy_path_on_ext4(tmp_path: Path, tiny_model: TinyModel) -> None:
    with loop_image(tmp_path, "ext4", size_mib=32) as point:
        model = point / "model"
        warmed = warm_clean_copy(tiny_model.path, model)
        small = StagingLimits(headroom_bytes=1 << 20)
        staged = stage_snapshot(model, None, point / "snaps", limiter=unlimited(), limits=small)
        try:
            assert (staged.reflinked_files, staged.copied_files) == (0, len(staged.files))
            # A copied source keeps its cached pages; only reflinked ones are dropped.
            assert cached_files(model) == warmed
            assert cached_files(staged.path) >= {f"model/{name}" for name in warmed}
            assert inspect(staged.model_path, None) == inspect(model, None)
        finally:
            remove_snapshot(staged)


def test_private_cache_is_a_fresh_private_child(tmp_path: Path) -> None:
    fds = open_fds()
    first = create_private_cache(tmp_path / "caches")
    second = create_private_cache(tmp_path / "caches")
    assert re.fullmatch(rf"cache-{os.getpid()}-[0-9a-f]{{32}}", first.name)
    assert first.name != second.name and first.path == tmp_path / "caches" / first.name
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o700
    assert entries(first.path) == [OWNER_NAME]
    (first.path / "torch_compile_cache" / "x").mkdir(parents=True)
    remove_private_cache(first)
    remove_private_cache(first)
    remove_private_cache(second)
    assert entries(tmp_path / "caches") == []
    assert open_fds() == fds


def test_private_cache_refuses_a_shared_parent(tmp_path: Path) -> None:
    parent = tmp_path / "caches"
    parent.mkdir(mode=0o755)
    os.chmod(parent, 0o755)
    with pytest.raises(LauncherError) as caught:
        create_private_cache(parent)
    assert caught.value.rule == "roots.mode"
    assert entries(parent) == []


def test_bad_worker_count_is_refused_before_anything_is_created(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    with pytest.raises(LauncherError) as caught:
        stage_snapshot(tiny_model.path, None, tmp_path / "snaps", limiter=unlimited(), workers=0)
    assert caught.value.rule == "staging.workers"
    assert not (tmp_path / "snaps").exists()
