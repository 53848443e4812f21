"""Static adapter inspection (docs/identity.md section 4) on real directories."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.digests import FileRecord
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.model.adapter import inspect_adapter
from tests.model.builders import write_adapter, write_json


def refused(root: Path, rule: str) -> IdentityError:
    with pytest.raises(IdentityError) as err:
        inspect_adapter(root, limiter=ReadRateLimiter(None))
    assert err.value.rule == rule
    return err.value


def weights_digest(filename: str, data: bytes) -> str:
    """Section 4 written out independently of kiln_registry.identity.digests."""
    name = filename.encode()
    h = hashlib.sha256(b"kiln.adapter-weights.v1\x00")
    h.update(struct.pack("<Q", 1) + struct.pack("<Q", len(name)) + name)
    h.update(struct.pack("<Q", len(data)) + hashlib.sha256(data).digest())
    return h.hexdigest()


@pytest.mark.parametrize("weights", ["adapter_model.safetensors", "adapter_model.bin"])
def test_adapter_digests(tmp_path: Path, weights: str) -> None:
    root = write_adapter(tmp_path / "ad", weights=weights, data=b"lora-weights")
    result = inspect_adapter(root, limiter=ReadRateLimiter(None))
    assert result.filename == weights
    assert result.weights_bytes == len(b"lora-weights")
    assert result.weights_sha256 == weights_digest(weights, b"lora-weights")
    raw = (root / "adapter_config.json").read_bytes()
    assert result.config_sha256 == hashlib.sha256(raw).hexdigest()
    assert result.rank_cap == 8


def test_rank_pattern_raises_the_cap(tmp_path: Path) -> None:
    root = write_adapter(tmp_path / "ad")
    write_json(root / "adapter_config.json", {"r": 8, "rank_pattern": {"q_proj": 20}})
    assert inspect_adapter(root, limiter=ReadRateLimiter(None)).rank_cap == 32


def test_rank_above_512_is_refused(tmp_path: Path) -> None:
    refused(write_adapter(tmp_path / "ad", r=513), "adapter.rank_too_large")


def test_precomputed_records_are_used_and_checked(tmp_path: Path) -> None:
    root = write_adapter(tmp_path / "ad", data=b"abcd")
    record = FileRecord(hashlib.sha256(b"abcd").digest(), 4)
    limiter = ReadRateLimiter(None)
    config = (root / "adapter_config.json").read_bytes()
    config_record = FileRecord(hashlib.sha256(config).digest(), len(config))
    result = inspect_adapter(
        root, limiter=limiter, weights_record=record, config_record=config_record
    )
    assert result.weights_sha256 == weights_digest("adapter_model.safetensors", b"abcd")
    assert limiter.total_bytes == len(config)  # the weights were not read again
    stale = FileRecord(hashlib.sha256(b"old").digest(), 3)
    with pytest.raises(IdentityError) as err:
        inspect_adapter(root, limiter=limiter, config_record=stale)
    assert err.value.rule == "adapter.changed"


def test_both_weight_files_are_refused(tmp_path: Path) -> None:
    root = write_adapter(tmp_path / "ad")
    (root / "adapter_model.bin").write_bytes(b"x")
    refused(root, "adapter.weights_ambiguous")


def test_missing_weights_are_refused(tmp_path: Path) -> None:
    root = write_adapter(tmp_path / "ad")
    (root / "adapter_model.safetensors").unlink()
    refused(root, "adapter.weights_missing")


def test_empty_weights_are_refused(tmp_path: Path) -> None:
    refused(write_adapter(tmp_path / "ad", data=b""), "adapter.weights_empty")


def test_symlinked_weights_are_refused(tmp_path: Path) -> None:
    root = write_adapter(tmp_path / "ad")
    (root / "adapter_model.safetensors").rename(tmp_path / "real")
    (root / "adapter_model.safetensors").symlink_to(tmp_path / "real")
    err = refused(root, "adapter.weights_symlink")
    assert "adapter_model.safetensors" in err.message


def test_weights_that_are_a_directory_are_refused(tmp_path: Path) -> None:
    root = write_adapter(tmp_path / "ad", weights="adapter_model.bin")
    (root / "adapter_model.bin").unlink()
    (root / "adapter_model.bin").mkdir()
    refused(root, "adapter.weights_not_regular")


@pytest.mark.parametrize(
    ("config", "rule"),
    [
        (b"[]", "adapter.config.not_object"),
        (b'{"r": 8, "r": 16}', "json.duplicate_key"),
        (b'{"r": NaN}', "json.non_finite"),
        (b"{", "json.syntax"),
        (b'{"r": 0}', "adapter.rank_invalid"),
        (b'{"r": true}', "adapter.rank_invalid"),
        (b'{"r": 8, "rank_pattern": [1]}', "adapter.rank_pattern"),
    ],
)
def test_bad_adapter_config_is_refused(tmp_path: Path, config: bytes, rule: str) -> None:
    root = write_adapter(tmp_path / "ad")
    (root / "adapter_config.json").write_bytes(config)
    refused(root, rule)


def test_missing_or_symlinked_config_is_refused(tmp_path: Path) -> None:
    root = write_adapter(tmp_path / "ad")
    (root / "adapter_config.json").rename(tmp_path / "cfg.json")
    refused(root, "adapter.config.missing")
    (root / "adapter_config.json").symlink_to(tmp_path / "cfg.json")
    refused(root, "adapter.config.symlink")


def test_adapter_directory_must_be_real(tmp_path: Path) -> None:
    root = write_adapter(tmp_path / "ad")
    (tmp_path / "alias").symlink_to(root)
    refused(tmp_path / "alias", "tree.symlink")
    refused(tmp_path / "absent", "tree.root_missing")
