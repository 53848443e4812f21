"""Shard selection (docs/identity.md section 2) and the model width, on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.digests import base_model_sha256
from kiln_registry.identity.hashing import ReadRateLimiter, hash_file
from kiln_registry.identity.tree import inventory_tree
from kiln_registry.model.shards import model_width, select_shards
from tests.model.builders import write_json, write_model

GOLDEN_WEIGHT_V1 = "aa7e9961df654af2a7405c5d2c07eb5a72b58f86060035c245c3415793c459c1"


def shard_names(root: Path) -> list[str]:
    return [s.relpath for s in select_shards(inventory_tree(root))]


def refused(root: Path, rule: str) -> IdentityError:
    with pytest.raises(IdentityError) as err:
        select_shards(inventory_tree(root))
    assert err.value.rule == rule
    return err.value


def test_golden_single_shard_from_a_real_file(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", shards={"model.safetensors": b"weight-v1"})
    tree = inventory_tree(root)
    [shard] = select_shards(tree)
    record = hash_file(tree.path_of(shard), limiter=ReadRateLimiter(None))
    assert base_model_sha256([record]) == GOLDEN_WEIGHT_V1


def test_model_safetensors_wins_over_other_top_level_shards(tmp_path: Path) -> None:
    root = write_model(
        tmp_path / "m", shards={"model.safetensors": b"w", "extra.safetensors": b"x"}
    )
    assert shard_names(root) == ["model.safetensors"]


def test_top_level_safetensors_only_and_never_bin(tmp_path: Path) -> None:
    root = write_model(
        tmp_path / "m",
        shards={
            "b.safetensors": b"b",
            "a.safetensors": b"a",
            "nested/c.safetensors": b"c",
            "pytorch_model.bin": b"bin",
        },
    )
    assert shard_names(root) == ["a.safetensors", "b.safetensors"]


def test_index_names_distinct_nested_files_and_is_not_hashed(tmp_path: Path) -> None:
    root = write_model(
        tmp_path / "m",
        shards={
            "w/part-1.safetensors": b"1",
            "w/part-2.safetensors": b"2",
            "model.safetensors": b"x",
        },
    )
    write_json(
        root / "model.safetensors.index.json",
        {
            "metadata": {},
            "weight_map": {
                "a": "w/part-2.safetensors",
                "b": "w/part-1.safetensors",
                "c": "w/part-2.safetensors",
            },
        },
    )
    assert shard_names(root) == ["w/part-1.safetensors", "w/part-2.safetensors"]


@pytest.mark.parametrize(
    ("target", "rule"),
    [
        ("../outside.safetensors", "shards.index_path"),
        ("/abs.safetensors", "shards.index_path"),
        ("w//x.safetensors", "shards.index_path"),
        ("./x.safetensors", "shards.index_path"),
        ("w\\x.safetensors", "shards.index_path"),
        ("", "shards.index_path"),
        (7, "shards.index_path"),
        ("pytorch_model.bin", "shards.index_not_safetensors"),
        ("absent.safetensors", "shards.missing"),
    ],
)
def test_bad_index_entries_are_refused(tmp_path: Path, target: object, rule: str) -> None:
    root = write_model(tmp_path / "m", shards={"pytorch_model.bin": b"b"})
    write_json(root / "model.safetensors.index.json", {"weight_map": {"t": target}})
    refused(root, rule)


@pytest.mark.parametrize(
    "index",
    [
        b"[]",
        b'{"weight_map": {}}',
        b'{"weight_map": []}',
        b"{",
        b'{"weight_map": {"a": 1, "a": 2}}',
    ],
)
def test_malformed_index_is_refused(tmp_path: Path, index: bytes) -> None:
    root = write_model(tmp_path / "m")
    (root / "model.safetensors.index.json").write_bytes(index)
    with pytest.raises(IdentityError):
        select_shards(inventory_tree(root))


def test_only_bin_weights_means_no_shards(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", shards={"pytorch_model.bin": b"b"})
    err = refused(root, "base_model.no_shards")
    assert ".bin" in err.message


def test_empty_shard_is_refused(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", shards={"model.safetensors": b""})
    err = refused(root, "shards.empty")
    assert "model.safetensors" in err.message


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json"])
def test_config_and_tokenizer_must_exist(tmp_path: Path, missing: str) -> None:
    root = write_model(tmp_path / "m")
    (root / missing).unlink()
    err = refused(root, f"model.{missing.removesuffix('.json')}_missing")
    assert missing in err.message


def test_two_shard_paths_to_one_inode_are_refused(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", shards={"a.safetensors": b"a"})
    os.link(root / "a.safetensors", root / "b.safetensors")
    with pytest.raises(IdentityError) as err:
        select_shards(inventory_tree(root))
    assert err.value.rule == "tree.hardlink"


def test_symlinked_shard_is_refused(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", shards={"real.bin": b"a"})
    (root / "model.safetensors").symlink_to(root / "real.bin")
    with pytest.raises(IdentityError) as err:
        inventory_tree(root)
    assert err.value.rule == "tree.symlink"


@pytest.mark.parametrize(
    ("config", "width"),
    [
        ({"vocab_size": 32000}, 32000),
        ({"text_config": {"vocab_size": 7}}, 7),
        ({"vocab_size": 5, "text_config": {"vocab_size": 5}}, 5),
        ({"vocab_size": None, "text_config": {"vocab_size": 9}}, 9),
        ({"vocab_size": 16_777_216}, 16_777_216),
    ],
)
def test_model_width(config: dict[str, object], width: int) -> None:
    assert model_width(config) == width


@pytest.mark.parametrize(
    ("config", "rule"),
    [
        ({"vocab_size": 5, "text_config": {"vocab_size": 6}}, "model.vocab_size_mismatch"),
        ({"vocab_size": True}, "model.vocab_size"),
        ({"vocab_size": 0}, "model.vocab_size"),
        ({"vocab_size": 16_777_217}, "model.vocab_size"),
        ({"vocab_size": 5.0}, "model.vocab_size"),
        ({"vocab_size": "5"}, "model.vocab_size"),
        ({"text_config": {"vocab_size": -1}}, "model.vocab_size"),
        ({}, "model.vocab_size_missing"),
        ({"text_config": "x"}, "model.vocab_size_missing"),
    ],
)
def test_bad_model_width(config: dict[str, object], rule: str) -> None:
    with pytest.raises(IdentityError) as err:
        model_width(config, source="m/config.json")
    assert err.value.rule == rule
    assert "m/config.json" in err.value.message


def test_disagreeing_sizes_name_both_fields() -> None:
    with pytest.raises(IdentityError) as err:
        model_width(json.loads('{"vocab_size": 5, "text_config": {"vocab_size": 6}}'))
    assert "vocab_size=5" in err.value.message and "text_config.vocab_size=6" in err.value.message
