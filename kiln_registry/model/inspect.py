"""Whole-model inspection: every static identity input of a teacher.

Owns ``inspect_model``: inventory the model tree (and optional adapter
tree), hash every file of both exactly once in parallel through one shared
``ReadRateLimiter``, inventory again and require the same tree, then derive
``base_model_sha256`` (from the shard records of that single pass),
``model_config_sha256``, the tokenizer digests, the adapter digests and the
section 5 ``snapshot_content_sha256`` (the bytes the launcher writes after
staging the same trees).

Imports: standard library, ``kiln_registry.identity``, ``kiln_registry.model``
and ``kiln_registry.domain.errors``; transformers only through
``model.tokenizer.transformers_view``; never torch.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.digests import FileRecord, base_model_sha256
from kiln_registry.identity.hashing import ReadRateLimiter, hash_files
from kiln_registry.identity.snapshot_manifest import (
    build_snapshot_manifest,
    snapshot_content_sha256,
)
from kiln_registry.identity.tree import TreeInventory, inventory_tree
from kiln_registry.model.adapter import ADAPTER_CONFIG, inspect_adapter
from kiln_registry.model.files import read_json_object
from kiln_registry.model.shards import model_width, select_shards
from kiln_registry.model.tokenizer import tokenizer_digests


@dataclass(frozen=True)
class ShardDigest:
    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class AdapterIdentity:
    name: str
    filename: str
    weights_sha256: str
    config_sha256: str
    rank_cap: int


@dataclass(frozen=True)
class ModelInspection:
    base_model_sha256: str
    shards: tuple[ShardDigest, ...]
    model_config_sha256: str
    tokenizer_vocab_sha256: str
    tokenizer_config_sha256: str
    vocab_size: int
    tokenizer_entries: int
    snapshot_content_sha256: str
    snapshot_manifest: bytes
    adapter: AdapterIdentity | None
    files_hashed: int
    bytes_hashed: int

    def to_json(self) -> dict[str, object]:
        """Stable, JSON-ready form (the manifest bytes are left out)."""
        adapter = None
        if self.adapter is not None:
            adapter = {
                "name": self.adapter.name,
                "filename": self.adapter.filename,
                "weights_sha256": self.adapter.weights_sha256,
                "config_sha256": self.adapter.config_sha256,
                "rank_cap": self.adapter.rank_cap,
            }
        return {
            "base_model_sha256": self.base_model_sha256,
            "model_config_sha256": self.model_config_sha256,
            "tokenizer_vocab_sha256": self.tokenizer_vocab_sha256,
            "tokenizer_config_sha256": self.tokenizer_config_sha256,
            "vocab_size": self.vocab_size,
            "tokenizer_entries": self.tokenizer_entries,
            "snapshot_content_sha256": self.snapshot_content_sha256,
            "adapter": adapter,
            "shards": [{"path": s.path, "bytes": s.bytes, "sha256": s.sha256} for s in self.shards],
            "files_hashed": self.files_hashed,
            "bytes_hashed": self.bytes_hashed,
        }


@dataclass(frozen=True)
class HashedTrees:
    """One pass over the model tree and optional adapter tree."""

    model: TreeInventory
    model_records: tuple[FileRecord, ...]
    adapter: TreeInventory | None
    adapter_records: tuple[FileRecord, ...]

    def model_records_by_path(self) -> dict[str, FileRecord]:
        return {f.relpath: r for f, r in zip(self.model.files, self.model_records, strict=True)}

    @property
    def manifest(self) -> bytes:
        return build_snapshot_manifest(
            self.model, self.model_records, self.adapter, self.adapter_records
        )


def hash_trees(
    model_dir: str | os.PathLike[str],
    adapter_dir: str | os.PathLike[str] | None,
    *,
    limiter: ReadRateLimiter,
    workers: int | None = None,
) -> HashedTrees:
    """Inventory, hash every file once, and prove the trees did not change meanwhile."""
    trees = [inventory_tree(model_dir)]
    if adapter_dir is not None:
        trees.append(inventory_tree(adapter_dir))
    files = [(t, f) for t in trees for f in t.files]
    records = hash_files(
        [t.path_of(f) for t, f in files],
        limiter=limiter,
        workers=workers,
        expected_lengths=[f.size for _, f in files],
    )
    for before in trees:
        if inventory_tree(before.root) != before:
            raise IdentityError(
                f"{before.root} changed while it was hashed", rule="snapshot.changed"
            )
    split = len(trees[0].files)
    return HashedTrees(
        model=trees[0],
        model_records=tuple(records[:split]),
        adapter=trees[1] if adapter_dir is not None else None,
        adapter_records=tuple(records[split:]),
    )


def _adapter_identity(hashed: HashedTrees, limiter: ReadRateLimiter) -> AdapterIdentity | None:
    tree = hashed.adapter
    if tree is None:
        return None
    weights = {f.relpath: r for f, r in zip(tree.files, hashed.adapter_records, strict=True)}
    found = inspect_adapter(
        tree.root,
        limiter=limiter,
        weights_record=weights.get("adapter_model.safetensors") or weights.get("adapter_model.bin"),
        config_record=weights.get(ADAPTER_CONFIG),
    )
    return AdapterIdentity(
        name=os.path.basename(tree.root),
        filename=found.filename,
        weights_sha256=found.weights_sha256,
        config_sha256=found.config_sha256,
        rank_cap=found.rank_cap,
    )


def inspect_model(
    model_dir: str | os.PathLike[str],
    adapter_dir: str | os.PathLike[str] | None = None,
    *,
    limiter: ReadRateLimiter,
    workers: int | None = None,
    use_transformers: bool = True,
) -> ModelInspection:
    """Every static identity input of a model directory and optional adapter."""
    hashed = hash_trees(model_dir, adapter_dir, limiter=limiter, workers=workers)
    model = hashed.model
    shards = select_shards(model, limiter=limiter)
    by_path = hashed.model_records_by_path()
    shard_records = [by_path[s.relpath] for s in shards]
    config_path = os.path.join(model.root, "config.json")
    raw, config = read_json_object(config_path, rule="model.config", limiter=limiter)
    config_record = by_path["config.json"]
    if hashlib.sha256(raw).digest() != config_record.digest:
        raise IdentityError(f"{config_path} changed after it was hashed", rule="snapshot.changed")
    width = model_width(config, source=config_path)
    tokenizer = tokenizer_digests(
        model.root, width, use_transformers=use_transformers, limiter=limiter
    )
    manifest = hashed.manifest
    all_records = hashed.model_records + hashed.adapter_records
    return ModelInspection(
        base_model_sha256=base_model_sha256(shard_records),
        shards=tuple(
            ShardDigest(s.relpath, r.length, r.digest.hex())
            for s, r in zip(shards, shard_records, strict=True)
        ),
        model_config_sha256=config_record.digest.hex(),
        tokenizer_vocab_sha256=tokenizer.vocab_sha256,
        tokenizer_config_sha256=tokenizer.config_sha256,
        vocab_size=width,
        tokenizer_entries=tokenizer.entries,
        snapshot_content_sha256=snapshot_content_sha256(manifest),
        snapshot_manifest=manifest,
        adapter=_adapter_identity(hashed, limiter),
        files_hashed=len(all_records),
        bytes_hashed=sum(r.length for r in all_records),
    )
