"""Streaming, rate-limited, parallel file hashing on real files."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.hashing import CHUNK_BYTES, ReadRateLimiter, hash_file, hash_files


def unlimited() -> ReadRateLimiter:
    return ReadRateLimiter(None)


def test_hash_file_matches_hashlib_and_counts_bytes(tmp_path: Path) -> None:
    data = os.urandom(3 * CHUNK_BYTES + 5)
    path = tmp_path / "shard.safetensors"
    path.write_bytes(data)
    limiter = unlimited()
    record = hash_file(path, limiter=limiter)
    assert record.digest == hashlib.sha256(data).digest()
    assert record.length == len(data)
    assert limiter.total_bytes == len(data)


def test_empty_file_hashes_to_empty_digest(tmp_path: Path) -> None:
    (tmp_path / "e").write_bytes(b"")
    assert hash_file(tmp_path / "e", limiter=unlimited()).digest == hashlib.sha256().digest()


def test_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(IdentityError) as err:
        hash_file(tmp_path / "link", limiter=unlimited())
    assert err.value.rule == "file.symlink"
    assert "link" in err.value.message


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(IdentityError) as err:
        hash_file(tmp_path / "pipe", limiter=unlimited())
    assert err.value.rule == "file.not_regular"


def test_directory_and_missing_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(IdentityError) as err:
        hash_file(tmp_path, limiter=unlimited())
    assert err.value.rule == "file.not_regular"
    with pytest.raises(IdentityError) as err:
        hash_file(tmp_path / "absent", limiter=unlimited())
    assert err.value.rule == "file.unreadable"
    assert "absent" in str(err.value)


def test_expected_length_mismatch_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    with pytest.raises(IdentityError) as err:
        hash_file(tmp_path / "f", limiter=unlimited(), expected_length=4)
    assert err.value.rule == "file.changed"


class MutatingLimiter(ReadRateLimiter):
    """Changes the file at a chosen point of a read.

    A race with a concurrent writer cannot be timed reliably from a test, so
    the mutation is done (for real, on the real file) from the read path.
    """

    def __init__(self, action: object) -> None:
        super().__init__(None)
        self.action = action
        self.calls = 0

    def acquire(self, nbytes: int) -> None:
        super().acquire(nbytes)
        self.calls += 1
        if self.calls == 2:
            self.action()  # type: ignore[operator]


def test_growth_while_reading_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * (2 * CHUNK_BYTES))

    def grow() -> None:
        with path.open("ab") as handle:
            handle.write(b"more")

    with pytest.raises(IdentityError) as err:
        hash_file(path, limiter=MutatingLimiter(grow))
    assert err.value.rule == "file.grew"


def test_shrink_while_reading_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * (3 * CHUNK_BYTES))
    with pytest.raises(IdentityError) as err:
        hash_file(path, limiter=MutatingLimiter(lambda: os.truncate(path, CHUNK_BYTES)))
    assert err.value.rule == "file.shrunk"


def test_replacement_while_reading_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * (2 * CHUNK_BYTES))
    other = tmp_path / "g"
    other.write_bytes(b"a" * (2 * CHUNK_BYTES))
    with pytest.raises(IdentityError) as err:
        hash_file(path, limiter=MutatingLimiter(lambda: os.replace(other, path)))
    assert err.value.rule == "file.replaced"


def test_in_place_rewrite_while_reading_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * (2 * CHUNK_BYTES))

    def rewrite() -> None:
        with path.open("r+b") as handle:
            handle.write(b"b")
        os.utime(path, ns=(1, 1))

    with pytest.raises(IdentityError) as err:
        hash_file(path, limiter=MutatingLimiter(rewrite))
    assert err.value.rule == "file.changed"


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_hash_files_keeps_input_order_for_any_worker_count(tmp_path: Path, workers: int) -> None:
    blobs = [os.urandom(n) for n in (10, CHUNK_BYTES + 1, 0, 3000, 2 * CHUNK_BYTES)]
    paths = []
    for i, blob in enumerate(blobs):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(blob)
    limiter = unlimited()
    records = hash_files(paths, limiter=limiter, workers=workers)
    assert [r.digest for r in records] == [hashlib.sha256(b).digest() for b in blobs]
    assert limiter.total_bytes == sum(len(b) for b in blobs)


def test_hash_files_reports_the_failing_file(tmp_path: Path) -> None:
    (tmp_path / "ok").write_bytes(b"x")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(IdentityError) as err:
        hash_files([tmp_path / "ok", tmp_path / "pipe"], limiter=unlimited(), workers=2)
    assert "pipe" in err.value.message


@pytest.mark.parametrize("workers", [0, -1, True])
def test_bad_worker_count_is_refused(tmp_path: Path, workers: int) -> None:
    with pytest.raises(IdentityError) as err:
        hash_files([tmp_path], limiter=unlimited(), workers=workers)
    assert err.value.rule == "hashing.workers"


@pytest.mark.parametrize("value", [0, -1, 16385, True, 1.5])
def test_rate_limit_range(value: object) -> None:
    with pytest.raises(IdentityError) as err:
        ReadRateLimiter(value)  # type: ignore[arg-type]
    assert err.value.rule == "rate_limit.range"


@pytest.mark.parametrize("value", [None, 1, 16384])
def test_rate_limit_accepted(value: int | None) -> None:
    assert ReadRateLimiter(value).total_bytes == 0


def test_one_limiter_spans_threads_and_is_never_reset() -> None:
    # A lower bound on elapsed time, which no slow machine can break: at
    # 1 MiB/s with one second of initial credit, 1.5 MiB from three threads
    # cannot finish in under ~0.5 s.
    limiter = ReadRateLimiter(1)
    mib = 1024 * 1024
    start = time.monotonic()
    threads = [threading.Thread(target=limiter.acquire, args=(mib // 2,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - start >= 0.45
    assert limiter.total_bytes == 3 * (mib // 2)
    assert repr(limiter) == "ReadRateLimiter(mib_per_second=1)"


def test_hash_files_stops_starting_files_after_a_failure(tmp_path: Path) -> None:
    paths = [tmp_path / f"f{i:03d}" for i in range(300)]
    for path in paths:
        path.write_bytes(b"x" * 100)
    lengths: list[int | None] = [100] * len(paths)
    lengths[150] = 10**9  # taken first (largest first) and refused at once: wrong length
    limiter = unlimited()
    with pytest.raises(IdentityError) as err:
        hash_files(paths, limiter=limiter, workers=2, expected_lengths=lengths)
    assert err.value.rule == "file.changed" and "f150" in err.value.message
    assert limiter.total_bytes < 100 * 50  # the other worker stopped after a few files


def test_hash_files_raises_the_failure_of_the_file_taken_first(tmp_path: Path) -> None:
    for name in ("big", "small", "ok"):
        (tmp_path / name).write_bytes(b"y")
    paths = [tmp_path / "ok", tmp_path / "small", tmp_path / "big"]
    for _ in range(20):  # both failing files are taken at once by two workers
        with pytest.raises(IdentityError) as err:
            hash_files(paths, limiter=unlimited(), workers=2, expected_lengths=[1, 5, 9])
        assert "big" in err.value.message
