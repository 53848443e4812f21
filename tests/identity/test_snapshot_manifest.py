"""Section 5 snapshot manifest bytes: golden, ordering, validation, real trees."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.hashing import ReadRateLimiter, hash_files
from kiln_registry.identity.snapshot_manifest import (
    SNAPSHOT_SCHEMA,
    ManifestFile,
    build_snapshot_manifest,
    snapshot_content_sha256,
    snapshot_manifest_bytes,
)
from kiln_registry.identity.tree import inventory_tree

A, B, C = "a" * 64, "b" * 64, "c" * 64
GOLDEN = (
    '{"schema":"kiln.vllm-teacher-snapshot.v1","has_adapter":true,'
    '"directories":["adapter","model","model/Z","model/empty","model/é"],'
    '"files":[{"path":"adapter/adapter_config.json","bytes":2,"sha256":"' + B + '"},'
    '{"path":"model/config.json","bytes":16,"sha256":"' + A + '"},'
    '{"path":"model/é/x","bytes":0,"sha256":"' + C + '"}]}'
).encode("utf-8")
GOLDEN_SHA256 = "f28dc59126cc796d848a217a9c7bf00e300cfc443d774208339e20e6f455c461"
FILES = [
    ManifestFile("model/é/x", 0, C),
    ManifestFile("model/config.json", 16, A),
    ManifestFile("adapter/adapter_config.json", 2, B),
]
DIRS = ["model/é", "model", "model/empty", "adapter", "model/Z"]


def test_golden_bytes_and_digest() -> None:
    data = snapshot_manifest_bytes(has_adapter=True, directories=DIRS, files=FILES)
    assert data == GOLDEN
    assert snapshot_content_sha256(data) == GOLDEN_SHA256 == hashlib.sha256(GOLDEN).hexdigest()
    assert SNAPSHOT_SCHEMA == "kiln.vllm-teacher-snapshot.v1"


def test_input_order_never_matters() -> None:
    again = snapshot_manifest_bytes(
        has_adapter=True, directories=reversed(DIRS), files=reversed(FILES)
    )
    assert again == GOLDEN


def test_sorting_is_by_utf8_bytes() -> None:
    data = snapshot_manifest_bytes(
        has_adapter=False,
        directories=["model", "model/a/b", "model/a", "model/a-b"],
        files=[],
    )
    assert b'"directories":["model","model/a","model/a-b","model/a/b"]' in data


def test_model_only_manifest() -> None:
    data = snapshot_manifest_bytes(
        has_adapter=False, directories=["model"], files=[ManifestFile("model/w", 1, A)]
    )
    assert data.startswith(b'{"schema":"kiln.vllm-teacher-snapshot.v1","has_adapter":false,')


@pytest.mark.parametrize(
    ("has_adapter", "dirs", "files", "rule"),
    [
        (False, [], [], "snapshot.roots"),
        (True, ["model"], [], "snapshot.roots"),
        (False, ["model", "adapter"], [], "snapshot.path"),
        (False, ["model"], [ManifestFile("adapter/x", 1, A)], "snapshot.path"),
        (False, ["model"], [ManifestFile("model", 1, A)], "snapshot.path"),
        (False, ["model"], [ManifestFile("model/../x", 1, A)], "snapshot.path"),
        (False, ["model"], [ManifestFile("model//x", 1, A)], "snapshot.path"),
        (False, ["model"], [ManifestFile("model/a\nb", 1, A)], "snapshot.path"),
        (False, ["model"], [ManifestFile("model/\udcff", 1, A)], "snapshot.path"),
        (False, ["model"], [ManifestFile("model/x", -1, A)], "snapshot.file_bytes"),
        (False, ["model"], [ManifestFile("model/x", True, A)], "snapshot.file_bytes"),
        (False, ["model"], [ManifestFile("model/x", 1, A.upper())], "snapshot.file_sha256"),
        (False, ["model"], [ManifestFile("model/x", 1, "a" * 63)], "snapshot.file_sha256"),
        (False, ["model", "model"], [], "snapshot.duplicate"),
        (
            False,
            ["model"],
            [ManifestFile("model/x", 1, A), ManifestFile("model/x", 2, B)],
            "snapshot.duplicate",
        ),
    ],
)
def test_invalid_input_is_refused(
    has_adapter: bool, dirs: list[str], files: list[ManifestFile], rule: str
) -> None:
    with pytest.raises(IdentityError) as err:
        snapshot_manifest_bytes(has_adapter=has_adapter, directories=dirs, files=files)
    assert err.value.rule == rule


def write_tree(root: Path) -> Path:
    (root / "empty").mkdir(parents=True)
    (root / "sub").mkdir()
    (root / "config.json").write_bytes(b'{"vocab_size":8}')
    (root / "sub" / "w.safetensors").write_bytes(b"weights")
    return root


def test_build_from_real_trees(tmp_path: Path) -> None:
    model = inventory_tree(write_tree(tmp_path / "m"))
    (tmp_path / "ad").mkdir()
    (tmp_path / "ad" / "adapter_config.json").write_bytes(b"{}")
    adapter = inventory_tree(tmp_path / "ad")
    limiter = ReadRateLimiter(None)
    model_records = hash_files([model.path_of(f) for f in model.files], limiter=limiter)
    adapter_records = hash_files([adapter.path_of(f) for f in adapter.files], limiter=limiter)
    data = build_snapshot_manifest(model, model_records, adapter, adapter_records)

    def sha(b: bytes) -> str:
        return hashlib.sha256(b).hexdigest()

    config = sha(b'{"vocab_size":8}')
    expected = (
        '{"schema":"kiln.vllm-teacher-snapshot.v1","has_adapter":true,'
        '"directories":["adapter","model","model/empty","model/sub"],"files":['
        f'{{"path":"adapter/adapter_config.json","bytes":2,"sha256":"{sha(b"{}")}"}},'
        f'{{"path":"model/config.json","bytes":16,"sha256":"{config}"}},'
        f'{{"path":"model/sub/w.safetensors","bytes":7,"sha256":"{sha(b"weights")}"}}]}}'
    ).encode()
    assert data == expected
    assert build_snapshot_manifest(model, model_records).startswith(
        b'{"schema":"kiln.vllm-teacher-snapshot.v1","has_adapter":false,'
        b'"directories":["model","model/empty","model/sub"]'
    )


def test_moving_the_tree_keeps_the_digest_and_one_byte_changes_it(tmp_path: Path) -> None:
    def digest(root: Path) -> str:
        tree = inventory_tree(root)
        records = hash_files([tree.path_of(f) for f in tree.files], limiter=ReadRateLimiter(None))
        return snapshot_content_sha256(build_snapshot_manifest(tree, records))

    before = digest(write_tree(tmp_path / "m"))
    os.rename(tmp_path / "m", tmp_path / "elsewhere")
    assert digest(tmp_path / "elsewhere") == before
    (tmp_path / "elsewhere" / "sub" / "w.safetensors").write_bytes(b"weightS")
    assert digest(tmp_path / "elsewhere") != before
