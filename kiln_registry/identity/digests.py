"""Domain-separated digests of docs/identity.md sections 2, 3, 4 and 8.

Pure functions over already-measured records (raw 32-byte digests, lengths,
labels).  Reading files is the job of ``identity.hashing`` and
``kiln_registry.model``; this module never touches the file system.
Imports: standard library only.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError

BASE_MODEL_DOMAIN = b"kiln.base-model-content.v1\x00"
TOKENIZER_VOCAB_DOMAIN = b"kiln.tokenizer-vocab.v1\x00"
ADAPTER_WEIGHTS_DOMAIN = b"kiln.adapter-weights.v1\x00"
RUNTIME_CONTENT_SCHEMA = b"kiln.python-runtime-content.v1"
RUNTIME_CONTENT_DOMAIN = RUNTIME_CONTENT_SCHEMA + b"\x00"

ADAPTER_RANK_CAPS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_TOKEN_ID = 0xFFFFFFFF
MAX_RUNTIME_LABEL_BYTES = 4096


def u32le(value: int) -> bytes:
    return struct.pack("<I", value)


def u64le(value: int) -> bytes:
    return struct.pack("<Q", value)


def lp(data: bytes) -> bytes:
    """Length-prefixed bytes: ``u64le(len(data)) || data``."""
    return u64le(len(data)) + data


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A hashed file: its raw SHA-256 digest and its byte length."""

    digest: bytes
    length: int

    def __post_init__(self) -> None:
        if len(self.digest) != 32:
            raise ValueError("FileRecord.digest must be a raw 32-byte SHA-256")
        if self.length < 0:
            raise ValueError("FileRecord.length must not be negative")


def base_model_sha256(shards: Iterable[FileRecord]) -> str:
    """Kiln's base-model content digest over safetensors shard records.

    Records are sorted by (digest, length); names, paths and times never enter.
    """
    records = sorted(shards, key=lambda r: (r.digest, r.length))
    if not records:
        raise IdentityError("no safetensors shard to hash", rule="base_model.no_shards")
    h = hashlib.sha256(BASE_MODEL_DOMAIN)
    h.update(u64le(len(records)))
    for record in records:
        h.update(u64le(record.length))
        h.update(record.digest)
    return h.hexdigest()


def tokenizer_vocab_sha256(
    vocab: Mapping[str, int],
    *,
    vocab_size_with_added: int,
    model_width: int,
) -> str:
    """Digest of the complete ``get_vocab()`` map, checked against the model width.

    ``vocab_size_with_added`` is ``get_vocab_size(with_added_tokens=True)``;
    ``model_width`` is the vocabulary width from config.json.
    """
    pairs: list[tuple[int, bytes]] = []
    for token, token_id in vocab.items():
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise IdentityError(
                f"token {token!r} has a non-integer id {token_id!r}",
                rule="tokenizer_vocab.id_type",
            )
        if not 0 <= token_id <= MAX_TOKEN_ID:
            raise IdentityError(
                f"token {token!r} has id {token_id} outside 0..=0xFFFFFFFF",
                rule="tokenizer_vocab.id_range",
            )
        if token_id >= model_width:
            raise IdentityError(
                f"token {token!r} has id {token_id}, beyond the model width {model_width}",
                rule="tokenizer_vocab.id_beyond_width",
                hint="the tokenizer and config.json vocab_size belong to different models",
            )
        try:
            token_bytes = token.encode("utf-8")
        except UnicodeEncodeError:
            raise IdentityError(
                f"token with id {token_id} is not valid UTF-8",
                rule="tokenizer_vocab.token_utf8",
            ) from None
        pairs.append((token_id, token_bytes))
    if len(pairs) != vocab_size_with_added:
        raise IdentityError(
            f"get_vocab() has {len(pairs)} entries but get_vocab_size(with_added_tokens=True)"
            f" is {vocab_size_with_added}",
            rule="tokenizer_vocab.count_mismatch",
        )
    if len(pairs) > model_width:
        raise IdentityError(
            f"tokenizer has {len(pairs)} entries, more than the model width {model_width}",
            rule="tokenizer_vocab.count_beyond_width",
        )
    pairs.sort()
    h = hashlib.sha256(TOKENIZER_VOCAB_DOMAIN)
    h.update(u64le(len(pairs)))
    for token_id, token_bytes in pairs:
        h.update(u32le(token_id))
        h.update(lp(token_bytes))
    return h.hexdigest()


def tokenizer_config_sha256(backend_json: str) -> str:
    """Digest of the exact fast-tokenizer backend JSON (``to_str()``)."""
    return sha256_hex(backend_json.encode("utf-8"))


def adapter_weights_sha256(filename: str, record: FileRecord) -> str:
    if filename not in ("adapter_model.safetensors", "adapter_model.bin"):
        raise IdentityError(
            f"adapter weights file {filename!r} is not adapter_model.safetensors or .bin",
            rule="adapter.weights_name",
        )
    h = hashlib.sha256(ADAPTER_WEIGHTS_DOMAIN)
    h.update(u64le(1))
    h.update(lp(filename.encode("utf-8")))
    h.update(u64le(record.length))
    h.update(record.digest)
    return h.hexdigest()


def _positive_rank(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise IdentityError(
            f"adapter {where} must be a positive integer, got {value!r}",
            rule="adapter.rank_invalid",
        )
    return value


def adapter_rank_cap(adapter_config: Mapping[str, object]) -> int:
    """Smallest supported vLLM rank cap >= ``r`` and every ``rank_pattern`` value."""
    ranks = [_positive_rank(adapter_config.get("r"), "r")]
    pattern = adapter_config.get("rank_pattern")
    if pattern is not None:
        if not isinstance(pattern, Mapping):
            raise IdentityError(
                "adapter rank_pattern must be an object or null", rule="adapter.rank_pattern"
            )
        ranks.extend(_positive_rank(v, f"rank_pattern[{k!r}]") for k, v in pattern.items())
    needed = max(ranks)
    for cap in ADAPTER_RANK_CAPS:
        if cap >= needed:
            return cap
    raise IdentityError(
        f"adapter rank {needed} exceeds the largest supported cap 512",
        rule="adapter.rank_too_large",
    )


# A control character (C0 or DEL) in a runtime label; the launcher's inventory uses it too.
RUNTIME_LABEL_CONTROL = re.compile("[\x00-\x1f\x7f]")


def validate_runtime_label(label: str) -> bytes:
    data = label.encode("utf-8", errors="strict")
    if not data or len(data) > MAX_RUNTIME_LABEL_BYTES:
        raise IdentityError(
            f"runtime label of {len(data)} bytes is empty or over 4096 bytes",
            rule="runtime_content.label_length",
        )
    if RUNTIME_LABEL_CONTROL.search(label):
        raise IdentityError(
            "runtime label contains a control character", rule="runtime_content.label_control"
        )
    return data


@dataclass(frozen=True, slots=True)
class LabelledFile:
    label: str
    record: FileRecord


def runtime_content_sha256(directories: Sequence[str], files: Sequence[LabelledFile]) -> str:
    """The ``kiln.python-runtime-content.v1`` digest over labelled dirs and files."""
    dir_labels = sorted(validate_runtime_label(d) for d in directories)
    file_rows = sorted(
        (validate_runtime_label(f.label), f.record.length, f.record.digest) for f in files
    )
    h = hashlib.sha256(RUNTIME_CONTENT_DOMAIN)
    h.update(lp(RUNTIME_CONTENT_SCHEMA))
    h.update(u64le(len(dir_labels)))
    for label in dir_labels:
        h.update(lp(label))
    h.update(u64le(len(file_rows)))
    for label, length, digest in file_rows:
        h.update(lp(label))
        h.update(u64le(length))
        h.update(digest)
    return h.hexdigest()
