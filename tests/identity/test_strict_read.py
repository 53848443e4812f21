"""identity.strict_read: the one bounded regular-file reader and the one strict JSON loader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.identity.strict_read import (
    DuplicateKeyError,
    FileProblem,
    loads_strict,
    read_regular_file,
)


def _refuse(problem: FileProblem) -> KilnError:
    return InputError(f"{problem.kind.value}:{problem.size}", rule=f"t.{problem.kind.value}")


def _kind(path: Path, limit: int = 16, **kwargs: object) -> str:
    with pytest.raises(InputError) as info:
        read_regular_file(path, limit=limit, refuse=_refuse, **kwargs)  # type: ignore[arg-type]
    assert info.value.rule is not None
    return info.value.rule.removeprefix("t.")


def test_reads_a_file_at_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 16)
    data, info = read_regular_file(path, limit=16, refuse=_refuse)
    assert data == b"x" * 16 and info.st_size == 16


def test_refusals(tmp_path: Path) -> None:
    assert _kind(tmp_path / "absent") == "missing"
    assert _kind(tmp_path) == "not_regular"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _kind(fifo) == "not_regular"  # refused without blocking on the open
    target = tmp_path / "target"
    target.write_bytes(b"{}")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert _kind(link) == "symlink"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert _kind(dangling) == "symlink"
    data, _ = read_regular_file(link, limit=16, refuse=_refuse, follow_symlinks=True)
    assert data == b"{}"


def test_too_large_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "huge"
    with path.open("wb") as handle:
        handle.truncate(8 * 1024**3)  # sparse: 8 GiB that must never be read
    with pytest.raises(InputError) as info:
        read_regular_file(path, limit=16, refuse=_refuse)
    assert info.value.rule == "t.too_large" and str(8 * 1024**3) in str(info.value)


def test_check_sees_the_open_file_before_any_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    seen: list[int] = []

    def check(info: os.stat_result) -> None:
        seen.append(info.st_size)
        raise InputError("refused by the caller", rule="t.caller")

    with pytest.raises(InputError, match="refused by the caller"):
        read_regular_file(path, limit=16, refuse=_refuse, check=check)
    assert seen == [3]


def test_loads_strict_refuses_duplicates_at_every_level() -> None:
    assert loads_strict(b'{"a": {"b": 1}, "c": [1.5]}') == {"a": {"b": 1}, "c": [1.5]}
    with pytest.raises(DuplicateKeyError) as info:
        loads_strict('{"a": [{"k": 1, "k": 2}]}')
    assert info.value.key == "k" and str(info.value) == "duplicate key 'k'"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("text", [b"NaN", b"[Infinity]", b'{"x": -Infinity}'])
def test_loads_strict_refuses_non_json_constants(text: bytes) -> None:
    with pytest.raises(ValueError, match="is not JSON"):
        loads_strict(text)


def test_loads_strict_refuses_bad_utf8_and_bad_json() -> None:
    with pytest.raises(UnicodeDecodeError):
        loads_strict(b'{"a": "\xff"}')
    with pytest.raises(ValueError):
        loads_strict(b"{")
