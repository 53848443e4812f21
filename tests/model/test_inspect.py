"""Whole-model inspection: one hashing pass, every static identity input."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.snapshot_manifest import snapshot_content_sha256
from kiln_registry.model.inspect import inspect_model
from kiln_registry.model.tokenizer import tokenizer_digests
from tests.model.builders import write_adapter, write_model

GOLDEN_WEIGHT_V1 = "aa7e9961df654af2a7405c5d2c07eb5a72b58f86060035c245c3415793c459c1"


def tree_bytes(*roots: Path) -> int:
    return sum(p.stat().st_size for root in roots for p in root.rglob("*") if p.is_file())


def test_golden_model_and_single_read_of_every_file(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", shards={"model.safetensors": b"weight-v1"})
    limiter = ReadRateLimiter(None)
    result = inspect_model(root, limiter=limiter, use_transformers=False)
    assert result.base_model_sha256 == GOLDEN_WEIGHT_V1
    [shard] = result.shards
    assert (shard.path, shard.bytes) == ("model.safetensors", 9)
    assert shard.sha256 == hashlib.sha256(b"weight-v1").hexdigest()
    config = (root / "config.json").read_bytes()
    assert result.model_config_sha256 == hashlib.sha256(config).hexdigest()
    assert result.vocab_size == 128
    expected = tokenizer_digests(root, 128, use_transformers=False)
    assert (result.tokenizer_vocab_sha256, result.tokenizer_config_sha256) == (
        expected.vocab_sha256,
        expected.config_sha256,
    )
    assert result.tokenizer_entries == expected.entries
    assert result.snapshot_content_sha256 == snapshot_content_sha256(result.snapshot_manifest)
    assert result.adapter is None
    assert result.files_hashed == 4
    # Every file once, then config.json and tokenizer.json parsed once more;
    # the shard is never read twice.
    tokenizer = (root / "tokenizer.json").stat().st_size
    assert limiter.total_bytes == tree_bytes(root) + len(config) + tokenizer
    assert b'"path":"model/model.safetensors","bytes":9' in result.snapshot_manifest


@pytest.mark.parametrize("workers", [1, 3])
def test_result_does_not_depend_on_workers_or_location(tmp_path: Path, workers: int) -> None:
    shards = {f"model-{i}.safetensors": os.urandom(3000 + i) for i in range(3)}
    root = write_model(tmp_path / "m", shards=shards)
    first = inspect_model(
        root, limiter=ReadRateLimiter(None), workers=workers, use_transformers=False
    )
    os.rename(root, tmp_path / "moved")
    again = inspect_model(tmp_path / "moved", limiter=ReadRateLimiter(None), use_transformers=False)
    assert again == first
    assert [s.path for s in first.shards] == sorted(shards)


def test_a_non_shard_change_moves_only_the_snapshot(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    before = inspect_model(root, limiter=ReadRateLimiter(None), use_transformers=False)
    (root / "README.md").write_text("notes")
    after = inspect_model(root, limiter=ReadRateLimiter(None), use_transformers=False)
    assert after.base_model_sha256 == before.base_model_sha256
    assert after.snapshot_content_sha256 != before.snapshot_content_sha256


def test_adapter_is_hashed_in_the_same_pass(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    adapter = write_adapter(tmp_path / "my-lora", data=b"lora-bytes")
    limiter = ReadRateLimiter(None)
    result = inspect_model(root, adapter, limiter=limiter, use_transformers=False)
    assert result.adapter is not None
    assert result.adapter.name == "my-lora"
    assert result.adapter.rank_cap == 8
    assert result.adapter.filename == "adapter_model.safetensors"
    assert b'"has_adapter":true' in result.snapshot_manifest
    assert b'"adapter/adapter_model.safetensors"' in result.snapshot_manifest
    config = (adapter / "adapter_config.json").stat().st_size
    reread = (
        config + (root / "config.json").stat().st_size + (root / "tokenizer.json").stat().st_size
    )
    assert limiter.total_bytes == tree_bytes(root, adapter) + reread
    assert result.to_json()["adapter"] == {
        "name": "my-lora",
        "filename": "adapter_model.safetensors",
        "weights_sha256": result.adapter.weights_sha256,
        "config_sha256": result.adapter.config_sha256,
        "rank_cap": 8,
    }


class GrowingTreeLimiter(ReadRateLimiter):
    """Adds a file to the model tree while it is being hashed.

    The change has to land between the two inventories; doing it from the
    read path is the only deterministic way to place it there.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(None)
        self.root = root

    def acquire(self, nbytes: int) -> None:
        super().acquire(nbytes)
        (self.root / "late.txt").write_text("late")


def test_tree_change_during_hashing_is_refused(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    with pytest.raises(IdentityError) as err:
        inspect_model(root, limiter=GrowingTreeLimiter(root), workers=1, use_transformers=False)
    assert err.value.rule == "snapshot.changed"


def test_fifo_in_the_model_tree_is_refused(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    os.mkfifo(root / "pipe")
    with pytest.raises(IdentityError) as err:
        inspect_model(root, limiter=ReadRateLimiter(None), use_transformers=False)
    assert err.value.rule == "tree.special_file"


@pytest.mark.slow  # imports torch and transformers (about 5 s)
def test_real_tiny_llama_with_adapter_and_transformers(tmp_path: Path) -> None:
    from kiln_registry.testing.tiny_models import build_peft_adapter, build_tiny_llama

    model = build_tiny_llama(tmp_path / "llama", shards=2, model_width=640)
    build_peft_adapter(tmp_path / "lora", base=model, r=16)
    result = inspect_model(model.path, tmp_path / "lora", limiter=ReadRateLimiter(None))
    assert len(result.shards) == 2
    assert result.vocab_size == 640
    assert result.tokenizer_entries == model.tokenizer_entries
    assert result.adapter is not None and result.adapter.rank_cap == 16
    again = inspect_model(model.path, tmp_path / "lora", limiter=ReadRateLimiter(None), workers=1)
    assert again == result
