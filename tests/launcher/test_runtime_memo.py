"""The runtime-content memo (launcher.runtime_memo) over a real installed package.

The measured runtime is the real ``tokenizers`` distribution and a copy of this
interpreter's executable (a file the test may rewrite: its new status-change time
must turn a hit into a miss).  Whether a call hashed is read from the shared
``ReadRateLimiter``'s byte count: the inventory reads no file bytes through it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.roots import secure_private_root
from kiln_registry.launcher.runtime import RuntimeContent, runtime_content
from kiln_registry.launcher.runtime_memo import (
    MAX_ENTRIES,
    MAX_MEMO_BYTES,
    MEMO_NAME,
    MEMO_SCHEMA,
    MemoEntry,
    RuntimeMemo,
)

PACKAGES = ("tokenizers",)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[Path, RuntimeMemo]]:
    path = tmp_path / "caches"
    fd = secure_private_root(path, what="cache root")
    try:
        yield path, RuntimeMemo(fd)
    finally:
        os.close(fd)


@pytest.fixture
def executable(tmp_path: Path) -> Path:
    copy = tmp_path / "bin" / "python"
    copy.parent.mkdir()
    shutil.copyfile(os.path.realpath(sys.executable), copy)
    return copy


def measure(executable: Path, memo: RuntimeMemo | None) -> tuple[RuntimeContent, int]:
    """The content and how many bytes were hashed to get it."""
    limiter = ReadRateLimiter(None)
    content = runtime_content(
        limiter=limiter, packages=PACKAGES, python_executable=executable, memo=memo
    )
    return content, limiter.total_bytes


def test_an_unchanged_runtime_is_not_hashed_again_and_a_changed_file_is(
    root: tuple[Path, RuntimeMemo], executable: Path
) -> None:
    path, memo = root
    truth, _ = measure(executable, None)
    first, hashed = measure(executable, memo)
    assert first == truth and hashed > 0
    memo_file = path / MEMO_NAME
    assert stat.S_IMODE(memo_file.stat().st_mode) == 0o600
    assert [e.sha256 for e in _entries(memo_file)] == [truth.sha256]

    again, hashed = measure(executable, memo)
    assert again == truth and hashed == 0  # the memo's digest, nothing read

    executable.write_bytes(executable.read_bytes())  # same bytes, new ctime: a miss
    changed, hashed = measure(executable, memo)
    assert changed == truth and hashed > 0
    assert len(_entries(memo_file)) == 2  # the new signature first, the old one kept


def test_the_memo_is_believed_so_only_the_recheck_may_decide(
    root: tuple[Path, RuntimeMemo], executable: Path
) -> None:
    """A forged entry is returned as it stands (why the recheck never reads the memo),
    and ``forget`` (what a launch does when the recheck disagrees) removes it."""
    path, memo = root
    truth, _ = measure(executable, memo)
    document = json.loads((path / MEMO_NAME).read_bytes())
    document["entries"][0]["sha256"] = "0" * 64
    (path / MEMO_NAME).write_text(json.dumps(document))
    forged, hashed = measure(executable, memo)
    assert forged.sha256 == "0" * 64 and hashed == 0
    assert measure(executable, None)[0] == truth  # the recheck's way: every file hashed

    memo.forget()
    assert not (path / MEMO_NAME).exists()
    memo.forget()  # idempotent
    assert measure(executable, memo) == (truth, measure(executable, None)[1])


def _memo(*entries: dict[str, object], schema: str = MEMO_SCHEMA) -> bytes:
    return json.dumps({"schema": schema, "entries": list(entries)}).encode()


def _item(**change: object) -> dict[str, object]:
    return {**MemoEntry("a" * 64, "b" * 64, 1, 1, 1).to_dict(), **change}


BAD_DOCUMENTS = {
    "not json": b"{",
    "another schema": _memo(schema="other"),
    "entries not a list": json.dumps({"schema": MEMO_SCHEMA, "entries": {}}).encode(),
    "an extra key": _memo(_item(more=1)),
    "a short digest": _memo(_item(sha256="b")),
    "a negative count": _memo(_item(files=-1)),
    "a boolean count": _memo(_item(directories=True)),
    "too many entries": _memo(*(_item(signature=f"{i:064x}") for i in range(MAX_ENTRIES + 1))),
    "too large": b" " * (MAX_MEMO_BYTES + 1),
}


@pytest.mark.parametrize("kind", sorted(BAD_DOCUMENTS))
def test_a_malformed_memo_is_a_miss_and_is_replaced(
    root: tuple[Path, RuntimeMemo], executable: Path, kind: str
) -> None:
    path, memo = root
    (path / MEMO_NAME).write_bytes(BAD_DOCUMENTS[kind])
    assert memo.find("a" * 64) is None
    truth, hashed = measure(executable, memo)
    assert hashed > 0
    assert [e.sha256 for e in _entries(path / MEMO_NAME)] == [truth.sha256]


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_a_memo_that_is_not_a_regular_file_is_never_read(
    root: tuple[Path, RuntimeMemo], executable: Path, tmp_path: Path, kind: str
) -> None:
    path, memo = root
    measure(executable, memo)
    good = (path / MEMO_NAME).read_bytes()
    (path / MEMO_NAME).unlink()
    if kind == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_bytes(good)  # a valid memo, but reached through a link
        (path / MEMO_NAME).symlink_to(target)
    elif kind == "directory":
        (path / MEMO_NAME).mkdir()
    else:
        os.mkfifo(path / MEMO_NAME)  # would block a plain open; O_NONBLOCK and fstat refuse it
    _, hashed = measure(executable, memo)
    assert hashed > 0


def test_the_memo_keeps_the_newest_entries(root: tuple[Path, RuntimeMemo]) -> None:
    path, memo = root
    for number in range(MAX_ENTRIES + 4):
        memo.keep(MemoEntry(f"{number:064x}", "c" * 64, number, 1, 2))
    kept = _entries(path / MEMO_NAME)
    assert len(kept) == MAX_ENTRIES
    assert kept[0].files == MAX_ENTRIES + 3 and kept[-1].files == 4
    assert memo.find(f"{MAX_ENTRIES + 3:064x}") == kept[0]
    assert memo.find(f"{0:064x}") is None
    assert [p.name for p in path.iterdir()] == [MEMO_NAME]  # no temporary file left


def _entries(path: Path) -> list[MemoEntry]:
    document = json.loads(path.read_bytes())
    assert document["schema"] == MEMO_SCHEMA
    return [MemoEntry(**item) for item in document["entries"]]
