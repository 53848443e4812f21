"""Real small file systems for launcher tests: a tmpfs and loop-mounted XFS/ext4 images.

Also the small tree helpers the staging, roots and cleanup tests share.
Mounting needs root (the CI machines run tests as root).  Each helper skips the test,
saying why, only when mounting is impossible here: not root, the mkfs tool
missing (``apt-get install -y xfsprogs`` provides ``mkfs.xfs``), or the kernel
refusing the mount.  Everything is unmounted on exit, lazily if still busy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TIMEOUT = 60


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount file systems (CI runs tests as root)")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)


def _mount(argv: list[str], what: str) -> None:
    done = _run(argv)
    if done.returncode != 0:
        pytest.skip(f"cannot mount {what} here: {done.stderr.strip() or done.returncode}")


def _unmount(point: Path) -> None:
    if _run(["umount", str(point)]).returncode != 0:
        _run(["umount", "-l", str(point)])


@contextmanager
def tmpfs(point: Path, *, size: str, nr_inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``"1m"``) mounted on ``point`` with mode 0700."""
    require_root()
    point.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700"
    if nr_inodes is not None:
        options += f",nr_inodes={nr_inodes}"
    _mount(["mount", "-t", "tmpfs", "-o", options, "kiln-test", str(point)], "a tmpfs")
    try:
        yield point
    finally:
        _unmount(point)


def _mkfs(kind: str) -> str:
    tool = shutil.which(f"mkfs.{kind}") or shutil.which(f"mkfs.{kind}", path="/usr/sbin:/sbin")
    if tool is None:
        hint = "apt-get install -y xfsprogs" if kind == "xfs" else "apt-get install -y e2fsprogs"
        pytest.skip(f"mkfs.{kind} is not installed ({hint})")
    return tool


@contextmanager
def loop_image(workdir: Path, kind: str, *, size_mib: int) -> Iterator[Path]:
    """A sparse ``kind`` (``xfs`` or ``ext4``) image in ``workdir``, loop-mounted, mode 0700."""
    require_root()
    tool = _mkfs(kind)
    image = workdir / f"{kind}.img"
    point = workdir / f"{kind}-mnt"
    point.mkdir(parents=True)
    with open(image, "wb") as handle:
        handle.truncate(size_mib * 1024 * 1024)
    options = ["-q", "-f", "-m", "reflink=1"] if kind == "xfs" else ["-q", "-F"]
    made = _run([tool, *options, str(image)])
    if made.returncode != 0:
        pytest.skip(f"mkfs.{kind} failed here: {made.stderr.strip()}")
    _mount(["mount", "-o", "loop", str(image), str(point)], f"a loop {kind} image")
    try:
        os.chmod(point, 0o700)
        yield point
    finally:
        _unmount(point)
        image.unlink(missing_ok=True)


def write_tree(root: Path, files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> Path:
    """Create ``root`` with ``files`` (relative path -> bytes) and extra empty ``dirs``."""
    root.mkdir(parents=True, exist_ok=True)
    for relpath in dirs:
        (root / relpath).mkdir(parents=True, exist_ok=True)
    for relpath, data in files.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)
    return root


def open_fds() -> int:
    """How many descriptors this process holds (to prove none leaked)."""
    return len(os.listdir("/proc/self/fd"))


def entries(root: Path) -> list[str]:
    return sorted(os.listdir(root)) if root.exists() else []
