"""Section 9: the precomputed teacher input file, parsed and loaded from real files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.input_manifest import (
    MAX_INPUT_BYTES,
    RUNTIME_VERSION_KEYS,
    load_teacher_input,
    parse_teacher_input,
)

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "teacher_input.json").read_text("utf-8")
)
SEED = VECTORS["valid"][0]["input"]


@pytest.mark.parametrize("case", VECTORS["valid"], ids=lambda c: c["name"])
def test_valid(case: dict[str, Any]) -> None:
    parsed = parse_teacher_input(canonical_json(case["input"]), source="input.json")
    assert tuple(parsed.runtime_versions) == RUNTIME_VERSION_KEYS
    assert parsed.accelerator.to_dict() == case["input"]["accelerator"]
    assert parsed.implementation == "vllm:" + parsed.runtime_versions["vllm"]
    assert (parsed.adapter is None) == (parsed.adapter_max_rank is None)


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=lambda c: c["name"])
def test_invalid(case: dict[str, Any]) -> None:
    with pytest.raises(IdentityError) as info:
        parse_teacher_input(canonical_json(case["input"]), source="teacher-input.json")
    assert info.value.rule == case["rule"]
    assert "teacher-input.json" in str(info.value)


def test_too_many_devices() -> None:
    device = SEED["accelerator"]["devices"][0]
    devices = [dict(device, index=i) for i in range(257)]
    data = canonical_json(dict(SEED, accelerator=dict(SEED["accelerator"], devices=devices)))
    with pytest.raises(IdentityError) as info:
        parse_teacher_input(data, source="x")
    assert info.value.rule == "input.device_count"


def test_strict_json_applies() -> None:
    data = canonical_json(SEED)[:-1] + b',"schema":"kiln.vllm-teacher-input.v2"}'
    with pytest.raises(IdentityError) as info:
        parse_teacher_input(data, source="x")
    assert info.value.rule == "json.duplicate_key"


def test_load_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_text(json.dumps(SEED, indent=2), encoding="utf-8")
    loaded = load_teacher_input(path)
    assert loaded == parse_teacher_input(canonical_json(SEED), source="x")
    assert load_teacher_input(str(path)) == loaded


def test_load_refuses_symlink(tmp_path: Path) -> None:
    target = tmp_path / "input.json"
    target.write_bytes(canonical_json(SEED))
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(IdentityError) as info:
        load_teacher_input(link)
    assert info.value.rule == "input.not_regular"
    assert str(link) in str(info.value)


def test_load_refuses_directory_and_fifo(tmp_path: Path) -> None:
    with pytest.raises(IdentityError) as info:
        load_teacher_input(tmp_path)
    assert info.value.rule == "input.not_regular"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(IdentityError) as info:
        load_teacher_input(fifo)
    assert info.value.rule == "input.not_regular"


def test_load_refuses_missing(tmp_path: Path) -> None:
    with pytest.raises(IdentityError) as info:
        load_teacher_input(tmp_path / "absent.json")
    assert info.value.rule == "input.unreadable"


def test_load_size_limit(tmp_path: Path) -> None:
    data = canonical_json(SEED)
    at_limit = tmp_path / "at.json"
    at_limit.write_bytes(data + b" " * (MAX_INPUT_BYTES - len(data)))
    assert load_teacher_input(at_limit).vocab_size == SEED["vocab_size"]
    over = tmp_path / "over.json"
    over.write_bytes(data + b" " * (MAX_INPUT_BYTES - len(data) + 1))
    with pytest.raises(IdentityError) as info:
        load_teacher_input(over)
    assert info.value.rule == "input.too_large"


def test_load_huge_sparse_file_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as handle:
        handle.truncate(8 * 1024**3)  # sparse: 8 GiB that must never be read
    with pytest.raises(IdentityError) as info:
        load_teacher_input(path)
    assert info.value.rule == "input.too_large"
