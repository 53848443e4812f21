"""Staging faults on real files: full disks, mutation during copy, links and FIFOs.

Every failure must leave the snapshot root empty (no ``.building-*`` or
``ready-*`` child) and no descriptor open.  Mutations are real writes,
truncations, renames and link swaps of real files.  To land them at a
precise point inside the copy, ``MutatingLimiter`` (a real, unlimited
``ReadRateLimiter`` that still meters every read) runs the mutation once,
synchronously, when the reads reach a byte offset; one test instead races a
helper thread against a slow limiter.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kiln_registry.domain.errors import IdentityError, KilnError, LauncherError
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.staging import StagingLimits, remove_snapshot, stage_snapshot
from kiln_registry.testing.tiny_models import TinyModel
from tests.launcher.mounts import entries, loop_image, open_fds, tmpfs, write_tree

MIB = 1 << 20
NO_HEADROOM = StagingLimits(headroom_bytes=0, headroom_inodes=0)


class MutatingLimiter(ReadRateLimiter):
    """Unlimited limiter that runs ``mutate`` once, when ``after`` bytes have been acquired."""

    def __init__(self, after: int, mutate: Callable[[], None]) -> None:
        super().__init__(None)
        self._after = after
        self._mutate: Callable[[], None] | None = mutate

    def acquire(self, nbytes: int) -> None:
        super().acquire(nbytes)
        if self._mutate is not None and self.total_bytes >= self._after:
            mutate, self._mutate = self._mutate, None
            mutate()


@pytest.fixture
def big_tree(tmp_path: Path) -> Path:
    """One 3 MiB file (three copy chunks) with an old mtime, and a small one."""
    root = write_tree(tmp_path / "model", {"big.bin": os.urandom(3 * MIB), "small.json": b"{}"})
    for name in ("big.bin", "small.json"):
        os.utime(root / name, ns=(1_000_000_000, 1_000_000_000))
    return root


@contextlib.contextmanager
def refused(
    root: Path, kind: type[KilnError], rule: str, *, text: str | None = None
) -> Iterator[None]:
    fds = open_fds()
    with pytest.raises(kind) as caught:
        yield
    assert caught.value.rule == rule, str(caught.value)
    if text is not None:
        assert text in caught.value.one_line()
    assert entries(root) == [], "a partial snapshot was left behind"
    assert open_fds() == fds


def _append(path: Path) -> Callable[[], None]:
    def mutate() -> None:
        with open(path, "ab") as handle:
            handle.write(b"more")

    return mutate


def _truncate(path: Path) -> Callable[[], None]:
    return lambda: os.truncate(path, MIB)


def _replace(path: Path) -> Callable[[], None]:
    def mutate() -> None:
        other = path.with_name("replacement")
        other.write_bytes(path.read_bytes())
        os.replace(other, path)

    return mutate


def _rewrite(path: Path) -> Callable[[], None]:
    def mutate() -> None:
        with open(path, "r+b") as handle:
            handle.seek(2 * MIB + 5)
            handle.write(b"\x00\xff")

    return mutate


@pytest.mark.parametrize(
    ("mutation", "rule"),
    [
        (_append, "staging.source_grew"),
        (_truncate, "staging.source_shrunk"),
        (_replace, "staging.source_replaced"),
        (_rewrite, "staging.source_changed"),
    ],
    ids=["grows", "shrinks", "replaced", "rewritten-in-place"],
)
def test_source_mutated_during_copy_fails_the_launch(
    big_tree: Path, tmp_path: Path, mutation: Callable[[Path], Callable[[], None]], rule: str
) -> None:
    # Larger files start first: the mutation lands after the first 1 MiB chunk of big.bin.
    limiter = MutatingLimiter(MIB + 1, mutation(big_tree / "big.bin"))
    root = tmp_path / "snaps"
    with refused(root, IdentityError, rule):
        stage_snapshot(big_tree, None, root, limiter=limiter, workers=1)


def test_growth_raced_by_a_helper_thread_fails_the_launch(big_tree: Path, tmp_path: Path) -> None:
    """A real concurrent writer; the 1 MiB/s limiter keeps the copy open for about 2 s."""
    started = threading.Event()
    stop = threading.Event()

    def writer() -> None:
        started.wait(10)
        while not stop.wait(0.05):
            with open(big_tree / "big.bin", "ab") as handle:
                handle.write(b"x")

    thread = threading.Thread(target=writer)
    thread.start()
    root = tmp_path / "snaps"
    try:
        with pytest.raises(IdentityError) as caught:
            stage_snapshot(
                big_tree,
                None,
                root,
                limiter=ReadRateLimiter(1),
                workers=1,
                progress=lambda phase, done, total: started.set(),
            )
    finally:
        stop.set()
        started.set()
        thread.join(10)
    assert caught.value.rule in ("staging.source_grew", "staging.source_changed")
    assert entries(root) == []


def test_file_changed_between_inventory_and_copy(big_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    grow = _append(big_tree / "small.json")
    with refused(root, IdentityError, "staging.source_changed"):
        stage_snapshot(
            big_tree, None, root, limiter=ReadRateLimiter(None), progress=lambda *_: grow()
        )


def test_symlink_swapped_in_after_inventory(big_tree: Path, tmp_path: Path) -> None:
    elsewhere = write_tree(tmp_path / "elsewhere", {"x": b"{}"})

    def swap(phase: str, done: int, total: int) -> None:
        if phase == "copy" and done == 0:
            os.unlink(big_tree / "small.json")
            os.symlink(elsewhere / "x", big_tree / "small.json")

    root = tmp_path / "snaps"
    with refused(root, IdentityError, "staging.source_symlink", text="Hugging Face"):
        stage_snapshot(big_tree, None, root, limiter=ReadRateLimiter(None), progress=swap)


def test_directory_swapped_for_a_symlink_after_inventory(tmp_path: Path) -> None:
    model = write_tree(tmp_path / "model", {"config.json": b"{}", "sub/w.bin": b"w" * 100})

    def swap(phase: str, done: int, total: int) -> None:
        if phase == "copy" and done == 0:
            os.rename(model / "sub", tmp_path / "moved")
            os.symlink(tmp_path / "moved", model / "sub")

    root = tmp_path / "snaps"
    with refused(root, IdentityError, "tree.symlink", text="Hugging Face"):
        stage_snapshot(model, None, root, limiter=ReadRateLimiter(None), progress=swap)


def test_symlink_in_the_tree_is_refused_with_the_hugging_face_hint(tmp_path: Path) -> None:
    model = write_tree(tmp_path / "model", {"blob": b"{}"})
    os.symlink("blob", model / "config.json")
    root = tmp_path / "snaps"
    with refused(root, IdentityError, "tree.symlink", text="materialize"):
        stage_snapshot(model, None, root, limiter=ReadRateLimiter(None))


def test_fifo_in_the_tree_is_refused(tmp_path: Path) -> None:
    model = write_tree(tmp_path / "model", {"config.json": b"{}"})
    os.mkfifo(model / "pipe")
    root = tmp_path / "snaps"
    with refused(root, IdentityError, "tree.special_file"):
        stage_snapshot(model, None, root, limiter=ReadRateLimiter(None))


def test_fifo_swapped_in_after_inventory_is_refused(big_tree: Path, tmp_path: Path) -> None:
    def swap(phase: str, done: int, total: int) -> None:
        if phase == "copy" and done == 0:
            os.unlink(big_tree / "small.json")
            os.mkfifo(big_tree / "small.json")

    root = tmp_path / "snaps"
    with refused(root, IdentityError, "staging.source_special"):
        stage_snapshot(big_tree, None, root, limiter=ReadRateLimiter(None), progress=swap)


def test_staged_tree_tampered_before_sealed_verification(big_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "snaps"

    def tamper(phase: str, done: int, total: int) -> None:
        if phase == "seal-verify" and done == 0:
            (building,) = entries(root)
            target = root / building / "model" / "small.json"
            os.chmod(target, 0o600)
            target.write_bytes(b"[]")
            os.chmod(target, 0o400)

    with refused(root, LauncherError, "staging.verify_mismatch"):
        stage_snapshot(big_tree, None, root, limiter=ReadRateLimiter(None), progress=tamper)


def test_bounds_are_checked_before_copying(big_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    limiter = ReadRateLimiter(None)

    def stage(limits: StagingLimits, adapter: Path | None = None) -> None:
        stage_snapshot(big_tree, adapter, root, limiter=limiter, limits=limits)

    with refused(root, IdentityError, "tree.too_many_entries"):
        stage(StagingLimits(max_entries=1))
    with refused(root, IdentityError, "tree.too_many_bytes"):
        stage(StagingLimits(max_bytes=MIB))
    # The staged (logical) path "model/small.json" counts, not just "small.json".
    with refused(root, IdentityError, "staging.path_too_long"):
        stage(StagingLimits(max_path_bytes=len("model/small.json") - 1))
    adapter = write_tree(tmp_path / "adapter", {"adapter_config.json": b"{}", "w.bin": b"w"})
    # Each tree fits on its own; together they exceed the aggregate bounds.
    with refused(root, IdentityError, "staging.too_many_entries"):
        stage(StagingLimits(max_entries=4), adapter)
    with refused(root, IdentityError, "staging.too_many_bytes"):
        stage(StagingLimits(max_bytes=3 * MIB + 2), adapter)
    with refused(root, IdentityError, "staging.too_many_path_bytes"):
        stage(StagingLimits(max_total_path_bytes=60), adapter)
    assert limiter.total_bytes == 0


@pytest.mark.root
def test_full_disk_is_refused_before_copying(tmp_path: Path, tiny_model: TinyModel) -> None:
    with tmpfs(tmp_path / "small", size="1m") as point:
        root = point / "snaps"
        limiter = ReadRateLimiter(None)
        with refused(root, LauncherError, "staging.no_space", text="reflinks are not counted"):
            stage_snapshot(tiny_model.path, None, root, limiter=limiter)
        assert limiter.total_bytes == 0, "nothing may be read before the capacity check"


@pytest.mark.root
def test_too_few_inodes_is_refused_before_copying(tmp_path: Path) -> None:
    files = {f"f{i:02}": b"x" for i in range(30)}
    model = write_tree(tmp_path / "model", files)
    with tmpfs(tmp_path / "few-inodes", size="8m", nr_inodes=16) as point:
        root = point / "snaps"
        with refused(root, LauncherError, "staging.no_inodes"):
            stage_snapshot(model, None, root, limiter=ReadRateLimiter(None), limits=NO_HEADROOM)


@pytest.mark.root
def test_disk_filling_during_the_copy_fails_cleanly(tmp_path: Path) -> None:
    model = write_tree(tmp_path / "model", {f"s{i}.bin": os.urandom(MIB) for i in range(4)})
    with tmpfs(tmp_path / "filling", size="8m") as point:
        root = point / "snaps"

        def fill(phase: str, done: int, total: int) -> None:
            if phase == "copy" and done == 0:
                fd = os.open(point / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    while os.write(fd, b"\0" * 65536):
                        pass
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                finally:
                    os.close(fd)

        with refused(root, LauncherError, "staging.no_space"):
            stage_snapshot(
                model, None, root, limiter=ReadRateLimiter(None), limits=NO_HEADROOM, progress=fill
            )
        (point / "filler").unlink()


@pytest.mark.root
def test_reflinked_source_changed_before_it_was_hashed(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    with loop_image(tmp_path, "xfs", size_mib=320) as point:
        model = point / "model"
        shutil.copytree(tiny_model.path, model)
        shard = model / "model.safetensors"
        os.utime(shard, ns=(1_000_000_000, 1_000_000_000))

        def rewrite() -> None:
            with open(shard, "r+b") as handle:
                handle.seek(100)
                handle.write(b"\x01\x02")

        # The clone reads nothing; the first bytes acquired are the source hash of the shard.
        root = point / "snaps"
        with refused(root, IdentityError, "staging.source_changed"):
            stage_snapshot(
                model, None, root, limiter=MutatingLimiter(1, rewrite), workers=1,
                limits=StagingLimits(headroom_bytes=MIB),
            )  # fmt: skip


def test_remove_snapshot_after_success_leaves_nothing(big_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    staged = stage_snapshot(big_tree, None, root, limiter=ReadRateLimiter(None))
    remove_snapshot(staged)
    assert entries(root) == []
