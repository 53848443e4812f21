"""The staged copy starts write-back as it goes (the copy path's speed depends on it)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher import fsops


@pytest.mark.skipif(sys.platform != "linux", reason="sync_file_range is Linux's")
def test_sync_file_range_is_bound_on_linux() -> None:
    assert fsops._sync_file_range() is not None


def test_copy_and_hash_copies_exactly_across_writeback_steps(tmp_path: Path) -> None:
    data = os.urandom(fsops._WRITEBACK_STEP * 2 + 12345)
    (tmp_path / "src").write_bytes(data)
    src = os.open(tmp_path / "src", os.O_RDONLY)
    dst = os.open(tmp_path / "dst", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        digest = fsops.copy_and_hash(src, dst, len(data), ReadRateLimiter(None), shown="src")
    finally:
        os.close(src)
        os.close(dst)
    assert digest == hashlib.sha256(data).digest()
    assert (tmp_path / "dst").read_bytes() == data
