"""Kiln's safetensors shard selection and the model width (docs/identity.md section 2).

Owns ``select_shards`` (which files of a model tree enter
``base_model_sha256``) and ``model_width`` (``vocab_size`` from config.json).
Selection: the distinct files named by ``model.safetensors.index.json``'s
``weight_map`` (safe relative paths, may be nested; the index itself is not
hashed); else ``model.safetensors``; else every top-level ``*.safetensors``.
``.bin`` files never count.  Each shard must be a non-empty regular file
with its own inode; ``config.json`` and ``tokenizer.json`` must exist.

Imports: standard library, ``kiln_registry.identity``, ``kiln_registry.domain`` (errors, limits)
and ``kiln_registry.model``; never torch or transformers.
"""

from __future__ import annotations

from collections.abc import Mapping

from kiln_registry.domain.errors import IdentityError
from kiln_registry.domain.limits import MAX_VOCAB_SIZE as MAX_VOCAB_SIZE
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.tree import TreeFile, TreeInventory
from kiln_registry.model.files import read_json_object

INDEX_NAME = "model.safetensors.index.json"
SINGLE_SHARD = "model.safetensors"
REQUIRED_FILES = ("config.json", "tokenizer.json")
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_WEIGHT_MAP_ENTRIES = 1_000_000


def _safe_relative(name: object, index_path: str) -> str:
    if not isinstance(name, str) or not name:
        raise IdentityError(
            f"{index_path}: weight_map value {name!r} is not a file name", rule="shards.index_path"
        )
    parts = name.split("/")
    if (
        name.startswith("/")
        or "\\" in name
        or any(p in ("", ".", "..") for p in parts)
        or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name)
    ):
        raise IdentityError(
            f"{index_path}: weight_map names {name!r}, which is not a safe relative path",
            rule="shards.index_path",
        )
    if not name.endswith(".safetensors"):
        raise IdentityError(
            f"{index_path}: weight_map names {name!r}; only .safetensors shards count",
            rule="shards.index_not_safetensors",
        )
    return name


def _index_shards(tree: TreeInventory, limiter: ReadRateLimiter | None) -> list[str]:
    path = tree.path_of(TreeFile(INDEX_NAME, 0, 0, 0, 0))
    _, index = read_json_object(
        path, rule="shards.index", max_bytes=MAX_INDEX_BYTES, limiter=limiter
    )
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise IdentityError(
            f"{path}: weight_map must be a non-empty object", rule="shards.index_weight_map"
        )
    if len(weight_map) > MAX_WEIGHT_MAP_ENTRIES:
        raise IdentityError(
            f"{path}: weight_map has more than {MAX_WEIGHT_MAP_ENTRIES} tensors",
            rule="shards.index_weight_map",
        )
    return sorted({_safe_relative(v, path) for v in weight_map.values()})


def _candidates(tree: TreeInventory, limiter: ReadRateLimiter | None) -> list[str]:
    names = {f.relpath for f in tree.files}
    if INDEX_NAME in names:
        return _index_shards(tree, limiter)
    if SINGLE_SHARD in names:
        return [SINGLE_SHARD]
    top = sorted(n for n in names if "/" not in n and n.endswith(".safetensors"))
    if not top:
        bins = any(n.endswith(".bin") for n in names)
        raise IdentityError(
            f"{tree.root} has no safetensors shard"
            + (" (only .bin weights, which never count)" if bins else ""),
            rule="base_model.no_shards",
            hint="convert the weights to safetensors; Kiln hashes only .safetensors shards",
        )
    return top


def select_shards(tree: TreeInventory, *, limiter: ReadRateLimiter | None = None) -> list[TreeFile]:
    """The shard files of ``tree`` (sorted by path), validated per section 2."""
    by_path = {f.relpath: f for f in tree.files}
    for required in REQUIRED_FILES:
        if required not in by_path:
            raise IdentityError(
                f"{tree.root} has no {required}",
                rule=f"model.{required.removesuffix('.json')}_missing",
            )
    shards: list[TreeFile] = []
    inodes: dict[tuple[int, int], str] = {}
    for name in _candidates(tree, limiter):
        entry = by_path.get(name)
        if entry is None:
            raise IdentityError(
                f"shard {name} named by {INDEX_NAME} does not exist in {tree.root}",
                rule="shards.missing",
            )
        if entry.size == 0:
            raise IdentityError(f"shard {tree.path_of(entry)} is empty", rule="shards.empty")
        other = inodes.setdefault((entry.dev, entry.ino), name)
        if other != name:
            raise IdentityError(
                f"shards {name} and {other} in {tree.root} are two paths to one file",
                rule="shards.same_inode",
            )
        shards.append(entry)
    return shards


def _width_value(value: object, field: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VOCAB_SIZE:
        raise IdentityError(
            f"{source}: {field} must be an integer in 1..={MAX_VOCAB_SIZE}, got {value!r}",
            rule="model.vocab_size",
        )
    return value


def model_width(config: Mapping[str, object], *, source: str = "config.json") -> int:
    """``vocab_size`` / ``text_config.vocab_size`` (equal when both are present)."""
    found: list[tuple[str, int]] = []
    if config.get("vocab_size") is not None:
        found.append(("vocab_size", _width_value(config["vocab_size"], "vocab_size", source)))
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping) and text_config.get("vocab_size") is not None:
        value = _width_value(text_config["vocab_size"], "text_config.vocab_size", source)
        found.append(("text_config.vocab_size", value))
    if not found:
        raise IdentityError(
            f"{source} declares neither vocab_size nor text_config.vocab_size",
            rule="model.vocab_size_missing",
        )
    if len({v for _, v in found}) != 1:
        shown = ", ".join(f"{k}={v}" for k, v in found)
        raise IdentityError(
            f"{source}: vocabulary sizes disagree ({shown})", rule="model.vocab_size_mismatch"
        )
    return found[0][1]
